//! GGUF tensor data into [`HostData`], and the scalar decoders of the 32-value block types.
//!
//! Design: block layouts exactly as ggml defines them (ggml-common.h, and `gguf.quants` of the
//! `gguf` Python package 0.19.0, which our fixtures use as the reference):
//! - `Q8_0`: f16 `d`, 32 x i8 `q`; `x[i] = q[i] * d`.
//! - `Q4_0`: f16 `d`, 16 bytes; low nibbles are elements 0..16, high nibbles 16..32;
//!   `x = (q - 8) * d`.
//! - `Q4_1`: f16 `d`, f16 `m`, 16 bytes (same nibble order); `x = q * d + m`.
//! - `Q4_K`, `Q5_K`, `Q6_K`: see [`super::kquants`].
//!
//! Quantized tensors stay quantized ([`HostData::Quant`], the file's blocks copied once); the
//! decoders here compute in f32 with gguf-py's operation order, so they are bit-identical to it and
//! serve as the reference of the CPU kernels. F32, F16 and BF16 sources keep their type.

use half::{bf16, f16};

use super::quant::{QuantData, QuantType};
use super::types::GgmlType;
use crate::loader::tensor::HostData;

/// Elements in one Q8_0/Q4_0/Q4_1 block.
const QK: usize = 32;

/// The tensor data of `bytes` of type `ty` (exactly `numel` elements). Returns `None` for a type
/// sov does not support or a byte length that does not match `numel`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Option<HostData> {
    let expected = ty.byte_size(&[numel as u64])?;
    if bytes.len() as u64 != expected {
        return None;
    }
    if let Some(q) = QuantType::from_ggml(ty) {
        return Some(HostData::Quant(QuantData {
            ty: q,
            bytes: bytes.to_vec(),
        }));
    }
    Some(match ty {
        t if t == GgmlType::F32 => HostData::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        t if t == GgmlType::F16 => HostData::F16(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        t if t == GgmlType::BF16 => HostData::BF16(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        _ => return None,
    })
}

/// The f16 at byte `at` of `b`, as f32.
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One Q8_0 block (34 bytes) into 32 values.
pub(super) fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out[..QK].iter_mut().zip(&b[2..2 + QK]) {
        *o = f32::from(q as i8) * d;
    }
}

/// One Q4_0 block (18 bytes) into 32 values.
pub(super) fn block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = out[..QK].split_at_mut(QK / 2);
    for (i, &q) in b[2..2 + QK / 2].iter().enumerate() {
        lo[i] = d * f32::from((q & 0x0f) as i8 - 8);
        hi[i] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// One Q4_1 block (20 bytes) into 32 values.
pub(super) fn block_q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo, hi) = out[..QK].split_at_mut(QK / 2);
    for (i, &q) in b[4..4 + QK / 2].iter().enumerate() {
        lo[i] = d * f32::from(q & 0x0f) + m;
        hi[i] = d * f32::from(q >> 4) + m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(data: HostData) -> Vec<f32> {
        match data {
            HostData::Quant(q) => q.to_f32(),
            other => panic!("expected quantized data, got {other:?}"),
        }
    }

    /// Hand-built blocks from the format definition (independent of the fixture file).
    #[test]
    fn hand_built_blocks_follow_the_ggml_layout() {
        // Q8_0: d = 0.5, q = -16..16 -> x = q / 2.
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((-16i8..16).map(|q| q as u8));
        let x = f16s(dequantize(GgmlType::Q8_0, &b, 32).expect("q8_0"));
        assert_eq!(x, (-16..16).map(|q| q as f32 * 0.5).collect::<Vec<_>>());

        // Q4_0: d = 2, byte i = (hi = 15 - i % 16) << 4 | (lo = i); x = (q - 8) * 2.
        let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend((0u8..16).map(|i| ((15 - i) << 4) | i));
        let x = f16s(dequantize(GgmlType::Q4_0, &b, 32).expect("q4_0"));
        let lo: Vec<f32> = (0..16).map(|q| (q as f32 - 8.0) * 2.0).collect();
        let hi: Vec<f32> = (0..16).map(|i| ((15 - i) as f32 - 8.0) * 2.0).collect();
        assert_eq!(x, [lo, hi].concat());

        // Q4_1: d = 0.25, m = -1; x = q * 0.25 - 1.
        let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend((0u8..16).map(|i| ((15 - i) << 4) | i));
        let x = f16s(dequantize(GgmlType::Q4_1, &b, 32).expect("q4_1"));
        let lo: Vec<f32> = (0..16).map(|q| q as f32 * 0.25 - 1.0).collect();
        let hi: Vec<f32> = (0..16).map(|i| (15 - i) as f32 * 0.25 - 1.0).collect();
        assert_eq!(x, [lo, hi].concat());
    }

    #[test]
    fn wrong_lengths_and_unsupported_types_are_refused() {
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], 32).is_none());
        assert!(dequantize(GgmlType::Q4_1, &[0u8; 20], 31).is_none());
        assert!(dequantize(GgmlType::F32, &[0u8; 8], 3).is_none());
        let q3k = GgmlType::from_id(11).expect("Q3_K is a ggml type");
        assert!(dequantize(q3k, &[0u8; 110], 256).is_none());
        assert!(dequantize(GgmlType::Q4_K, &[0u8; 144], 255).is_none());
    }
}
