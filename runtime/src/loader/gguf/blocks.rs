//! Scalar decoders of ggml's 32-value block types `Q8_0`, `Q4_0` and `Q4_1`.
//!
//! Design: block layouts exactly as ggml defines them (ggml-common.h, and `gguf.quants` of the
//! `gguf` Python package 0.19.0, which our fixtures use as the reference), computed in f32 with
//! gguf-py's operation order, so they are bit-identical to it:
//! - `Q8_0`: f16 `d`, 32 x i8 `q`; `x[i] = q[i] * d`.
//! - `Q4_0`: f16 `d`, 16 bytes; low nibbles are elements 0..16, high nibbles 16..32;
//!   `x = (q - 8) * d`.
//! - `Q4_1`: f16 `d`, f16 `m`, 16 bytes (same nibble order); `x = q * d + m`.
//!
//! The 256-value K-quants are in [`super::kquants`]; [`super::quant::decode_block`] dispatches.

use half::f16;

/// Elements in one Q8_0/Q4_0/Q4_1 block.
const QK: usize = 32;

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
