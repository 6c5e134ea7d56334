//! Dequantization of GGUF tensor data into [`HostData`].
//!
//! Design: block layouts exactly as ggml defines them (ggml-common.h, and `gguf.quants` of the
//! `gguf` Python package 0.19.0, which our fixtures use as the reference):
//! - `Q8_0`: f16 `d`, 32 x i8 `q`; `x[i] = q[i] * d`.
//! - `Q4_0`: f16 `d`, 16 bytes; low nibbles are elements 0..16, high nibbles 16..32;
//!   `x = (q - 8) * d`.
//! - `Q4_1`: f16 `d`, f16 `m`, 16 bytes (same nibble order); `x = q * d + m`.
//! - `Q4_K`, `Q6_K` (the two types of llama.cpp's common `Q4_K_M` files): see [`super::kquants`].
//!
//! Quantized blocks are expanded in f32 and stored as `F16` (its 11-bit significand holds a 4- or
//! 8-bit code times a scale closer than bf16's 8 bits would), halving the memory and bandwidth of
//! f32 on CPU. F32, F16 and BF16 sources keep their type. Blocks are independent, so rows are
//! dequantized in parallel with rayon.

use half::{bf16, f16};
use rayon::prelude::*;

use super::kquants::{self, QK_K};
use super::types::GgmlType;
use crate::loader::tensor::HostData;

/// Elements in one Q8_0/Q4_0/Q4_1 block.
const QK: usize = 32;
/// Blocks handed to one rayon task.
const BLOCKS_PER_TASK: usize = 1024;

/// Dequantizes `bytes` of type `ty` (exactly `numel` elements). Returns `None` for a type sov does
/// not support or a byte length that does not match `numel`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Option<HostData> {
    let expected = ty.byte_size(&[numel as u64])?;
    if bytes.len() as u64 != expected {
        return None;
    }
    Some(match ty {
        t if t == GgmlType::F32 => HostData::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        t if t == GgmlType::F16 => HostData::F16(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]))
                .collect(),
        ),
        t if t == GgmlType::BF16 => HostData::BF16(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                .collect(),
        ),
        t if t == GgmlType::Q8_0 => HostData::F16(blocks(bytes, numel, QK, 34, block_q8_0)),
        t if t == GgmlType::Q4_0 => HostData::F16(blocks(bytes, numel, QK, 18, block_q4_0)),
        t if t == GgmlType::Q4_1 => HostData::F16(blocks(bytes, numel, QK, 20, block_q4_1)),
        t if t == GgmlType::Q4_K => {
            HostData::F16(blocks(bytes, numel, QK_K, 144, kquants::block_q4_k))
        }
        t if t == GgmlType::Q6_K => {
            HostData::F16(blocks(bytes, numel, QK_K, 210, kquants::block_q6_k))
        }
        _ => return None,
    })
}

/// Runs `decode` over every `block_bytes`-sized block of `block_elems` values, in parallel, into
/// `numel` f16 values.
fn blocks(
    bytes: &[u8],
    numel: usize,
    block_elems: usize,
    block_bytes: usize,
    decode: fn(&[u8], &mut [f16]),
) -> Vec<f16> {
    let mut out = vec![f16::ZERO; numel]; // [numel]
    out.par_chunks_mut(block_elems * BLOCKS_PER_TASK)
        .zip(bytes.par_chunks(block_bytes * BLOCKS_PER_TASK))
        .for_each(|(dst, src)| {
            for (d, s) in dst
                .chunks_exact_mut(block_elems)
                .zip(src.chunks_exact(block_bytes))
            {
                decode(s, d);
            }
        });
    out
}

pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One Q8_0 block (34 bytes) into 32 values.
fn block_q8_0(b: &[u8], out: &mut [f16]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..2 + QK]) {
        *o = f16::from_f32(d * f32::from(q as i8));
    }
}

/// One Q4_0 block (18 bytes) into 32 values.
fn block_q4_0(b: &[u8], out: &mut [f16]) {
    let d = f16_at(b, 0);
    let (lo, hi) = out.split_at_mut(QK / 2);
    for (i, &q) in b[2..2 + QK / 2].iter().enumerate() {
        lo[i] = f16::from_f32(d * (f32::from(q & 0x0f) - 8.0));
        hi[i] = f16::from_f32(d * (f32::from(q >> 4) - 8.0));
    }
}

/// One Q4_1 block (20 bytes) into 32 values.
fn block_q4_1(b: &[u8], out: &mut [f16]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo, hi) = out.split_at_mut(QK / 2);
    for (i, &q) in b[4..4 + QK / 2].iter().enumerate() {
        lo[i] = f16::from_f32(d * f32::from(q & 0x0f) + m);
        hi[i] = f16::from_f32(d * f32::from(q >> 4) + m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(data: HostData) -> Vec<f32> {
        match data {
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            other => panic!("expected F16, got {other:?}"),
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
