//! Deterministic mode's products with a fixed K split: the down projection (few output rows, a
//! reduction at least twice as long) reduces each half of K separately, at every row count.
//!
//! Design: batch invariance needs one reduction order per weight shape, whatever the row count; the
//! order need not be one chain over all of K. For a weight of `m` rows and `k >= 2m` columns (`k %
//! 32 == 0`) with [`super::CudaTuning::deterministic_k_split`] at 2, every element is `d1 + (d0 +
//! beta * out)`, where `d0` and `d1` are the reference chains (one mma.sync m16n8k16 chain,
//! `det_mma_16` in `gemv.cu`) over the first and the second half of K. cuBLASLt gives exactly that
//! as two split-K-1 products over the halves (rows `k` apart), the second with beta 1; the
//! small-row kernels (`det_gemv_*`) as one launch of twice the CTAs in clusters of the two halves,
//! which add in the same order (`gemv.cu`). Why: at 16 rows an unsplit down projection of
//! Llama-3-8B has 512 chains of 896 k16 steps and ran at 47-52 us (cuBLASLt's 64-CTA tile) where
//! the default mode splits K (34 us); split, `det_gemv_32_k512` takes it in 39.6-39.8 us. Measured
//! on the H200 (`kernels/docs/deterministic.md`, deterministic mode): batch 16 +6.7% / +10.4%
//! output tok/s against one chain, batch 64 -2.4%, 256 -1.1%, 1000 requests -1.4%, batch 1
//! unchanged. The o projection (`k == m`) was split too in a first version: it lost more at 64 and
//! 256 rows (two launches of 128 steps) than it gained at 16, so only `k >= 2m` splits. Products of
//! other shapes, and every product with the split at 1 (the order of runs whose precision does not
//! say `-ksplit2`), are one chain as before.

use super::device::CudaBackend;
use super::gemm_pinned::PinnedGemm;
use super::product_dims::ProductDims;
use crate::backend::BackendError;

impl CudaBackend {
    /// Parts along K of a deterministic product of weight shape `[m, k]`: 2 where the split
    /// applies (`k >= 2m`, `k % 32 == 0`, the split set to 2; see the module doc), else 1.
    pub(super) fn det_k_split(&self, k: usize, m: usize) -> usize {
        let split = self.tuning.deterministic_k_split;
        if split > 1 && k >= 2 * m && k.is_multiple_of(16 * split) {
            split
        } else {
            1
        }
    }

    /// Deterministic mode's `out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16) + beta * out`:
    /// per part of K (see the module doc), the small-row kernel the timing picked or cuBLASLt.
    ///
    /// # Safety
    /// `x`, `w`, `out` must be device addresses of `n*k` bf16, `m*k` bf16 and `n*m` f32 elements
    /// (`dims` a whole product, `ld == k`), live until the product has run on this stream.
    pub(super) unsafe fn det_product(
        &self,
        pinned: &PinnedGemm,
        (x, w, out): (u64, u64, u64),
        dims: ProductDims,
        beta: f32,
    ) -> Result<(), BackendError> {
        let split = self.det_k_split(dims.k, dims.m);
        let part = ProductDims {
            k: dims.k / split,
            ..dims
        };
        let algo = self.det_algo(pinned, w, part)?;
        if let Some(kernel) = self.det_small_pick(pinned, algo, x, w, part, split)? {
            // SAFETY: the caller's buffers; det_small_pick checked the kernel's conditions
            // (n <= 16, k % 16 == 0, 16-byte aligned x, w and parts).
            return unsafe { self.launch_det_gemv(kernel, (x, w, out), part, beta, split) };
        }
        // SAFETY: as above.
        unsafe { self.det_lt_parts(pinned, algo, (x, w, out), part, beta, split) }
    }

    /// The product through cuBLASLt: `split` products over consecutive parts of K (`part.k`
    /// columns each, rows `part.ld` apart), the first with `beta`, the others adding with beta 1.
    ///
    /// # Safety
    /// As [`Self::det_product`], for `split` parts of `part.k` columns.
    pub(super) unsafe fn det_lt_parts(
        &self,
        pinned: &PinnedGemm,
        algo: Option<cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>,
        (x, w, out): (u64, u64, u64),
        part: ProductDims,
        beta: f32,
        split: usize,
    ) -> Result<(), BackendError> {
        for p in 0..split {
            let offset = (p * part.k * 2) as u64; // bytes into each row of x and w
            let beta = if p == 0 { beta } else { 1.0 };
            // SAFETY: part p's columns lie inside the caller's rows; the product runs on this
            // backend's stream.
            unsafe {
                pinned.matmul(
                    self.stream.cu_stream() as _,
                    (x + offset, w + offset, out),
                    part,
                    beta,
                    algo,
                )
            }?;
        }
        Ok(())
    }
}
