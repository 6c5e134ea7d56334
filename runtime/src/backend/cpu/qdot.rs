//! Dot products of one quantized weight row with up to four f32 activation rows, with run-time
//! CPU-feature dispatch.
//!
//! Design: activations stay f32 and weights are dequantized in registers, block by block, with
//! the reference's arithmetic (so a kernel differs from "dequantize to f32, then dot" only in the
//! order of the f32 additions). 8-bit activations (llama.cpp's `vec_dot_q4_1_q8_1`) would let
//! VNNI do the products in int8, but they round every activation and the default model's greedy
//! tokens then leave the f32 reference early; see `runtime/BENCHMARKS.md`.
//!
//! Levels, picked once from the CPU ([`Level::detect`]) and forceable for tests:
//! - [`Level::Avx512`] (AVX-512F/BW/VL + F16C + FMA): 16 values per instruction;
//! - [`Level::Avx2`] (AVX2 + FMA + F16C): 8 values per instruction;
//! - [`Level::Neon`] (aarch64): 4 values per instruction;
//! - [`Level::Scalar`]: the reference: [`decode_block`] then plain multiply-adds.
//!
//! Q4_0, Q4_1 and Q8_0 have a kernel per level. The K-quants (256-value super-blocks with packed
//! 6-bit scales) are decoded one super-block at a time into an L1-resident f32 tile by the scalar
//! decoder and dotted there with the f32 SIMD kernel of [`super::dense_dot`].

use std::sync::OnceLock;

use crate::loader::gguf::quant::{decode_block, decode_blocks};
use crate::loader::tensor::QuantType;

use super::dense_dot::{DenseRow, dense_dot_rows};

/// A kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Portable scalar code, the reference.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512F/BW/VL + FMA + F16C.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Level {
    /// The best level this CPU runs (detected once).
    pub fn detect() -> Level {
        *Level::available().last().unwrap_or(&Level::Scalar)
    }

    /// Every level this CPU runs, worst first (always starts with [`Level::Scalar`]; detected
    /// once).
    pub fn available() -> &'static [Level] {
        static LEVELS: OnceLock<Vec<Level>> = OnceLock::new();
        LEVELS.get_or_init(Level::probe)
    }

    fn probe() -> Vec<Level> {
        let mut levels = vec![Level::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if super::dense_dot::has_avx2() {
                levels.push(Level::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                {
                    levels.push(Level::Avx512);
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                levels.push(Level::Neon);
            }
        }
        levels
    }
}

/// `out[r] = dequant(w) . xs[r]` for `r < N` (`N <= 8`; over 4 only AVX-512 keeps the rows in
/// registers) at the detected level; `w` is whole blocks
/// of `ty`.
///
/// # Panics
/// When `w` is not whole blocks or an activation row is shorter than the weight row (caller bugs,
/// never user input: the backend checks shapes first).
pub fn qdot_rows<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    qdot_rows_at(Level::detect(), ty, w, xs)
}

/// [`qdot_rows`] at a given level.
///
/// # Panics
/// As [`qdot_rows`], and when `level` is not in [`Level::available`].
pub fn qdot_rows_at<const N: usize>(
    level: Level,
    ty: QuantType,
    w: &[u8],
    xs: &[&[f32]; N],
) -> [f32; N] {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    assert!(w.len().is_multiple_of(bb), "qdot: not whole blocks");
    let k = w.len() / bb * be;
    for x in xs {
        assert!(x.len() >= k, "qdot: activation row shorter than weight row");
    }
    assert!(
        Level::available().contains(&level),
        "qdot: level {level:?} not supported by this CPU"
    );
    match (level, ty) {
        (Level::Scalar, _) => scalar(ty, w, xs),
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0) => {
            // SAFETY: the CPU has AVX-512F/BW/VL, AVX2, FMA and F16C (level available, asserted
            // above); `w` is whole blocks of `ty`; every `xs[r]` holds the `k` values read.
            unsafe { super::qdot_x86::avx512(ty, w, xs) }
        }
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0) => {
            // SAFETY: the CPU has AVX2, FMA and F16C (level available, asserted above); `w` is
            // whole blocks of `ty`; every `xs[r]` holds the `k` values read.
            unsafe { super::qdot_x86::avx2(ty, w, xs) }
        }
        #[cfg(target_arch = "aarch64")]
        (Level::Neon, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0) => {
            // SAFETY: the CPU has NEON (level available, asserted above); `w` is whole blocks of
            // `ty`; every `xs[r]` holds the `k` values read.
            unsafe { super::qdot_neon::neon(ty, w, xs) }
        }
        _ => tiled(ty, w, xs),
    }
}

/// `f(j, dequant(row j) . xs[r] for r < N)` for every row `j` of `w`, a matrix of whole rows of
/// `row_bytes` bytes (whole blocks of `ty`), at the detected level: [`qdot_rows`] row after row,
/// with the level chosen and the shapes checked once for the whole matrix.
///
/// # Panics
/// As [`qdot_rows`], and when `w` is not whole rows.
pub fn qdot_matrix<const N: usize>(
    ty: QuantType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    qdot_matrix_at(Level::detect(), ty, w, row_bytes, xs, f)
}

/// [`qdot_matrix`] at a given level.
///
/// # Panics
/// As [`qdot_matrix`], and when `level` is not in [`Level::available`].
pub fn qdot_matrix_at<const N: usize>(
    level: Level,
    ty: QuantType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    if row_bytes == 0 || w.is_empty() {
        return;
    }
    assert!(w.len().is_multiple_of(row_bytes), "qdot: not whole rows");
    #[cfg(target_arch = "x86_64")]
    if matches!(level, Level::Avx512 | Level::Avx2)
        && matches!(ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0)
    {
        let bb = ty.block_bytes();
        assert!(row_bytes.is_multiple_of(bb), "qdot: not whole blocks");
        let k = row_bytes / bb * 32;
        for x in xs {
            assert!(x.len() >= k, "qdot: activation row shorter than weight row");
        }
        assert!(
            Level::available().contains(&level),
            "qdot: level {level:?} not supported by this CPU"
        );
        if level == Level::Avx512 {
            // SAFETY: the CPU has AVX-512F/BW/VL, AVX2, FMA and F16C (level available, asserted
            // above); `w` is whole rows of whole blocks of `ty`; every `xs[r]` holds the `k`
            // values a row reads.
            unsafe { super::qdot_x86::avx512_rows(ty, w, row_bytes, xs, f) };
        } else {
            // SAFETY: the CPU has AVX2, FMA and F16C (level available, asserted above); `w` is
            // whole rows of whole blocks of `ty`; every `xs[r]` holds the `k` values a row reads.
            unsafe { super::qdot_x86::avx2_rows(ty, w, row_bytes, xs, f) };
        }
        return;
    }
    for (j, row) in w.chunks_exact(row_bytes).enumerate() {
        f(j, qdot_rows_at(level, ty, row, xs));
    }
}

/// Decodes whole blocks of `ty` into `out` (as [`decode_blocks`], bit-identical), with the
/// AVX-512 kernel's weight rebuild where it applies: the prefill path widens weight tiles with it.
///
/// # Panics
/// When `out` is not whole blocks or `bytes` is too short (a caller bug).
pub fn decode_rows(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Level::detect() == Level::Avx512
        && matches!(ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0)
    {
        let blocks = out.len() / 32;
        assert!(
            out.len().is_multiple_of(32) && bytes.len() >= blocks * ty.block_bytes(),
            "decode_rows: not whole blocks"
        );
        // SAFETY: the CPU has AVX-512F/BW/VL, AVX2, FMA and F16C (detected); `bytes` holds
        // `blocks` whole blocks and `out` holds `32 * blocks` values (asserted above).
        unsafe { super::qdot_x86::decode512(ty, &bytes[..blocks * ty.block_bytes()], out) };
        return;
    }
    decode_blocks(ty, bytes, out);
}

/// The reference: each block decoded to f32, then multiply-adds in element order.
fn scalar<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let mut buf = [0f32; 256];
    let mut out = [0f32; N];
    for (b, block) in w.chunks_exact(bb).enumerate() {
        decode_block(ty, block, &mut buf);
        for (o, x) in out.iter_mut().zip(xs) {
            for (wv, xv) in buf[..be].iter().zip(&x[b * be..(b + 1) * be]) {
                *o += wv * xv;
            }
        }
    }
    out
}

/// Any block type: decode a block into an f32 tile, dot it with the f32 SIMD kernel.
fn tiled<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let mut buf = [0f32; 256];
    let mut out = [0f32; N];
    for (b, block) in w.chunks_exact(bb).enumerate() {
        decode_block(ty, block, &mut buf);
        let part: [&[f32]; N] = std::array::from_fn(|r| &xs[r][b * be..(b + 1) * be]);
        let s = dense_dot_rows(DenseRow::F32(&buf[..be]), &part);
        for (o, v) in out.iter_mut().zip(s) {
            *o += v;
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
