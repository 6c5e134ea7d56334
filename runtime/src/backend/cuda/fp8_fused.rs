//! FP8 products of few rows that quantize their own input: `fp8_small_q_*` (a product) and
//! `fp8_swiglu_small_q_*` (the gate/up product with SwiGLU applied), in `kernels/cuda/fp8.cu`.
//!
//! Design: at batch 1 an FP8 layer ran four `quantize_rows` launches and one SiLU-mul between
//! its products, each a launch the product after it waits on. These kernels read the producer's
//! f32 or bf16 rows themselves (every CTA quantizes the same `n <= 8` rows into its shared memory
//! with `quantize_rows_vec`'s arithmetic, after issuing its first weight loads) and then multiply
//! exactly as `fp8_gemm_small_1` does, so their outputs are the bits of quantize + the 8-warp
//! small-M product (+ `silu_mul`), checked in `fp8_tests.rs`. They apply where
//! [`super::CudaTuning::fp8_fused_max_rows`] allows and the quantized rows fit
//! [`FUSED_MAX_BYTES`] of shared memory; other products keep [`super::fp8`]'s paths. That
//! setting is 0 by default since the RMSNorm and SwiGLU write one-row inputs quantized too
//! ([`super::fp8_inputs`]), which ran the batch-1 step faster on an H100 (`kernels/docs/fp8.md`,
//! FP8); these kernels stay for `SOV_FP8_FUSED_ROWS=1..8`.

use cudarc::driver::LaunchConfig;
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::fp8::scales_offset;
use super::ops::to_i32;
use super::pdl::arg;
use super::tuning::FP8_FUSED_LIMIT;
use crate::backend::{BackendError, DType, SwiGluShape, check_buffer};

/// Most bytes of quantized input (`n * k`) a fused CTA holds in shared memory (with its 4.2 KiB
/// of static shared memory, under the 48 KiB a launch gets without opting in).
pub(super) const FUSED_MAX_BYTES: usize = 32 * 1024;
/// Threads of a fused CTA (`32 * SMALL_WARPS` in `fp8.cu`).
const FUSED_THREADS: u32 = 256;

impl CudaBackend {
    /// Whether an FP8 product of `n` rows of `k` runs on a fused kernel: `1 <= n <=`
    /// [`super::CudaTuning::fp8_fused_max_rows`] (at most 8), `k % 16 == 0` and `n * k <=`
    /// [`FUSED_MAX_BYTES`].
    pub(super) fn fp8_fused_applies(&self, n: usize, k: usize) -> bool {
        n >= 1
            && n <= self.tuning.fp8_fused_max_rows.min(FP8_FUSED_LIMIT)
            && k.is_multiple_of(16)
            && n * k <= FUSED_MAX_BYTES
    }

    /// `out[n, m] = x[n, k] @ w^T` for an FP8 weight `w` on `fp8_small_q_*` (the caller checked
    /// the buffers, the weight's scales and [`Self::fp8_fused_applies`]).
    pub(super) fn matmul_fp8_fused(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        (n, k, m): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let name = match x.dtype {
            DType::BF16 => "fp8_small_q_bf16",
            _ => "fp8_small_q_f32",
        };
        let sw = w.ptr() + scales_offset(m * k) as u64;
        // SAFETY: the caller checked x (n*k of its dtype), w (m*k e4m3 and m scales), out (n*m
        // f32) and the fused conditions; the grid covers the m rows 16 a CTA.
        unsafe { self.launch_fused(name, out, x, (w.ptr(), sw), (n, k, m), m.div_ceil(16)) }
    }

    /// `out = silu(x @ Wg^T) * (x @ Wu^T)` for an FP8 `w = [Wg; Wu]` (`2f` rows) in one
    /// `fp8_swiglu_small_q_*` launch: the bits of the product into a gate/up buffer followed by
    /// `silu_mul`. `out: [n, f]` f32 or bf16.
    pub(super) fn matmul_silu_mul_fp8_fused(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        shape: SwiGluShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul_silu_mul (fp8)";
        let SwiGluShape { n, k, f } = shape;
        let xt = input_dtype(x);
        check_buffer(OP, "x", x, xt, n * k)?;
        check_buffer(OP, "w", w, DType::F8E4M3, 2 * f * k)?;
        let ot = input_dtype(out);
        check_buffer(OP, "out", out, ot, n * f)?;
        if w.mem.len() < scales_offset(2 * f * k) + 8 * f {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!("w holds no scales for {} rows", 2 * f),
            });
        }
        if !self.fp8_fused_applies(n, k) || f == 0 {
            return Err(BackendError::Unsupported(format!(
                "the fused FP8 SwiGLU product of {n}x{k} @ {}x{k}^T",
                2 * f
            )));
        }
        let name = format!(
            "fp8_swiglu_small_q_{}_{}",
            dtype_suffix(xt),
            dtype_suffix(ot)
        );
        let sw = w.ptr() + scales_offset(2 * f * k) as u64;
        // SAFETY: checked above: x n*k of its dtype, w 2f*k e4m3 and 2f scales, out n*f of its
        // dtype; the grid covers the f columns 8 a CTA.
        unsafe { self.launch_fused(&name, out, x, (w.ptr(), sw), (n, k, f), f.div_ceil(8)) }
    }

    /// Launches the fused kernel `name` on (out, x, qw, sw, n, k, m) with `ctas` CTAs and `n * k`
    /// bytes of dynamic shared memory, overlapping the kernel before it; `(qw, sw)` are the
    /// weight's codes and scales.
    ///
    /// # Safety
    /// The buffers must hold what kernel `name` reads and writes for these sizes (see its
    /// comment in `fp8.cu`), and [`Self::fp8_fused_applies`]`(n, k)` must hold.
    unsafe fn launch_fused(
        &self,
        name: &str,
        out: &mut CudaBuffer,
        x: &CudaBuffer,
        (qw, sw): (u64, u64),
        (n, k, m): (usize, usize, usize),
        ctas: usize,
    ) -> Result<(), BackendError> {
        let f = self.modules.function(KernelId::Fp8, None, name)?;
        let (o, xp) = (out.ptr(), x.ptr());
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(m, "m")?);
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(ctas)
                    .map_err(|_| BackendError::Unsupported(format!("{ctas} CTAs")))?,
                1,
                1,
            ),
            block_dim: (FUSED_THREADS, 1, 1),
            // n * k <= FUSED_MAX_BYTES (the caller's contract).
            shared_mem_bytes: (n * k) as u32,
        };
        let mut params = [
            arg(&o),
            arg(&xp),
            arg(&qw),
            arg(&sw),
            arg(&ni),
            arg(&ki),
            arg(&mi),
        ];
        // SAFETY: the parameters are the kernel's (out, x, qw, sw, n, k, m), alive for the call;
        // the sizes are the caller's contract; the kernel reads only weights before its wait.
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }
    }
}

/// The dtype an activation buffer of the fused kernels holds: bf16, or f32 for anything else
/// (which `check_buffer` then refuses if it is not f32).
fn input_dtype(b: &CudaBuffer) -> DType {
    if b.dtype == DType::BF16 {
        DType::BF16
    } else {
        DType::F32
    }
}

fn dtype_suffix(d: DType) -> &'static str {
    if d == DType::BF16 { "bf16" } else { "f32" }
}
