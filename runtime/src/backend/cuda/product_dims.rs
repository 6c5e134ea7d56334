//! The sizes of one matrix product, the key under which the product paths (`gemm`, `det_gemv`)
//! cache their per-shape choices.

/// Sizes of a product `out[n, m] = x[n, k] @ w[m, k]^T` (for the SwiGLU GEMV, `m` is the output
/// width `f`: the weight has `2 * f` rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ProductDims {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) m: usize,
}
