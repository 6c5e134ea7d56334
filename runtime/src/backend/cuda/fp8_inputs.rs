//! FP8 product inputs written quantized by their producers: the RMSNorm before the qkv and
//! gate/up products and the SwiGLU before the down product store e4m3 rows with one f32 scale
//! each, so no `quantize_rows` launch runs before those products.
//!
//! Design: a product whose input would be quantized in a launch of its own (an FP8 weight,
//! more rows than quantize their own input in `fp8_fused.rs`) takes quantized rows
//! ([`CudaBackend::takes_quantized_rows_impl`]); the model then asks for a buffer of them
//! ([`CudaBackend::alloc_quantized_rows_impl`]: `[rows * k]` e4m3 codes, then from byte
//! [`scales_offset`]`(n * k)` the `[n]` f32 scales of a step of `n <= rows` rows, the layout of
//! the FP8 input scratch) and hands it to the producer as its output. The `_e4m3` kernels of
//! `elementwise.cu` compute what the `_bf16` ones store and quantize each row as
//! `quantize_rows_vec_bf16` quantizes a bf16 row, so the product multiplies the same codes and
//! scales as with a bf16 row and its own quantization (`elementwise_e4m3_rows_equal_*` tests), with
//! one launch less and no bf16 row written and read again. Rows whose plain product input is f32
//! (decode steps of a few rows, [`CudaBackend::matmul_input_dtype_impl`]) take the `_f32_e4m3`
//! kernels: the f32 values, quantized as `quantize_rows_vec_f32` quantizes them.
//! [`CudaBackend::quantized_rows`] gives a product the two addresses.

use cudarc::driver::LaunchConfig;
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::fp8::scales_offset;
use super::ops::{GateUpRows, to_i32};
use super::pdl::arg;
use crate::backend::{BackendError, DType, InputProducer, RmsNorm, check_buffer};

/// Threads of a `silu_mul_e4m3` CTA: four fit an SM, so a wide step's rows overlap each other's
/// loads and reductions.
const SILU_Q_THREADS: u32 = 256;
/// The same where the rows are no more than the SMs (each row has an SM to itself, and its latency
/// is the step's). The values' bits do not depend on the CTA size (each is computed alone, and
/// the row's max is exact in any order).
const SILU_Q_THREADS_FEW_ROWS: u32 = 1024;
/// Longest row `silu_mul_e4m3` holds (`4 * SILU_Q_MAX_GROUPS` in `elementwise.cu`).
const SILU_Q_MAX_F: usize = 16384;

impl CudaBackend {
    /// [`crate::backend::Backend::takes_quantized_rows`]: a producer that
    /// [`super::CudaTuning::fp8_quantized_inputs`] names, an FP8 weight, more rows than the
    /// fused small-M kernels take, rows of 16-byte multiples (the products' alignment), and for
    /// the SwiGLU rows no longer than `silu_mul_e4m3` holds.
    pub(super) fn takes_quantized_rows_impl(
        &self,
        rows: usize,
        k: usize,
        w: &CudaBuffer,
        producer: InputProducer,
    ) -> bool {
        self.tuning.fp8_quantized_inputs.covers(producer)
            && w.dtype == DType::F8E4M3
            && rows > 0
            && k > 0
            && k.is_multiple_of(16)
            && (producer != InputProducer::SwiGlu || k <= SILU_Q_MAX_F)
            && !self.fp8_fused_applies(rows, k)
    }

    /// [`crate::backend::Backend::alloc_quantized_rows`]: `[rows * k]` e4m3 codes and room for
    /// `rows` f32 scales after them.
    pub(super) fn alloc_quantized_rows_impl(
        &self,
        rows: usize,
        k: usize,
    ) -> Result<CudaBuffer, BackendError> {
        let mut b = self.alloc_zeroed(DType::F8E4M3, scales_offset(rows * k) + 4 * rows)?;
        b.len = rows * k;
        Ok(b)
    }

    /// The codes and scales addresses of `n` quantized rows of `k` in `x` (checked to hold them).
    pub(super) fn quantized_rows(
        op: &'static str,
        x: &CudaBuffer,
        n: usize,
        k: usize,
    ) -> Result<(u64, u64), BackendError> {
        check_buffer(op, "x", x, DType::F8E4M3, n * k)?;
        let off = scales_offset(n * k);
        if x.mem.len() < off + 4 * n {
            return Err(BackendError::Shape {
                op,
                detail: format!("quantized rows hold no scales for {n} rows of {k}"),
            });
        }
        Ok((x.ptr(), x.ptr() + off as u64))
    }

    /// RMSNorm (after `residual += delta` when `delta` is not 0) into quantized rows `out`: the
    /// values of the form the rows' plain input would take (bf16 or f32,
    /// [`Self::matmul_input_dtype_impl`]). The delta is `[n, d]` bf16 where `delta_bf16`, else
    /// f32.
    pub(super) fn rms_norm_e4m3(
        &self,
        op: &'static str,
        (residual, delta, delta_bf16): (u64, u64, bool),
        norm: RmsNorm<'_, CudaBackend>,
        out: &mut CudaBuffer,
        (n, d): (usize, usize),
    ) -> Result<(), BackendError> {
        let (q, scales) = Self::quantized_rows(op, out, n, d)?;
        let name = match (self.matmul_input_dtype_impl(n), delta_bf16) {
            (DType::BF16, false) => "rmsnorm_residual_e4m3",
            (DType::BF16, true) => "rmsnorm_residual_e4m3_dbf16",
            (_, false) => "rmsnorm_residual_f32_e4m3",
            (_, true) => "rmsnorm_residual_f32_e4m3_dbf16",
        };
        let f = self.modules.function(KernelId::Elementwise, None, name)?;
        let di = to_i32(d, "d")?;
        let (w, eps) = (norm.weight.ptr(), norm.eps);
        let mut params = [
            arg(&q),
            arg(&scales),
            arg(&residual),
            arg(&delta),
            arg(&w),
            arg(&di),
            arg(&eps),
        ];
        // SAFETY: out holds n*d codes and n scales (checked above); residual, delta (or null) and
        // the weight were checked by the caller; the kernel waits for its prerequisites before
        // touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, super::ops::rms_norm_config(n, d), &mut params) }
    }

    /// SwiGLU of `gate_up` (`[n, 2f]` f32 or bf16) into quantized rows `out`: the values of the
    /// form the rows' plain input would take, as [`Self::rms_norm_e4m3`].
    ///
    /// # Safety
    /// `gate_up` must address `n * 2f` elements of its type, live until the launch has run.
    pub(super) unsafe fn silu_mul_e4m3(
        &self,
        gate_up: GateUpRows,
        out: &mut CudaBuffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "silu_mul";
        if !f.is_multiple_of(4) || f > SILU_Q_MAX_F {
            return Err(BackendError::Unsupported(format!(
                "quantized SwiGLU rows of {f} (a multiple of 4 up to {SILU_Q_MAX_F})"
            )));
        }
        let (q, scales) = Self::quantized_rows(OP, out, n, f)?;
        let name = match (gate_up.bf16, self.matmul_input_dtype_impl(n)) {
            (true, _) => "silu_mul_e4m3_from_bf16",
            (false, DType::BF16) => "silu_mul_e4m3",
            (false, _) => "silu_mul_f32_e4m3",
        };
        let func = self.modules.function(KernelId::Elementwise, None, name)?;
        let fi = to_i32(f, "f")?;
        let g = gate_up.ptr;
        let mut params = [arg(&q), arg(&scales), arg(&g), arg(&fi)];
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(n).map_err(|_| BackendError::Shape {
                    op: OP,
                    detail: format!("{n} rows"),
                })?,
                1,
                1,
            ),
            block_dim: (
                if n <= self.sm_count {
                    SILU_Q_THREADS_FEW_ROWS
                } else {
                    SILU_Q_THREADS
                },
                1,
                1,
            ),
            shared_mem_bytes: 0,
        };
        // SAFETY: out holds n*f codes and n scales (checked above), gate_up n*2f elements of
        // its type (the caller); f % 4 == 0 and f <= SILU_Q_MAX_F as the kernel needs. It waits for its
        // prerequisites before touching memory (super::pdl).
        unsafe { self.launch_overlapping(&func, cfg, &mut params) }
    }
}
