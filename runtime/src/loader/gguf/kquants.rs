//! Scalar decoders of ggml's K-quant super-blocks `Q4_K`, `Q5_K` and `Q6_K` (256 values each).
//!
//! Design: layouts and arithmetic exactly as ggml's `dequantize_row_q{4,5,6}_K` (ggml-quants.c)
//! and `gguf.quants.Q4_K` / `Q5_K` / `Q6_K` of gguf-py 0.19.0, our fixture reference, computed in
//! f32 with gguf-py's operation order:
//! - `Q4_K` (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of eight 6-bit (scale, min) pairs, 128
//!   bytes of 4-bit codes. Sub-block `j` (32 values) is `x = (d * sc[j]) * q - (dmin * m[j])`;
//!   each 32-byte group of codes holds sub-block `2i` in its low nibbles and `2i + 1` in its high.
//! - `Q5_K` (176 bytes): as `Q4_K`, then 32 bytes `qh` whose bit `j` of byte `l` is the fifth bit
//!   of value `l` of sub-block `j`, then the 128 bytes of low nibbles.
//! - `Q6_K` (210 bytes): 128 bytes low nibbles `ql`, 64 bytes high 2-bit pairs `qh`, 16 i8 scales,
//!   f16 `d`; `x = (d * scale) * (q - 32)` with one scale per 16 values.

use super::blocks::f16_at;

/// Values in one K-quant super-block.
pub const QK_K: usize = 256;

/// The 6-bit scale and min of sub-block `j` from Q4_K's 12 packed bytes (ggml's
/// `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// One Q4_K super-block (144 bytes) into 256 values.
pub(super) fn block_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (i, (y, q)) in out[..QK_K]
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * f32::from(q[l] & 0x0f) - min1;
            hi[l] = d2 * f32::from(q[l] >> 4) - min2;
        }
    }
}

/// One Q5_K super-block (176 bytes) into 256 values.
pub(super) fn block_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (j, y) in out[..QK_K].chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(j, scales);
        let (dj, mj) = (d * f32::from(sc), dmin * f32::from(m));
        let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let shift = 4 * (j % 2);
        for l in 0..32 {
            let lo = (q[l] >> shift) & 0x0f;
            let hi = (qh[l] >> j) & 1;
            y[l] = dj * f32::from(lo | (hi << 4)) - mj;
        }
    }
}

/// One Q6_K super-block (210 bytes) into 256 values.
pub(super) fn block_q6_k(b: &[u8], out: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
        let y = &mut out[128 * half..128 * (half + 1)];
        let scale = |k: usize| d * f32::from(sc[k] as i8);
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = scale(is) * q1 as f32;
            y[l + 32] = scale(is + 2) * q2 as f32;
            y[l + 64] = scale(is + 4) * q3 as f32;
            y[l + 96] = scale(is + 6) * q4 as f32;
        }
    }
}
