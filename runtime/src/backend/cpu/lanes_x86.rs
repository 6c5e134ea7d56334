//! AVX lane helpers shared by the x86-64 dot kernels (`dense_dot`'s AVX2 module and `qdot_x86`).
//!
//! Design: free functions with the same `target_feature` set as their callers, so they inline
//! into them; nothing here is a kernel.

use std::arch::x86_64::*;

/// Sum of the eight lanes of `v`: the two halves added, then pairs, then the last two (the order
/// both kernels' results were checked with).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum256(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
