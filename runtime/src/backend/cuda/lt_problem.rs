//! The cuBLASLt descriptors of one product, shared by the bf16 ([`super::gemm_pinned`]) and FP8
//! ([`super::gemm_fp8`]) paths.
//!
//! Design: sov's layout throughout ([`super::gemm`]): cuBLAS's column-major
//! `C[m, n] = op(W)[m, k] · X[k, n]` with `W` stored `[m, k]` row-major, read transposed (the "TN"
//! form Hopper's FP8 kernels require), `X` `[n, k]` row-major and `C` `[n, m]` row-major f32 (or,
//! for an FP8 product that asks for it, bf16: [`LtProblem::tn_into`]). The
//! descriptors are created together and destroyed on drop; a path adds its own attributes
//! (FP8 scales) through [`LtProblem::set_attr`].

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::{result as lt, sys};

use crate::backend::BackendError;

/// The matmul descriptor and the three matrix layouts of one product, destroyed on drop.
pub(super) struct LtProblem {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) a: sys::cublasLtMatrixLayout_t,
    pub(super) b: sys::cublasLtMatrixLayout_t,
    pub(super) c: sys::cublasLtMatrixLayout_t,
    /// How errors name the path (`cuBLASLt`, `cuBLASLt FP8`).
    label: &'static str,
}

impl LtProblem {
    /// `C[m, n]` (of type `output`, f32 compute) `= W^T · X` with `W: [k, m]` (ld k) and
    /// `X: [k, n]` (ld k), both of `input` type; `label` names the path in errors.
    pub(super) fn tn_into(
        mnk: (usize, usize, usize),
        input: sys::cudaDataType_t,
        output: sys::cudaDataType_t,
        label: &'static str,
    ) -> Result<Self, BackendError> {
        Self::tn_layouts(mnk, mnk.2, input, output, label)
    }

    /// As [`Self::tn_into`] (f32 `C`) with the columns of `W` and `X` `ld` elements apart (`ld >= k`: the first
    /// `k` of each row's `ld` elements, one part of a K-split product).
    pub(super) fn tn_strided(
        mnk: (usize, usize, usize),
        ld: usize,
        input: sys::cudaDataType_t,
        label: &'static str,
    ) -> Result<Self, BackendError> {
        Self::tn_layouts(mnk, ld, input, sys::cudaDataType_t::CUDA_R_32F, label)
    }

    /// The descriptors of [`Self::tn_strided`] with `C` of type `output`.
    fn tn_layouts(
        (m, n, k): (usize, usize, usize),
        ld: usize,
        input: sys::cudaDataType_t,
        output: sys::cudaDataType_t,
        label: &'static str,
    ) -> Result<Self, BackendError> {
        let err =
            |what: &str, e: lt::CublasError| BackendError::Device(format!("{label} {what}: {e:?}"));
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| err("matmul descriptor", e))?;
        // From here on, drop destroys what was created (null layouts are skipped).
        let mut p = LtProblem {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            label,
        };
        let trans: i32 = 1; // CUBLAS_OP_T (cublasOperation_t is a 32-bit enum)
        // SAFETY: the descriptor was just created; TRANSA takes a cublasOperation_t (an i32).
        unsafe {
            p.set_attr(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans,
            )?
        };
        let (m, n, k) = (m as u64, n as u64, k as u64);
        let ld = ld as i64;
        p.a = lt::create_matrix_layout(input, k, m, ld).map_err(|e| err("layout", e))?;
        p.b = lt::create_matrix_layout(input, k, n, ld).map_err(|e| err("layout", e))?;
        p.c = lt::create_matrix_layout(output, m, n, m as i64).map_err(|e| err("layout", e))?;
        Ok(p)
    }

    /// Sets one attribute of the matmul descriptor from a plain value.
    ///
    /// # Safety
    /// `T` must be the attribute's type (device pointers as `*const c_void`).
    pub(super) unsafe fn set_attr<T>(
        &self,
        attr: sys::cublasLtMatmulDescAttributes_t,
        value: &T,
    ) -> Result<(), BackendError> {
        // SAFETY: `self.desc` is live until drop; the caller's contract on `T`; `value` is alive
        // for the call and `size_of::<T>()` long.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.desc,
                attr,
                value as *const T as *const c_void,
                size_of::<T>(),
            )
        }
        .map_err(|e| BackendError::Device(format!("{} attribute {attr:?}: {e:?}", self.label)))
    }
}

impl Drop for LtProblem {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `LtProblem::tn_layouts` (null ones were not and are
        // skipped) and is destroyed once, here.
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}
