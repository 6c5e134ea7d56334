//! The sizes of one matrix product, the key under which the product paths (`gemm`, `det_gemv`)
//! cache their per-shape choices.

/// Sizes of a product `out[n, m] = x[n, k] @ w[m, k]^T` (for the SwiGLU GEMV, `m` is the output
/// width `f`: the weight has `2 * f` rows). Rows of `x` and `w` lie `ld` elements apart: `ld == k`
/// for a whole product, `ld > k` for one part of a K-split product (deterministic mode, `gemm.rs`),
/// which reduces `k` of each row's `ld` columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ProductDims {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) m: usize,
    pub(super) ld: usize,
}

impl ProductDims {
    /// A whole product: rows `k` elements apart.
    pub(super) fn new(n: usize, k: usize, m: usize) -> Self {
        Self { n, k, m, ld: k }
    }

    /// The weight operand as this product reads it (the key of per-shape algorithm choices).
    pub(super) fn weight(&self) -> WeightSlice {
        WeightSlice {
            m: self.m,
            k: self.k,
            ld: self.ld,
        }
    }
}

/// A weight operand as a product reads it: `m` rows of `k` columns, `ld` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct WeightSlice {
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) ld: usize,
}

impl std::fmt::Display for WeightSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let WeightSlice { m, k, ld } = *self;
        if ld == k {
            write!(f, "{m}x{k}")
        } else {
            write!(f, "{m}x{k} (rows {ld} apart)")
        }
    }
}
