//! x86-64 kernels of [`super::qdot`] for the 32-value block types Q4_0, Q4_1 and Q8_0.
//!
//! Design: one block per step, weights rebuilt with the reference's operations (`d * (q - 8)`,
//! `d * q + m`, `q * d`: a multiply then an add, never a fused one, so they equal
//! [`decode_block`]'s bit for bit), then multiply-added into per-row accumulators. AVX-512 holds
//! a half block per register and keeps two accumulators per row; for the 4-bit types it computes
//! the block's 16 possible values once (`d * iota + m`) and looks each code up with `vpermps`
//! (which reads the low 4 bits of each lane), saving the int-to-float conversions and half the
//! scaling; over a matrix it rebuilds the blocks of two weight rows at a time and dots them with
//! up to six activation rows (a register tile, [`tile512`]), so one rebuild and one activation
//! load serve several products, each sum added in the one-row kernel's order. AVX2 spreads the
//! 4-bit codes into i32 lanes with two byte shuffles (Q8_0 widens its bytes), converts and
//! scales them, a quarter block per register, with four accumulators per row; its kernels are specialized per block type at compile time and a whole matrix runs in
//! one call (`avx2_rows`), so neither the type nor the shapes are checked per row.
//!
//! [`decode_block`]: crate::loader::gguf::quant::decode_block

use std::arch::x86_64::*;

use super::lanes_x86::hsum256;
use crate::loader::tensor::QuantType;

/// The f16 at `p` (unaligned), widened.
///
/// # Safety
/// F16C is available; 2 bytes are readable at `p`.
#[target_feature(enable = "f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at `p` (caller contract).
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The 32 weights of block `p` of `ty` as two groups of 16 (elements 0..16 and 16..32).
///
/// # Safety
/// The CPU has AVX-512F/BW/VL and F16C; `p` points at one whole block of `ty` (Q4_0, Q4_1 or
/// Q8_0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn weights512(ty: QuantType, p: *const u8) -> (__m512, __m512) {
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    // SAFETY: every read stays inside the block at `p` (18, 20 or 34 bytes; caller contract).
    unsafe {
        match ty {
            QuantType::Q4_0 | QuantType::Q4_1 => {
                let (table, off) = if ty == QuantType::Q4_0 {
                    let d = _mm512_set1_ps(f16_at(p));
                    (
                        _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0))),
                        2,
                    )
                } else {
                    // d and m are adjacent f16s: one load, one conversion.
                    let dm =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                    let d = _mm512_broadcastss_ps(dm);
                    let m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                    (_mm512_add_ps(_mm512_mul_ps(d, iota), m), 4)
                };
                let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(off) as *const __m128i));
                (
                    _mm512_permutexvar_ps(idx, table),
                    _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table),
                )
            }
            _ => {
                let d = _mm512_set1_ps(f16_at(p));
                let lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
                let hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(18) as *const __m128i));
                (
                    _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d),
                )
            }
        }
    }
}

/// AVX-512 kernel: `out[r] = dequant(w) . xs[r]`.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL, AVX2, FMA and F16C; `ty` is Q4_0, Q4_1 or Q8_0; `w` is whole
/// blocks of `ty`; every `xs[r]` holds at least `w.len() / block_bytes * 32` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub unsafe fn avx512<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let bb = ty.block_bytes();
    let nb = w.len() / bb;
    let mut acc0 = [_mm512_setzero_ps(); N];
    let mut acc1 = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        // SAFETY: block `b < nb` lies inside `w`; `xs[r]` holds `32 * nb` values (contract).
        unsafe {
            let (wlo, whi) = weights512(ty, w.as_ptr().add(b * bb));
            for r in 0..N {
                let xp = xs[r].as_ptr().add(b * 32);
                acc0[r] = _mm512_fmadd_ps(wlo, _mm512_loadu_ps(xp), acc0[r]);
                acc1[r] = _mm512_fmadd_ps(whi, _mm512_loadu_ps(xp.add(16)), acc1[r]);
            }
        }
    }
    std::array::from_fn(|r| _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])))
}

/// [`avx512`] over every row of `w` (rows of `row_bytes` bytes): `f(j, sums of row j)`, the
/// type dispatched once for the whole matrix and `M` weight rows dotted at a time
/// ([`tile512`]): 2 for three to six activation rows, else 1.
///
/// # Safety
/// As [`avx512`] for each row: the CPU features, `ty`, `w` whole rows of whole blocks, and every
/// `xs[r]` holds at least a row's `row_bytes / block_bytes * 32` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn avx512_rows<const N: usize>(
    ty: QuantType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    // SAFETY: the caller's contract, with the type it names.
    unsafe {
        match ty {
            QuantType::Q4_0 => rows512::<T_Q4_0, N>(w, row_bytes, xs, f),
            QuantType::Q4_1 => rows512::<T_Q4_1, N>(w, row_bytes, xs, f),
            _ => rows512::<T_Q8_0, N>(w, row_bytes, xs, f),
        }
    }
}

/// [`avx512_rows`] for block type `T`, the weight-row tile height picked from `N` so that the
/// `2 M N` accumulators, `2 M` weight registers and two activation registers fit the 32 zmm
/// registers. One or two activation rows run the one-row kernel row after row: taller tiles
/// measured slower there when the weights stream from DRAM (`kernel_speed`, Q8_0, two
/// activation rows: 4 weight rows at a time 4.6 ns per block and row against 2.7 for one).
///
/// # Safety
/// As [`avx512_rows`], with `T` the block type.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rows512<const T: u8, const N: usize>(
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    // SAFETY: the caller's contract.
    unsafe {
        if N <= 2 {
            let ty = match T {
                T_Q4_0 => QuantType::Q4_0,
                T_Q4_1 => QuantType::Q4_1,
                _ => QuantType::Q8_0,
            };
            for (j, row) in w.chunks_exact(row_bytes).enumerate() {
                f(j, avx512(ty, row, xs));
            }
        } else if N <= 6 {
            tiles512::<T, 2, N>(w, row_bytes, xs, f)
        } else {
            tiles512::<T, 1, N>(w, row_bytes, xs, f)
        }
    }
}

/// The rows of `w` `M` at a time through [`tile512`], the last `rows % M` one at a time.
///
/// # Safety
/// As [`avx512_rows`], with `T` the block type.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tiles512<const T: u8, const M: usize, const N: usize>(
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    let rows = w.len() / row_bytes;
    let nb = row_bytes / block_bytes::<T>();
    let mut j = 0;
    while j + M <= rows {
        // SAFETY: rows `j .. j + M` lie inside `w`; the rest is the caller's contract.
        let sums = unsafe { tile512::<T, M, N>(w.as_ptr().add(j * row_bytes), row_bytes, nb, xs) };
        for (i, s) in sums.into_iter().enumerate() {
            f(j + i, s);
        }
        j += M;
    }
    while j < rows {
        // SAFETY: row `j` lies inside `w`; the rest is the caller's contract.
        let [s] = unsafe { tile512::<T, 1, N>(w.as_ptr().add(j * row_bytes), row_bytes, nb, xs) };
        f(j, s);
        j += 1;
    }
}

/// Bytes of one block of type `T`.
const fn block_bytes<const T: u8>() -> usize {
    match T {
        T_Q4_0 => 18,
        T_Q4_1 => 20,
        _ => 34,
    }
}

/// `M` weight rows (`nb` blocks of type `T` each, `row_bytes` apart from `w`) dotted with `N`
/// activation rows: `out[i][r] = dequant(row i) . xs[r]`. A register tile: each block of the `M`
/// rows is rebuilt once and each activation half-block loaded once per `M` weight rows. Every
/// (weight row, activation row) pair keeps the two accumulators of [`avx512`] and adds in the
/// same order, so each sum is bit for bit [`avx512`]'s, whatever `M` and `N`.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL, AVX2, FMA and F16C; `w + i * row_bytes` holds `nb` whole blocks
/// of `T` for `i < M`; every `xs[r]` holds at least `32 * nb` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn tile512<const T: u8, const M: usize, const N: usize>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    xs: &[&[f32]; N],
) -> [[f32; N]; M] {
    let ty = match T {
        T_Q4_0 => QuantType::Q4_0,
        T_Q4_1 => QuantType::Q4_1,
        _ => QuantType::Q8_0,
    };
    let bb = block_bytes::<T>();
    let mut acc0 = [[_mm512_setzero_ps(); N]; M]; // [M weight rows][N activation rows]
    let mut acc1 = [[_mm512_setzero_ps(); N]; M];
    for b in 0..nb {
        // SAFETY: block `b < nb` of each of the `M` rows is inside `w`; `xs[r]` holds
        // `32 * nb` values (contract).
        unsafe {
            let mut wlo = [_mm512_setzero_ps(); M];
            let mut whi = [_mm512_setzero_ps(); M];
            for i in 0..M {
                (wlo[i], whi[i]) = weights512(ty, w.add(i * row_bytes + b * bb));
            }
            for r in 0..N {
                let xp = xs[r].as_ptr().add(b * 32);
                let (xl, xh) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                for i in 0..M {
                    acc0[i][r] = _mm512_fmadd_ps(wlo[i], xl, acc0[i][r]);
                    acc1[i][r] = _mm512_fmadd_ps(whi[i], xh, acc1[i][r]);
                }
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|r| _mm512_reduce_add_ps(_mm512_add_ps(acc0[i][r], acc1[i][r])))
    })
}

/// Decodes whole blocks into f32 with [`weights512`] (the same values as the reference decoder).
///
/// # Safety
/// The CPU has AVX-512F/BW/VL, AVX2, FMA and F16C; `ty` is Q4_0, Q4_1 or Q8_0; `w` is whole
/// blocks of `ty` and `out` holds at least `32` values per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn decode512(ty: QuantType, w: &[u8], out: &mut [f32]) {
    let bb = ty.block_bytes();
    for b in 0..w.len() / bb {
        // SAFETY: block `b` lies inside `w`; `out` holds `32 * (b + 1)` values (contract).
        unsafe {
            let (lo, hi) = weights512(ty, w.as_ptr().add(b * bb));
            let o = out.as_mut_ptr().add(32 * b);
            _mm512_storeu_ps(o, lo);
            _mm512_storeu_ps(o.add(16), hi);
        }
    }
}

/// Block types of the AVX2 kernels' const parameter (a `match` on it compiles away).
const T_Q4_0: u8 = 0;
const T_Q4_1: u8 = 1;
const T_Q8_0: u8 = 2;

/// The 32 weights of one block of type `T` as four groups of 8 (elements 0..8, 8..16, 16..24,
/// 24..32), rebuilt with the reference's operations (a multiply, then an add).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `p` points at one whole block of `T` (18, 20 or 34 bytes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn weights256<const T: u8>(p: *const u8) -> [__m256; 4] {
    // SAFETY: every read stays inside the block at `p` (caller contract).
    unsafe {
        if T == T_Q8_0 {
            let d = _mm256_set1_ps(f16_at(p));
            let a = _mm_loadu_si128(p.add(2) as *const __m128i);
            let c = _mm_loadu_si128(p.add(18) as *const __m128i);
            let g = [
                _mm256_cvtepi8_epi32(a),
                _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)),
                _mm256_cvtepi8_epi32(c),
                _mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)),
            ];
            return std::array::from_fn(|i| _mm256_mul_ps(_mm256_cvtepi32_ps(g[i]), d));
        }
        // The 16 code bytes in both halves; one byte shuffle puts bytes 0..8 (8..16) into the
        // low byte of each i32 lane, whose low nibble is element j and high nibble element
        // j + 16.
        let off = if T == T_Q4_0 { 2 } else { 4 };
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(off) as *const __m128i));
        let z = -1i8;
        let first = _mm256_setr_epi8(
            0, z, z, z, 1, z, z, z, 2, z, z, z, 3, z, z, z, 4, z, z, z, 5, z, z, z, 6, z, z, z, 7,
            z, z, z,
        );
        let second = _mm256_setr_epi8(
            8, z, z, z, 9, z, z, z, 10, z, z, z, 11, z, z, z, 12, z, z, z, 13, z, z, z, 14, z, z,
            z, 15, z, z, z,
        );
        let (a, c) = (
            _mm256_shuffle_epi8(q, first),
            _mm256_shuffle_epi8(q, second),
        );
        let nib = _mm256_set1_epi32(0x0f);
        let g = [
            _mm256_and_si256(a, nib),
            _mm256_and_si256(c, nib),
            _mm256_srli_epi32(a, 4),
            _mm256_srli_epi32(c, 4),
        ];
        if T == T_Q4_0 {
            let d = _mm256_set1_ps(f16_at(p));
            let eight = _mm256_set1_epi32(8);
            std::array::from_fn(|i| {
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(g[i], eight)))
            })
        } else {
            // d and m are adjacent f16s: one load, one conversion.
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
            let d = _mm256_broadcastss_ps(dm);
            let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
            std::array::from_fn(|i| _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(g[i])), m))
        }
    }
}

/// The AVX2 kernel for blocks of type `T`: `out[r] = dequant(w) . xs[r]`, four accumulators of
/// 8 lanes per row (so a row's sums are the same whatever `N`).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` is whole blocks of `T`; every `xs[r]` holds at least
/// `32` values per block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot256<const T: u8, const N: usize>(w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let bb = match T {
        T_Q4_0 => 18,
        T_Q4_1 => 20,
        _ => 34,
    };
    let nb = w.len() / bb;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for b in 0..nb {
        // SAFETY: block `b < nb` lies inside `w`; `xs[r]` holds `32 * nb` values (contract).
        unsafe {
            let wv = weights256::<T>(w.as_ptr().add(b * bb));
            for r in 0..N {
                let xp = xs[r].as_ptr().add(b * 32);
                for i in 0..4 {
                    acc[r][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(xp.add(8 * i)), acc[r][i]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        hsum256(_mm256_add_ps(
            _mm256_add_ps(a[0], a[1]),
            _mm256_add_ps(a[2], a[3]),
        ))
    })
}

/// [`dot256`] as a call of its own: over two rows its accumulators fill the 16 registers, and
/// inlined into a loop over weight rows it spills more than a call does (measured by
/// `qdot::tests::kernel_speed`).
///
/// # Safety
/// As [`dot256`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn dot256_call<const T: u8, const N: usize>(w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    // SAFETY: the caller's contract.
    unsafe { dot256::<T, N>(w, xs) }
}

/// AVX2 kernel: `out[r] = dequant(w) . xs[r]`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `ty` is Q4_0, Q4_1 or Q8_0; `w` is whole blocks of `ty`;
/// every `xs[r]` holds at least `w.len() / block_bytes * 32` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn avx2<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    // SAFETY: the caller's contract, with the type it names.
    unsafe {
        match ty {
            QuantType::Q4_0 => dot256_call::<T_Q4_0, N>(w, xs),
            QuantType::Q4_1 => dot256_call::<T_Q4_1, N>(w, xs),
            _ => dot256_call::<T_Q8_0, N>(w, xs),
        }
    }
}

/// The rows of `w` (of `row_bytes` bytes) through [`dot256`] of type `T`.
///
/// # Safety
/// As [`avx2_rows`], with `T` the block type.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows256<const T: u8, const N: usize>(
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    for (j, row) in w.chunks_exact(row_bytes).enumerate() {
        // SAFETY: as the caller's contract, for this row.
        let sums = unsafe {
            if N <= 2 {
                dot256::<T, N>(row, xs)
            } else {
                dot256_call::<T, N>(row, xs)
            }
        };
        f(j, sums);
    }
}

/// [`avx2`] over every row of `w` (rows of `row_bytes` bytes): `f(j, sums of row j)`, the type
/// dispatched once for the whole matrix.
///
/// # Safety
/// As [`avx2`] for each row: the CPU features, `ty`, `w` whole rows of whole blocks, and every
/// `xs[r]` holds at least a row's `row_bytes / block_bytes * 32` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn avx2_rows<const N: usize>(
    ty: QuantType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[f32]; N],
    f: &mut impl FnMut(usize, [f32; N]),
) {
    // SAFETY: the caller's contract, with the type it names.
    unsafe {
        match ty {
            QuantType::Q4_0 => rows256::<T_Q4_0, N>(w, row_bytes, xs, f),
            QuantType::Q4_1 => rows256::<T_Q4_1, N>(w, row_bytes, xs, f),
            _ => rows256::<T_Q8_0, N>(w, row_bytes, xs, f),
        }
    }
}
