//! GGUF tensor data into [`HostData`].
//!
//! Design: quantized tensors stay quantized ([`HostData::Quant`], the file's blocks copied once,
//! in ggml's layout: [`super::blocks`], [`super::kquants`]); their scalar decoders
//! ([`super::quant::decode_block`]) compute in f32 with the operation order of the `gguf` Python
//! package 0.19.0, so they are bit-identical to it and serve as the reference of the CPU kernels.
//! F32, F16 and BF16 sources keep their type.

use half::{bf16, f16};

use super::quant::{QuantData, QuantType};
use super::types::GgmlType;
use crate::loader::tensor::HostData;

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
