//! Matrix products through cuBLAS: bf16 operands, f32 accumulation, f32 output.
//!
//! `out[n, m] = x[n, k] @ w[m, k]^T` with row-major buffers is, in cuBLAS's column-major terms,
//! `C[m, n] = op(W)[m, k] · X[k, n]` with `W` transposed (`lda = k`), `X` as stored (`ldb = k`),
//! `ldc = m`. The f32 input is first rounded to bf16 into a reusable scratch buffer (fast mode), or
//! (precise mode, [`CudaBackend::with_precise`]) split into `hi + lo` bf16 terms multiplied by
//! two GEMMs accumulating into the same f32 output: f32-input accuracy, weights read twice.
//! In fast mode a product of one row (decode at batch 1; up to four with `SOV_GEMV=N`) goes to
//! `gemv.cu` instead: the same bf16 products, no cast kernel in front, weights streamed with many
//! loads in flight. On the H200 (`bench_decode_matmuls`) it beat cuBLAS-with-cast at one row on the
//! o, gate_up, down and lm-head shapes of Llama-3-8B (1.72x, 1.06x, 1.09x, 1.06x; qkv 0.90x).

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, driver_err, grid_for};
use super::ops::to_i32;
use crate::backend::{BackendError, DType, check_buffer};

/// Most rows of x the GEMV kernel takes (`GEMV_MAX_N` in `gemv.cu`).
const GEMV_MAX_N: usize = 4;
/// Warps (output columns) per CTA of the GEMV kernel (`GEMV_WARPS` in `gemv.cu`).
const GEMV_WARPS: usize = 8;

impl CudaBackend {
    /// `out = x @ w^T` (see the module doc). `x: [n, k]` f32, `w: [m, k]` bf16, `out: [n, m]` f32.
    pub(super) fn matmul_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul";
        check_buffer(OP, "x", x, DType::F32, n * k)?;
        check_buffer(OP, "w", w, DType::BF16, m * k)?;
        check_buffer(OP, "out", out, DType::F32, n * m)?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        let gemv = !self.precise && n <= self.gemv_max_rows.min(GEMV_MAX_N) && k.is_multiple_of(8);
        if gemv {
            return self.gemv(x, w, out, n, k, m);
        }
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        let terms = if self.precise { 2 } else { 1 };
        if scratch
            .x_bf16
            .as_ref()
            .is_none_or(|b| b.len < terms * n * k)
        {
            scratch.x_bf16 =
                Some(self.alloc_zeroed(DType::BF16, (terms * n * k).next_power_of_two())?);
            scratch.generation += 1;
        }
        let Some(xb) = scratch.x_bf16.as_ref() else {
            return Err(BackendError::Device("matmul scratch missing".into()));
        };
        if self.precise {
            let (hi, lo) = (xb.ptr(), xb.ptr_at(n * k));
            self.split_f32_bf16(x.ptr(), hi, lo, n * k)?;
            self.gemm_bf16_f32(hi, w.ptr(), out.ptr(), n, k, m, 0.0)?;
            self.gemm_bf16_f32(lo, w.ptr(), out.ptr(), n, k, m, 1.0)
        } else {
            self.cast_f32_bf16(x.ptr(), xb.ptr(), n * k)?;
            self.gemm_bf16_f32(xb.ptr(), w.ptr(), out.ptr(), n, k, m, 0.0)
        }
    }

    /// `out = x @ w^T` for `n <= GEMV_MAX_N` rows with `gemv.cu` (weights streamed once), straight
    /// from the f32 `x` (`[n, k]`), which the kernel rounds to bf16 as the cuBLAS path does.
    fn gemv(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        let f = self.modules.function(KernelId::Gemv, None, "gemv_bf16")?;
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(m, "m")?);
        let (o, xp, wp) = (out.ptr(), x.ptr(), w.ptr());
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params: [*mut c_void; 6] = [
            (&o as *const u64).cast_mut().cast(),
            (&xp as *const u64).cast_mut().cast(),
            (&wp as *const u64).cast_mut().cast(),
            (&ni as *const i32).cast_mut().cast(),
            (&ki as *const i32).cast_mut().cast(),
            (&mi as *const i32).cast_mut().cast(),
        ];
        // SAFETY: the parameters are gemv_bf16's (out, x, w, n, k, m) in order, alive for the call;
        // x holds n*k f32, w m*k bf16 with k % 8 == 0 (16-byte rows), out n*m f32 (checked by the
        // caller); n <= GEMV_MAX_N as the kernel requires; before its wait for the prerequisites
        // (on every path, k == 0 included) the kernel reads only w, which no kernel writes.
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }
    }

    /// Splits `len` f32 values at `src` into bf16 `hi` and `lo` terms.
    fn split_f32_bf16(&self, src: u64, hi: u64, lo: u64, len: usize) -> Result<(), BackendError> {
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "split_f32_bf16")?;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(len, 256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&hi).arg(&lo).arg(&src).arg(&len);
        // SAFETY: hi and lo hold >= len bf16, src >= len f32 (checked by the caller).
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        Ok(())
    }

    /// Rounds `len` f32 values at `src` into bf16 at `dst`.
    pub(super) fn cast_f32_bf16(&self, src: u64, dst: u64, len: usize) -> Result<(), BackendError> {
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "cast_f32_bf16")?;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(len, 256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&dst).arg(&src).arg(&len);
        // SAFETY: dst holds >= len bf16 and src >= len f32 (checked by the caller); the kernel
        // matches this argument list.
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        Ok(())
    }

    /// `out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16) + beta * out` at raw device addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_bf16_f32(
        &self,
        x: u64,
        w: u64,
        out: u64,
        n: usize,
        k: usize,
        m: usize,
        beta: f32,
    ) -> Result<(), BackendError> {
        let dims = |v: usize| {
            i32::try_from(v).map_err(|_| BackendError::Unsupported(format!("matmul dimension {v}")))
        };
        let (mi, ni, ki) = (dims(m)?, dims(n)?, dims(k)?);
        let alpha = 1.0f32;
        // SAFETY: the three addresses point at live buffers of at least m*k, n*k (bf16) and n*m
        // (f32) elements (checked by the caller); the handle is bound to this backend's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                mi,
                ni,
                ki,
                (&alpha) as *const f32 as *const c_void,
                w as *const c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                ki,
                x as *const c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                ki,
                (&beta) as *const f32 as *const c_void,
                out as *mut c_void,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                mi,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| BackendError::Device(format!("cuBLAS gemm ({n}x{k} @ {m}x{k}^T): {e:?}")))
    }
}
