//! x86-64 kernels of [`super::qdot`] for the 32-value block types Q4_0, Q4_1 and Q8_0.
//!
//! Design: one block per step, weights rebuilt with the reference's operations (`d * (q - 8)`,
//! `d * q + m`, `q * d`: a multiply then an add, never a fused one, so they equal
//! [`decode_block`]'s bit for bit), then multiply-added into per-row accumulators. AVX-512 holds
//! a half block per register and keeps two accumulators per row; for the 4-bit types it computes
//! the block's 16 possible values once (`d * iota + m`) and looks each code up with `vpermps`
//! (which reads the low 4 bits of each lane), saving the int-to-float conversions and half the
//! scaling. AVX2 widens the codes to i32, converts and scales them, a quarter block per register,
//! with four accumulators per row.
//!
//! [`decode_block`]: crate::loader::gguf::quant::decode_block

use std::arch::x86_64::*;

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

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The 32 weights of block `p` of `ty` as two groups of 16 (elements 0..16 and 16..32).
///
/// # Safety
/// The CPU has AVX-512F/BW/VL and F16C; `p` points at one whole block of `ty` (Q4_0, Q4_1 or
/// Q8_0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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

/// [`avx512`] over every row of `w` (rows of `row_bytes` bytes): `f(j, sums of row j)`.
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
    for (j, row) in w.chunks_exact(row_bytes).enumerate() {
        // SAFETY: as the caller's contract, for this row.
        f(j, unsafe { avx512(ty, row, xs) });
    }
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

/// AVX2 kernel: `out[r] = dequant(w) . xs[r]`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `ty` is Q4_0, Q4_1 or Q8_0; `w` is whole blocks of `ty`;
/// every `xs[r]` holds at least `w.len() / block_bytes * 32` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn avx2<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let bb = ty.block_bytes();
    let nb = w.len() / bb;
    let nib = _mm_set1_epi8(0x0f);
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for b in 0..nb {
        // SAFETY: block `b < nb` lies inside `w` (18, 20 or 34 bytes read from its start);
        // `xs[r]` holds `32 * nb` values (contract).
        unsafe {
            let p = w.as_ptr().add(b * bb);
            // Four groups of 8 codes as i32: elements 0..8, 8..16, 16..24, 24..32.
            let (g, d, m): ([__m256i; 4], f32, f32) = match ty {
                QuantType::Q4_0 | QuantType::Q4_1 => {
                    let off = if ty == QuantType::Q4_0 { 2 } else { 4 };
                    let q = _mm_loadu_si128(p.add(off) as *const __m128i);
                    let lo = _mm_and_si128(q, nib);
                    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
                    let mut g = [
                        _mm256_cvtepu8_epi32(lo),
                        _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                        _mm256_cvtepu8_epi32(hi),
                        _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)),
                    ];
                    let m = if ty == QuantType::Q4_0 {
                        let eight = _mm256_set1_epi32(8);
                        for v in &mut g {
                            *v = _mm256_sub_epi32(*v, eight);
                        }
                        0.0
                    } else {
                        f16_at(p.add(2))
                    };
                    (g, f16_at(p), m)
                }
                _ => {
                    let a = _mm_loadu_si128(p.add(2) as *const __m128i);
                    let c = _mm_loadu_si128(p.add(18) as *const __m128i);
                    (
                        [
                            _mm256_cvtepi8_epi32(a),
                            _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)),
                            _mm256_cvtepi8_epi32(c),
                            _mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)),
                        ],
                        f16_at(p),
                        0.0,
                    )
                }
            };
            let dv = _mm256_set1_ps(d);
            let mv = _mm256_set1_ps(m);
            let wv: [__m256; 4] = std::array::from_fn(|i| {
                let s = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(g[i]));
                if ty == QuantType::Q4_1 {
                    _mm256_add_ps(s, mv)
                } else {
                    s
                }
            });
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
