//! Dot products of one dense weight row (f32, f16 or bf16) with up to four f32 activation rows.
//!
//! The weight row is read once and widened to f32 on the fly, so 16-bit weights cost half the
//! memory traffic of f32 ones (decode on CPU is bound by memory bandwidth). An AVX2+FMA+F16C
//! kernel is chosen at run time when the CPU has those features; otherwise a portable kernel,
//! written in 8-wide chunks the compiler vectorizes, computes the same sums. Quantized rows are
//! [`super::qdot`]'s, which dots its decoded K-quant tiles here; [`super::dot`] dispatches between
//! the two.

use half::{bf16, f16};

/// One dense weight row.
#[derive(Debug, Clone, Copy)]
pub enum DenseRow<'a> {
    /// An f32 row.
    F32(&'a [f32]),
    /// An f16 row.
    F16(&'a [f16]),
    /// A bf16 row.
    BF16(&'a [bf16]),
}

impl DenseRow<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            DenseRow::F32(w) => w.len(),
            DenseRow::F16(w) => w.len(),
            DenseRow::BF16(w) => w.len(),
        }
    }

    /// True when the row holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32.
    fn get(&self, i: usize) -> f32 {
        match self {
            DenseRow::F32(w) => w[i],
            DenseRow::F16(w) => w[i].to_f32(),
            DenseRow::BF16(w) => w[i].to_f32(),
        }
    }
}

/// `out[r] = w . xs[r]` for `r < N` (`N <= 4`), over `w.len()` elements.
///
/// # Panics
/// When an activation row is shorter than `w` (a caller bug, never user input).
pub fn dense_dot_rows<const N: usize>(w: DenseRow<'_>, xs: &[&[f32]; N]) -> [f32; N] {
    for x in xs {
        assert!(x.len() >= w.len(), "activation row shorter than weight row");
    }
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above), and every activation
            // row holds at least `w.len()` elements (asserted above), which is all the kernel reads.
            return unsafe { avx2::dot_rows(w, xs) };
        }
    }
    dense_dot_rows_portable(w, xs)
}

/// Whether the AVX2 kernels can run (cached by `std` after the first call).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Portable kernel: 8-wide partial sums the compiler turns into vector code.
pub fn dense_dot_rows_portable<const N: usize>(w: DenseRow<'_>, xs: &[&[f32]; N]) -> [f32; N] {
    let k = w.len();
    let mut acc = [[0f32; 8]; N];
    let mut wbuf = [0f32; 8];
    let full = k / 8 * 8;
    let mut i = 0;
    while i < full {
        match w {
            DenseRow::F32(w) => wbuf.copy_from_slice(&w[i..i + 8]),
            DenseRow::F16(w) => {
                for (d, s) in wbuf.iter_mut().zip(&w[i..i + 8]) {
                    *d = s.to_f32();
                }
            }
            DenseRow::BF16(w) => {
                for (d, s) in wbuf.iter_mut().zip(&w[i..i + 8]) {
                    *d = s.to_f32();
                }
            }
        }
        for (a, x) in acc.iter_mut().zip(xs) {
            for l in 0..8 {
                a[l] += wbuf[l] * x[i + l];
            }
        }
        i += 8;
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = acc[r].iter().sum();
        for (j, x) in xs[r].iter().enumerate().take(k).skip(full) {
            out[r] += w.get(j) * x;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::DenseRow;
    use crate::backend::cpu::lanes_x86::hsum256;

    macro_rules! dot_kernel {
        ($name:ident, $elem:ty, $load:expr) => {
            /// AVX2 kernel for one weight dtype: two 8-wide accumulators per activation row.
            ///
            /// # Safety
            /// The CPU supports AVX2, FMA and F16C; every `xs[r]` holds at least `w.len()` elements.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $name<const N: usize>(w: &[$elem], xs: &[&[f32]; N]) -> [f32; N] {
                let k = w.len();
                let wp = w.as_ptr();
                let mut acc0 = [_mm256_setzero_ps(); N];
                let mut acc1 = [_mm256_setzero_ps(); N];
                let mut i = 0;
                while i + 16 <= k {
                    // SAFETY: `i + 16 <= k`, so both 8-element loads are inside `w`.
                    let (w0, w1) = unsafe { ($load(wp.add(i)), $load(wp.add(i + 8))) };
                    for r in 0..N {
                        // SAFETY: `xs[r]` holds at least `k >= i + 16` elements (caller contract).
                        let (x0, x1) = unsafe {
                            let xp = xs[r].as_ptr();
                            (_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(xp.add(i + 8)))
                        };
                        acc0[r] = _mm256_fmadd_ps(w0, x0, acc0[r]);
                        acc1[r] = _mm256_fmadd_ps(w1, x1, acc1[r]);
                    }
                    i += 16;
                }
                let mut out = [0f32; N];
                for r in 0..N {
                    out[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
                }
                while i < k {
                    let wv = DenseRow::from(&w[i..i + 1]).get(0);
                    for r in 0..N {
                        out[r] += wv * xs[r][i];
                    }
                    i += 1;
                }
                out
            }
        };
    }

    /// Loads 8 f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements at `p`.
        unsafe { _mm256_loadu_ps(p) }
    }

    /// Loads 8 f16 and widens them (F16C).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const half::f16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements (16 bytes) at `p`.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    /// Loads 8 bf16 and widens them: bf16 is the top half of an f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bf16(p: *const half::bf16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements (16 bytes) at `p`.
        let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }

    dot_kernel!(dot_f32, f32, load_f32);
    dot_kernel!(dot_f16, half::f16, load_f16);
    dot_kernel!(dot_bf16, half::bf16, load_bf16);

    /// Dispatches on the weight dtype.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; every `xs[r]` holds at least `w.len()` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows<const N: usize>(w: DenseRow<'_>, xs: &[&[f32]; N]) -> [f32; N] {
        // SAFETY: forwarded caller contract.
        unsafe {
            match w {
                DenseRow::F32(w) => dot_f32(w, xs),
                DenseRow::F16(w) => dot_f16(w, xs),
                DenseRow::BF16(w) => dot_bf16(w, xs),
            }
        }
    }
}

impl<'a> From<&'a [f32]> for DenseRow<'a> {
    fn from(w: &'a [f32]) -> Self {
        DenseRow::F32(w)
    }
}

impl<'a> From<&'a [f16]> for DenseRow<'a> {
    fn from(w: &'a [f16]) -> Self {
        DenseRow::F16(w)
    }
}

impl<'a> From<&'a [bf16]> for DenseRow<'a> {
    fn from(w: &'a [bf16]) -> Self {
        DenseRow::BF16(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn reference(w: &[f32], x: &[f32]) -> f32 {
        w.iter()
            .zip(x)
            .map(|(a, b)| (*a as f64) * (*b as f64))
            .sum::<f64>() as f32
    }

    fn check<const N: usize>(k: usize) {
        let w32 = values(1, k);
        let w16: Vec<f16> = w32.iter().map(|v| f16::from_f32(*v)).collect();
        let wb16: Vec<bf16> = w32.iter().map(|v| bf16::from_f32(*v)).collect();
        let rows: Vec<Vec<f32>> = (0..N).map(|r| values(10 + r as u64, k)).collect();
        let xs: [&[f32]; N] = std::array::from_fn(|r| rows[r].as_slice());
        let cases: [(DenseRow<'_>, Vec<f32>); 3] = [
            (DenseRow::F32(&w32), w32.clone()),
            (
                DenseRow::F16(&w16),
                w16.iter().map(|v| v.to_f32()).collect(),
            ),
            (
                DenseRow::BF16(&wb16),
                wb16.iter().map(|v| v.to_f32()).collect(),
            ),
        ];
        for (w, wide) in cases {
            let fast = dense_dot_rows(w, &xs);
            let portable = dense_dot_rows_portable(w, &xs);
            for r in 0..N {
                let want = reference(&wide, &rows[r]);
                let tol = 1e-5 * (k as f32).sqrt().max(1.0);
                assert!(
                    (fast[r] - want).abs() < tol,
                    "k={k} r={r} {w:?}: {} vs {want}",
                    fast[r]
                );
                assert!(
                    (portable[r] - want).abs() < tol,
                    "k={k} r={r}: {} vs {want}",
                    portable[r]
                );
            }
        }
    }

    #[test]
    fn dense_dot_rows_matches_f64_reference_for_all_dtypes_and_tails() {
        for k in [1, 7, 8, 15, 16, 17, 64, 100, 576, 1031] {
            check::<1>(k);
            check::<2>(k);
            check::<3>(k);
            check::<4>(k);
        }
    }
}
