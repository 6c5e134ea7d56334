//! One query head attending over its sequence's paged keys and values: scores, a numerically
//! stable softmax (max subtracted, as `torch.softmax`), and the weighted sum of values.
//!
//! Design: the keys are walked block by block through the block table (no division per key),
//! the per-head score row lives in a buffer the caller reuses, and the inner loops run in SIMD at
//! the level [`Level::detect`] picks: AVX-512 for head sizes that are whole 16-lane registers
//! (q . k for 16 keys at a time with one transposing reduction, a vectorized `exp`, the value
//! sum in register tiles over two keys at a time), AVX2 + FMA for whole 8-lane ones, and a
//! portable loop otherwise (and as the reference the others are tested against). Each head's result
//! depends only on its own query, keys and values, never on the batch it runs in.

use super::qdot::Level;

/// Where one head's keys lie in a paged cache `[num_blocks * block_size, stride]`.
#[derive(Debug, Clone, Copy)]
pub struct KeyRows<'a> {
    /// Block ids of the sequence, in order (at least `len.div_ceil(block_size)` of them).
    pub table: &'a [u32],
    /// Tokens per block.
    pub block_size: usize,
    /// Elements per cache row (`KVH * D`).
    pub stride: usize,
    /// Offset of this head's `D` values inside a row (`g * D`).
    pub offset: usize,
    /// Context length: keys `0 .. len` are attended.
    pub len: usize,
}

impl KeyRows<'_> {
    /// Calls `f(j, at)` for every key `j < len`, `at` the index of its first value in the cache.
    #[inline(always)]
    fn each(&self, mut f: impl FnMut(usize, usize)) {
        let mut j = 0;
        for &blk in self.table {
            if j >= self.len {
                break;
            }
            let base = blk as usize * self.block_size * self.stride + self.offset;
            let n = self.block_size.min(self.len - j);
            for t in 0..n {
                f(j + t, base + t * self.stride);
            }
            j += n;
        }
    }
}

impl KeyRows<'_> {
    /// As [`KeyRows::each`], two keys of a block at a time: `f(j, at_j, Some(at_j+1))`, and
    /// `f(j, at_j, None)` for a block's odd last key.
    #[inline(always)]
    fn each_pair(&self, mut f: impl FnMut(usize, usize, Option<usize>)) {
        let mut j = 0;
        for &blk in self.table {
            if j >= self.len {
                break;
            }
            let base = blk as usize * self.block_size * self.stride + self.offset;
            let n = self.block_size.min(self.len - j);
            let mut t = 0;
            while t + 2 <= n {
                f(
                    j + t,
                    base + t * self.stride,
                    Some(base + (t + 1) * self.stride),
                );
                t += 2;
            }
            if t < n {
                f(j + t, base + t * self.stride, None);
            }
            j += n;
        }
    }
}

/// `out = softmax(scale * q . K[0..len]) @ V[0..len]` for one head at the detected level.
/// `q`, `out`: `[D]`; `k`, `v`: `[num_blocks * block_size, stride]`; `scores` is scratch
/// (resized to `len`).
///
/// # Panics
/// When a key's values lie outside `k` or `v` (the caller checks the block table first).
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keys: KeyRows<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_at(Level::detect(), q, k, v, keys, scale, scores, out)
}

/// [`attend`] at a given level (a level the CPU lacks, or a head size it does not fit, runs the
/// portable loops).
#[allow(clippy::too_many_arguments)]
pub fn attend_at(
    level: Level,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keys: KeyRows<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = q.len();
    assert_eq!(out.len(), d, "attend: out is not one head");
    scores.clear();
    scores.resize(keys.len, 0.0);
    let level = if Level::available().contains(&level) {
        level
    } else {
        Level::Scalar
    };
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 if d.is_multiple_of(16) => {
            // SAFETY: the CPU has AVX-512F/BW/VL, AVX2, FMA and F16C (level available); `d` is
            // whole 16-lane registers; the kernels bound-check every key's slice.
            unsafe { x86::attend512(q, k, v, keys, scale, scores, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 | Level::Avx2 if d.is_multiple_of(8) => {
            // SAFETY: the CPU has AVX2, FMA and F16C (every x86 level above scalar has them);
            // `d` is whole 8-lane registers; the kernels bound-check every key's slice.
            unsafe { x86::attend256(q, k, v, keys, scale, scores, out) }
        }
        _ => portable(q, k, v, keys, scale, scores, out),
    }
}

/// Subtracts the max, exponentiates in place and returns the sum (shared by every level).
#[inline(always)]
fn softmax_unnormalized(scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    sum
}

/// The reference loops: plain multiply-adds in element order.
fn portable(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keys: KeyRows<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let d = q.len();
    keys.each(|j, at| {
        let dot: f32 = q.iter().zip(&k[at..at + d]).map(|(a, b)| a * b).sum();
        scores[j] = dot * scale;
    });
    let inv = 1.0 / softmax_unnormalized(scores);
    out.fill(0.0);
    keys.each(|j, at| {
        let p = scores[j];
        for (o, x) in out.iter_mut().zip(&v[at..at + d]) {
            *o += p * x;
        }
    });
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KeyRows, softmax_unnormalized};

    /// AVX-512: 16 lanes per register, `d / 16` registers per key.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW/VL, AVX2, FMA and F16C; `q.len() == out.len()` is a multiple of 16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn attend512(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        keys: KeyRows<'_>,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let d = q.len();
        // Scores 16 keys at a time (one transposing reduction for all 16), then one by one.
        let mut group = [0usize; 16];
        let mut filled = 0;
        keys.each(|j, at| {
            assert!(at + d <= k.len(), "attend: key row outside the cache");
            group[filled] = at;
            filled += 1;
            if filled == 16 {
                filled = 0;
                // SAFETY: AVX-512 available (contract); every row of `group` holds `d` values
                // inside `k` (asserted as it was added).
                let sums = unsafe { scores16(q, k, &group) };
                let sc = _mm512_mul_ps(sums, _mm512_set1_ps(scale));
                // SAFETY: `j + 1 - 16 .. j + 1` lies inside `scores` (`scores.len() == len`).
                unsafe { _mm512_storeu_ps(scores[j + 1 - 16..j + 1].as_mut_ptr(), sc) };
            }
        });
        let rest = scores.len() - filled;
        for (t, &at) in group[..filled].iter().enumerate() {
            let kr = &k[at..at + d]; // [D], bound-checked
            let mut acc = _mm512_setzero_ps();
            for c in (0..d).step_by(16) {
                // SAFETY: `c + 16 <= d` and both `q` and `kr` hold `d` values.
                unsafe {
                    acc = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q.as_ptr().add(c)),
                        _mm512_loadu_ps(kr.as_ptr().add(c)),
                        acc,
                    );
                }
            }
            scores[rest + t] = _mm512_reduce_add_ps(acc) * scale;
        }
        // SAFETY: AVX-512 available (contract).
        let inv = 1.0 / unsafe { softmax512(scores) };
        // Output tiles of 4 registers (64 values) held in registers across all keys, then
        // single registers for the rest.
        let mut c = 0;
        while c + 64 <= d {
            // SAFETY: AVX-512 available (contract); `c + 64 <= d`.
            unsafe { values512::<4>(v, keys, scores, inv, c, &mut out[c..c + 64]) };
            c += 64;
        }
        while c < d {
            // SAFETY: AVX-512 available (contract); `c + 16 <= d` (`d` is whole registers).
            unsafe { values512::<1>(v, keys, scores, inv, c, &mut out[c..c + 16]) };
            c += 16;
        }
    }

    /// `out = inv * sum_j scores[j] * V[j][c .. c + 16 R]`, the `R` accumulators in registers.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `out` holds `16 R` values and every key row holds `c + 16 R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn values512<const R: usize>(
        v: &[f32],
        keys: KeyRows<'_>,
        scores: &[f32],
        inv: f32,
        c: usize,
        out: &mut [f32],
    ) {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acc2 = [_mm512_setzero_ps(); R];
        // Two keys a step into two accumulator sets (two independent FMA chains).
        keys.each_pair(|j, at0, at1| {
            let v0 = &v[at0 + c..at0 + c + 16 * R]; // tile of value row j, bound-checked
            let p0 = _mm512_set1_ps(scores[j]);
            match at1 {
                Some(at1) => {
                    let v1 = &v[at1 + c..at1 + c + 16 * R]; // tile of value row j + 1
                    let p1 = _mm512_set1_ps(scores[j + 1]);
                    for r in 0..R {
                        // SAFETY: `16 r + 16 <= 16 R = v0.len() = v1.len()`.
                        let (x0, x1) = unsafe {
                            (
                                _mm512_loadu_ps(v0.as_ptr().add(16 * r)),
                                _mm512_loadu_ps(v1.as_ptr().add(16 * r)),
                            )
                        };
                        acc[r] = _mm512_fmadd_ps(p0, x0, acc[r]);
                        acc2[r] = _mm512_fmadd_ps(p1, x1, acc2[r]);
                    }
                }
                None => {
                    for (r, a) in acc.iter_mut().enumerate() {
                        // SAFETY: `16 r + 16 <= 16 R = v0.len()`.
                        let x0 = unsafe { _mm512_loadu_ps(v0.as_ptr().add(16 * r)) };
                        *a = _mm512_fmadd_ps(p0, x0, *a);
                    }
                }
            }
        });
        let inv = _mm512_set1_ps(inv);
        for r in 0..R {
            let sum = _mm512_add_ps(acc[r], acc2[r]);
            // SAFETY: `16 r + 16 <= 16 R = out.len()` (asserted by the slice below).
            unsafe {
                _mm512_storeu_ps(
                    out[16 * r..16 * r + 16].as_mut_ptr(),
                    _mm512_mul_ps(sum, inv),
                )
            };
        }
    }

    /// The 16 dot products `q . K[at]` for the 16 key rows starting at `group[t]`, lane `t`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `q.len()` is a multiple of 16 and every `group[t] + q.len() <= k.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scores16(q: &[f32], k: &[f32], group: &[usize; 16]) -> __m512 {
        let d = q.len();
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in (0..d).step_by(16) {
            // SAFETY: `c + 16 <= d = q.len()`; key rows hold `d` values (contract).
            let qc = unsafe { _mm512_loadu_ps(q.as_ptr().add(c)) };
            for (a, &at) in acc.iter_mut().zip(group) {
                // SAFETY: as above, for key row `at`.
                *a = _mm512_fmadd_ps(qc, unsafe { _mm512_loadu_ps(k.as_ptr().add(at + c)) }, *a);
            }
        }
        reduce16(&acc)
    }

    /// Lane `t` of the result is the sum of the 16 lanes of `v[t]` (a transposing reduction:
    /// 15 shuffle-and-add steps for all 16 rows instead of 4 per row).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn reduce16(v: &[__m512; 16]) -> __m512 {
        // Halves: x[p] chunks 0-1 hold v[2p]'s partials, chunks 2-3 v[2p + 1]'s.
        let x: [__m512; 8] = std::array::from_fn(|p| {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            )
        });
        // Quarters: chunk c of y[p] holds 4 partials of v[4p + c].
        let y: [__m512; 4] = std::array::from_fn(|p| {
            let (a, b) = (x[2 * p], x[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            )
        });
        // Eighths: in chunk c of z[p], lanes 0-1 are v[8p + c]'s, lanes 2-3 v[8p + 4 + c]'s.
        let z: [__m512; 2] = std::array::from_fn(|p| {
            let (a, b) = (y[2 * p], y[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(a, b),
                _mm512_shuffle_ps::<0xEE>(a, b),
            )
        });
        // Lane 4c + i holds the sum of v[4i + c]; put it in lane 4i + c.
        let r = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(z[0], z[1]),
            _mm512_shuffle_ps::<0xDD>(z[0], z[1]),
        );
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, r)
    }

    /// `e^x` in every lane (Cephes' `expf`: a degree-7 polynomial on `x - n ln 2`, scaled by
    /// `2^n`; within 2 ulp of the correctly rounded value), NaN kept, `x < -104` gives 0.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn exp512(x: __m512) -> __m512 {
        // `vmaxps` returns its second operand when one is NaN, so a NaN `x` stays NaN.
        let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_fmadd_ps(
            p,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        _mm512_scalef_ps(y, n)
    }

    /// [`super::softmax_unnormalized`] in 16 lanes with [`exp512`]: subtracts the max,
    /// exponentiates in place, returns the sum.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn softmax512(scores: &mut [f32]) -> f32 {
        let mut maxv = _mm512_set1_ps(f32::NEG_INFINITY);
        for ch in scores.chunks(16) {
            let m: __mmask16 = ((1u32 << ch.len()) - 1) as __mmask16;
            // SAFETY: lanes beyond `ch.len()` are masked off.
            let v = unsafe { _mm512_mask_loadu_ps(maxv, m, ch.as_ptr()) };
            maxv = _mm512_max_ps(maxv, v);
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(maxv));
        let mut sum = _mm512_setzero_ps();
        for ch in scores.chunks_mut(16) {
            let m: __mmask16 = ((1u32 << ch.len()) - 1) as __mmask16;
            // SAFETY: lanes beyond `ch.len()` are masked off for the load and the store.
            unsafe {
                let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, ch.as_ptr()), max));
                _mm512_mask_storeu_ps(ch.as_mut_ptr(), m, e);
                sum = _mm512_mask_add_ps(sum, m, sum, e);
            }
        }
        _mm512_reduce_add_ps(sum)
    }

    /// Sum of the eight lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// AVX2 + FMA: 8 lanes per register, `d / 8` registers per key.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `q.len() == out.len()` is a multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend256(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        keys: KeyRows<'_>,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let d = q.len();
        keys.each(|j, at| {
            let kr = &k[at..at + d]; // [D], bound-checked
            let mut acc = _mm256_setzero_ps();
            for c in (0..d).step_by(8) {
                // SAFETY: `c + 8 <= d` and both `q` and `kr` hold `d` values.
                unsafe {
                    acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(q.as_ptr().add(c)),
                        _mm256_loadu_ps(kr.as_ptr().add(c)),
                        acc,
                    );
                }
            }
            scores[j] = hsum(acc) * scale;
        });
        let inv = 1.0 / softmax_unnormalized(scores);
        // Output tiles of 8 registers (64 values) held in registers across all keys, then
        // single registers for the rest.
        let mut c = 0;
        while c + 64 <= d {
            // SAFETY: AVX2 and FMA available (contract); `c + 64 <= d`.
            unsafe { values256::<8>(v, keys, scores, inv, c, &mut out[c..c + 64]) };
            c += 64;
        }
        while c < d {
            // SAFETY: AVX2 and FMA available (contract); `c + 8 <= d` (`d` is whole registers).
            unsafe { values256::<1>(v, keys, scores, inv, c, &mut out[c..c + 8]) };
            c += 8;
        }
    }

    /// `out = inv * sum_j scores[j] * V[j][c .. c + 8 R]`, the `R` accumulators in registers.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `out` holds `8 R` values and every key row holds `c + 8 R`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn values256<const R: usize>(
        v: &[f32],
        keys: KeyRows<'_>,
        scores: &[f32],
        inv: f32,
        c: usize,
        out: &mut [f32],
    ) {
        let mut acc = [_mm256_setzero_ps(); R];
        keys.each(|j, at| {
            let vr = &v[at + c..at + c + 8 * R]; // this tile of value row j, bound-checked
            let p = _mm256_set1_ps(scores[j]);
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: `8 r + 8 <= 8 R = vr.len()`.
                *a = _mm256_fmadd_ps(p, unsafe { _mm256_loadu_ps(vr.as_ptr().add(8 * r)) }, *a);
            }
        });
        let inv = _mm256_set1_ps(inv);
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: `8 r + 8 <= 8 R = out.len()` (asserted by the slice below).
            unsafe { _mm256_storeu_ps(out[8 * r..8 * r + 8].as_mut_ptr(), _mm256_mul_ps(*a, inv)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::qdot::tests::Rng;

    /// Dense attention in f64 over the keys `rows` lists (test reference).
    fn dense(q: &[f32], k: &[f32], v: &[f32], rows: &[usize], scale: f32) -> Vec<f64> {
        let d = q.len();
        let sc: Vec<f64> = rows
            .iter()
            .map(|&at| {
                (0..d)
                    .map(|t| f64::from(q[t]) * f64::from(k[at + t]))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..d)
            .map(|t| {
                rows.iter()
                    .zip(&e)
                    .map(|(&at, p)| p * f64::from(v[at + t]))
                    .sum::<f64>()
                    / z
            })
            .collect()
    }

    /// Every level, head sizes that fit 16 lanes, only 8, and neither, contexts that end inside
    /// and at the end of a block, against an f64 dense reference over the same paged rows.
    #[test]
    fn every_level_matches_dense_attention_over_paged_keys() {
        let mut rng = Rng::new(11);
        for &level in Level::available() {
            for d in [8usize, 12, 24, 64, 80] {
                for len in [1usize, 5, 16, 37, 100] {
                    let (bs, kvh, g) = (16usize, 3usize, 1usize);
                    let stride = kvh * d;
                    let num_blocks = 9;
                    let k: Vec<f32> = (0..num_blocks * bs * stride).map(|_| rng.f32()).collect();
                    let v: Vec<f32> = (0..num_blocks * bs * stride).map(|_| rng.f32()).collect();
                    let q: Vec<f32> = (0..d).map(|_| 2.0 * rng.f32()).collect();
                    let table = [4u32, 1, 5, 8, 0, 2, 7];
                    let keys = KeyRows {
                        table: &table,
                        block_size: bs,
                        stride,
                        offset: g * d,
                        len,
                    };
                    let rows: Vec<usize> = (0..len)
                        .map(|j| (table[j / bs] as usize * bs + j % bs) * stride + g * d)
                        .collect();
                    let want = dense(&q, &k, &v, &rows, 0.3);
                    let mut out = vec![f32::NAN; d];
                    let mut scores = vec![f32::NAN; 3];
                    attend_at(level, &q, &k, &v, keys, 0.3, &mut scores, &mut out);
                    for t in 0..d {
                        assert!(
                            (f64::from(out[t]) - want[t]).abs() < 2e-6,
                            "{level:?} d={d} len={len} [{t}]: {} vs {}",
                            out[t],
                            want[t]
                        );
                    }
                }
            }
        }
    }
}
