//! Matrix products through cuBLAS: bf16 operands, f32 accumulation, f32 output.
//!
//! `out[n, m] = x[n, k] @ w[m, k]^T` with row-major buffers is, in cuBLAS's column-major terms,
//! `C[m, n] = op(W)[m, k] · X[k, n]` with `W` transposed (`lda = k`), `X` as stored (`ldb = k`),
//! `ldc = m`. The f32 input is first rounded to bf16 into a reusable scratch buffer (fast mode), or
//! (precise mode, [`CudaBackend::with_precise`]) split into `hi + lo` bf16 terms multiplied by
//! two GEMMs accumulating into the same f32 output: f32-input accuracy, weights read twice.
//! Where the producer of the input already wrote it in bf16 ([`CudaBackend::matmul_input_dtype_impl`],
//! the model's normed rows and SwiGLU output at more than one row), cuBLAS reads it as it is: no
//! cast kernel, the same values (op loop at batch 256: 11.99 -> 11.60 ms a step,
//! bf16-product-inputs-fixed-bench-2026-11-30T0401.log, not kept).
//! In fast mode a product of one row (decode at batch 1; up to four with
//! [`super::CudaTuning::gemv_max_rows`]) goes to
//! `gemv.cu` instead: the same bf16 products, no cast kernel in front, weights streamed with many
//! loads in flight, each row over as many warps as keep the grid in one wave. On the H200
//! (`bench_decode_matmuls`, kernels/bench/logs/gpu-check-2026-11-30T0328-full.log) it beats
//! cuBLAS-with-cast at one row on every Llama-3-8B decode shape: qkv 14.5 vs 20.6 us, o 9.7 vs
//! 20.7, gate_up 58.7 vs 65.2, down 29.4 vs 36.8, lm head 242.9 vs 265.2.
//! In deterministic mode ([`super::CudaTuning::deterministic`]) there is no GEMV: every product,
//! of any row count, takes bf16 inputs and runs through cuBLASLt ([`super::gemm_pinned`]) with an
//! algorithm that does not split K: the heuristic's first such one for its row count, where that
//! one and the weight shape's pinned algorithm both gave the bits of the reference chain
//! (`det_mma_16` in `gemv.cu`) on a probe product, else the pinned one. Every algorithm used gives
//! the same bits, so a row's result does not depend on the rows beside it. Products of up to 16
//! rows may instead run on sov's own kernels of the same bits where they are faster
//! ([`super::det_gemv`]). Weights with `k >= 2m` (the down projection) are reduced in two fixed
//! halves of K, each such a chain, added in one order ([`super::det_split`]).
//! A weight stored in FP8 (`--quantization fp8`, [`crate::backend::DType::F8E4M3`]) goes to the
//! FP8 W8A8 path instead ([`super::fp8`]), at any row count.

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, grid_for};
use super::driver_error::driver_err;
use super::gemm_pinned::{CANDIDATE_LAUNCH_ROWS, PinnedGemm};
use super::ops::to_i32;
use super::pdl::arg;
use super::product_dims::{ProductDims, WeightSlice};
use crate::backend::{BackendError, DType, SwiGluShape, check_buffer};

/// Most rows of x the GEMV kernel takes (`GEMV_MAX_N` in `gemv.cu`).
const GEMV_MAX_N: usize = 4;
/// Warps (output columns) per CTA of the GEMV kernel (`GEMV_WARPS` in `gemv.cu`).
const GEMV_WARPS: usize = 8;
/// CTAs per SM the one-row GEMV kernels are compiled for (`ROW_MIN_BLOCKS` in `gemv.cu`).
const GEMV_CTAS_PER_SM: usize = 8;

/// Warps (8 weight rows each) per CTA of `det_mma_16`.
const DET_WARPS_PER_CTA: usize = 2;
/// Rows of the probe product that decides a weight shape's reference-chain verdict.
const DET_PROBE_ROWS: usize = 16;

/// Element `i` of the probe input as bf16 bits: random sign and magnitude (0.5..1.5) * 2^(-4..3),
/// from a fixed hash of `i` (the same in every process).
fn probe_bf16(i: u64) -> u16 {
    let mut z = i
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(0x1234_5678);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let mantissa = (z & 0x7f) as u16; // 7 bits
    let exponent = (127 - 4 + ((z >> 7) & 7)) as u16; // 2^-4 .. 2^3
    let sign = ((z >> 10) & 1) as u16;
    (sign << 15) | (exponent << 7) | mantissa
}

/// Warps per weight row for a product of `rows` rows on `sm_count` SMs: the most (up to 8) whose
/// grid still fits in one wave of [`GEMV_CTAS_PER_SM`] CTAs per SM. A product of few rows then has
/// more warps streaming (Llama-3-8B's o and down: 2 warps a row, 11.1 -> 9.5 us and 30.8 -> 29.1 us
/// on the H200), and one that already fills the GPU keeps one warp a row (qkv at 2 warps a row
/// needed 1.45 waves: 14.5 -> 16.4 us).
fn auto_gemv_split(rows: usize, sm_count: usize) -> usize {
    let wave = GEMV_CTAS_PER_SM * sm_count.max(1);
    let mut split = 1;
    while split < GEMV_WARPS && (rows * split * 2).div_ceil(GEMV_WARPS) <= wave {
        split *= 2;
    }
    split
}

impl CudaBackend {
    /// Grows the bf16 copy of matmul inputs to hold `n` rows of `k` (two terms each in precise
    /// mode), bumping the scratch generation when it reallocates.
    pub(super) fn reserve_matmul_scratch(&self, n: usize, k: usize) -> Result<(), BackendError> {
        if self.fp8.is_some() {
            self.reserve_fp8_scratch(n, k)?;
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
        Ok(())
    }

    /// `out = x @ w^T` (see the module doc). `x: [n, k]` f32 or bf16, `w: [m, k]` bf16,
    /// `out: [n, m]` f32. A bf16 `x` (from a producer that wrote [`Self::matmul_input_dtype_impl`])
    /// goes to cuBLAS as it is; an f32 one to the GEMV or through the cast (or, precise, the split).
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
        if w.dtype == DType::F8E4M3 {
            return self.matmul_fp8(x, w, out, (n, k, m), super::fp8::Fp8Path::Auto);
        }
        let x_bf16 = x.dtype == DType::BF16;
        check_buffer(
            OP,
            "x",
            x,
            if x_bf16 { DType::BF16 } else { DType::F32 },
            n * k,
        )?;
        check_buffer(OP, "w", w, DType::BF16, m * k)?;
        check_buffer(OP, "out", out, DType::F32, n * m)?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        let dims = ProductDims::new(n, k, m);
        if x_bf16 {
            // Exact in bf16, so also what precise mode's hi term would be (its lo term is zero).
            return self.gemm_bf16_f32(x.ptr(), w.ptr(), out.ptr(), dims, 0.0);
        }
        if self.gemv_applies(n, k) {
            return self.gemv(x, w, out, dims);
        }
        self.reserve_matmul_scratch(n, k)?;
        let scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        let Some(xb) = scratch.x_bf16.as_ref() else {
            return Err(BackendError::Device("matmul scratch missing".into()));
        };
        if self.precise {
            let (hi, lo) = (xb.ptr(), xb.ptr_at(n * k));
            self.split_f32_bf16(x.ptr(), hi, lo, n * k)?;
            self.gemm_bf16_f32(hi, w.ptr(), out.ptr(), dims, 0.0)?;
            self.gemm_bf16_f32(lo, w.ptr(), out.ptr(), dims, 1.0)
        } else {
            self.cast_f32_bf16(x.ptr(), xb.ptr(), n * k)?;
            self.gemm_bf16_f32(xb.ptr(), w.ptr(), out.ptr(), dims, 0.0)
        }
    }

    /// [`crate::backend::Backend::matmul_input_dtype`]: bf16 for products cuBLAS multiplies in
    /// bf16 (fast mode, more rows than the GEMV takes), f32 for the GEMV (which reads f32 and
    /// rounds as it multiplies) and in precise mode (whose products keep f32 inputs).
    pub(super) fn matmul_input_dtype_impl(&self, rows: usize) -> DType {
        if self.tuning.deterministic && !self.precise {
            return DType::BF16;
        }
        if self.bf16_inputs && !self.precise && rows > self.tuning.gemv_max_rows.min(GEMV_MAX_N) {
            DType::BF16
        } else {
            DType::F32
        }
    }

    /// Whether a product of `n` rows with inner dimension `k` goes to `gemv.cu` (fast mode, few
    /// rows, 16-byte weight rows).
    fn gemv_applies(&self, n: usize, k: usize) -> bool {
        !self.precise
            && !self.tuning.deterministic
            && n <= self.tuning.gemv_max_rows.min(GEMV_MAX_N)
            && k.is_multiple_of(8)
    }

    /// `out = silu(x @ Wg^T) * (x @ Wu^T)` for `w = [Wg; Wu]` (see
    /// [`crate::backend::Backend::matmul_silu_mul`]): one fused GEMV where the GEMV applies, one
    /// fused FP8 product for an FP8 weight where [`Self::fp8_fused_applies`] (`fp8_fused.rs`),
    /// otherwise the product into `gate_up` (in bf16 where [`Self::gate_up_bf16`] applies) and
    /// `silu_mul`.
    pub(super) fn matmul_silu_mul_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        gate_up: &mut CudaBuffer,
        out: &mut CudaBuffer,
        shape: SwiGluShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul_silu_mul";
        let SwiGluShape { n, k, f } = shape;
        let fused = self.gemv_applies(n, k)
            && w.dtype == DType::BF16
            && n > 0
            && f > 0
            && x.dtype == DType::F32
            && out.dtype == DType::F32;
        // The fused FP8 kernel reads raw rows and writes f32 or bf16: quantized rows in or out
        // (`fp8_inputs.rs`; the down product's `takes_quantized_rows` does not see this product's
        // k) take the product and `silu_mul` below.
        if w.dtype == DType::F8E4M3
            && f > 0
            && self.fp8_fused_applies(n, k)
            && x.dtype != DType::F8E4M3
            && out.dtype != DType::F8E4M3
        {
            return self.matmul_silu_mul_fp8_fused(x, w, out, shape);
        }
        if !fused {
            if let Some(rows) = self.gate_up_bf16(x, w, gate_up, (n, k, 2 * f))? {
                // SAFETY: the product just wrote n*2f bf16 at rows.ptr, inside gate_up.
                return unsafe { self.silu_mul_from(rows, out, n, f) };
            }
            self.matmul_impl(x, w, gate_up, n, k, 2 * f)?;
            return self.silu_mul_impl(gate_up, out, n, f);
        }
        check_buffer(OP, "x", x, DType::F32, n * k)?;
        check_buffer(OP, "w", w, DType::BF16, 2 * f * k)?;
        check_buffer(OP, "out", out, DType::F32, n * f)?;
        let name = if n == 1 {
            "gemv_swiglu_1"
        } else {
            "gemv_swiglu"
        };
        // SAFETY: the SwiGLU kernels' arguments are (out, x, w, n, k, f) with w holding 2f rows;
        // the buffers were checked above.
        unsafe { self.launch_gemv(name, out, x, w, ProductDims::new(n, k, f)) }
    }

    /// `out = x @ w^T` for `n <= GEMV_MAX_N` rows with `gemv.cu` (weights streamed once), straight
    /// from the f32 `x` (`[n, k]`), which the kernel rounds to bf16 as the cuBLAS path does.
    fn gemv(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        dims: ProductDims,
    ) -> Result<(), BackendError> {
        // The one-row kernels (fewer registers, every CTA of a product resident at once): 4.26 vs
        // 4.57 ms a batch-1 Llama-3-8B step with the general kernel on the H200.
        let name = if dims.n == 1 {
            "gemv_bf16_1"
        } else {
            "gemv_bf16"
        };
        // SAFETY: both kernels take (out, x, w, n, k, m); the caller checked x: n*k f32, w: m*k
        // bf16, out: n*m f32.
        unsafe { self.launch_gemv(name, out, x, w, dims) }
    }

    /// Launches the `gemv.cu` kernel `name` on (out, x, w, n, k, units = `dims.m`) with
    /// [`super::CudaTuning::gemv_split`] warps per row.
    ///
    /// # Safety
    /// The buffers must hold what kernel `name` reads and writes for these sizes: x `n*k` f32,
    /// w `units*k` bf16 (`2*units*k` for the SwiGLU kernel), out `n*units` f32; `n <= GEMV_MAX_N`
    /// (exactly 1 for the `_1` kernels) and `k % 8 == 0`.
    unsafe fn launch_gemv(
        &self,
        name: &str,
        out: &mut CudaBuffer,
        x: &CudaBuffer,
        w: &CudaBuffer,
        dims: ProductDims,
    ) -> Result<(), BackendError> {
        let ProductDims { n, k, m: units, .. } = dims;
        let f = self.modules.function(KernelId::Gemv, None, name)?;
        // Warps per row: the SwiGLU kernels give each unit two warps (its gate and up rows).
        let split = if name.starts_with("gemv_swiglu") {
            1
        } else {
            self.tuning
                .gemv_split
                .unwrap_or_else(|| auto_gemv_split(units, self.sm_count))
        };
        let units_per_cta = if name.starts_with("gemv_swiglu") {
            GEMV_WARPS / 2
        } else {
            GEMV_WARPS / split
        };
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(units, "m")?);
        let si = to_i32(split, "split")?;
        let (o, xp, wp) = (out.ptr(), x.ptr(), w.ptr());
        let cfg = LaunchConfig {
            grid_dim: (units.div_ceil(units_per_cta) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params = [
            arg(&o),
            arg(&xp),
            arg(&wp),
            arg(&ni),
            arg(&ki),
            arg(&mi),
            arg(&si),
        ];
        // SAFETY: the parameters are the kernel's (out, x, w, n, k, units, split) in order, alive for the
        // call; the sizes are the caller's contract; before its wait for the prerequisites (on
        // every path, k == 0 included) each gemv.cu kernel reads only w, which no kernel writes.
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

    /// Deterministic mode's algorithm for a product of `dims.n` rows: the heuristic's first
    /// candidate for that many rows (at most [`CANDIDATE_LAUNCH_ROWS`]) that does not split K,
    /// where both it and the weight shape's pinned algorithm gave the bits of the reference chain
    /// (`det_mma_16` in `gemv.cu`: one m16n8k16 chain over K per element) on the probe product;
    /// else None, the pinned algorithm. Every algorithm used then gives the same bits, so a row's result does not
    /// depend on the row count that chose it. Each verdict is reached once per process, outside a
    /// stream capture; during one, an undecided case takes the pinned algorithm (the same bits
    /// where the verdict will be yes).
    pub(super) fn det_algo(
        &self,
        pinned: &PinnedGemm,
        w: u64,
        dims: ProductDims,
    ) -> Result<Option<cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>, BackendError> {
        let (n, shape) = (dims.n, dims.weight());
        if !shape.k.is_multiple_of(16) || !shape.ld.is_multiple_of(4) || !w.is_multiple_of(8) {
            return Ok(None);
        }
        let shape_ok = match pinned.chain_ok(shape)? {
            Some(v) => v,
            None if self.stream_capturing()? => return Ok(None),
            None => {
                let v = self.det_chain_probe(pinned, w, shape, None)?;
                pinned.set_chain_ok(shape, v)?;
                v
            }
        };
        if !shape_ok {
            return Ok(None);
        }
        let Some(cand) = pinned.candidate(shape, n.min(CANDIDATE_LAUNCH_ROWS))? else {
            return Ok(None);
        };
        match pinned.verified(shape, &cand)? {
            Some(ok) => Ok(ok.then_some(cand)),
            None if self.stream_capturing()? => Ok(None),
            None => {
                let ok = self.det_chain_probe(pinned, w, shape, Some(cand))?;
                pinned.set_verified(shape, &cand, ok)?;
                Ok(ok.then_some(cand))
            }
        }
    }

    /// Whether this backend's stream is being captured into a graph.
    pub(super) fn stream_capturing(&self) -> Result<bool, BackendError> {
        let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is this backend's, alive; `status` is a valid out-parameter.
        unsafe { cudarc::driver::sys::cuStreamIsCapturing(self.stream.cu_stream(), &mut status) }
            .result()
            .map_err(driver_err)?;
        Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The probe of weight shape `shape`: [`DET_PROBE_ROWS`] fixed rows of x (random signs and
    /// magnitudes 2^-4..2^4, the same in every process) times the weight at `w`, through `algo`
    /// (None: the pinned algorithm) and through `det_mma_16`, the reference chain; true if every
    /// bit agrees. A pinned algorithm that splits K, or a cuBLAS version whose kernels sum in
    /// another order, fails it (with a warning): the shape, or that candidate, then keeps the
    /// pinned algorithm for every row count.
    fn det_chain_probe(
        &self,
        pinned: &PinnedGemm,
        w: u64,
        shape: WeightSlice,
        algo: Option<cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>,
    ) -> Result<bool, BackendError> {
        let WeightSlice { m, k, ld } = shape;
        let split = pinned.pinned_split_k(shape)?;
        if algo.is_none() && split != Some(1) {
            tracing::warn!(
                "deterministic mode: the pinned cuBLASLt algorithm of {shape} splits K ({split:?}); \
                 its products keep cuBLASLt at every row count"
            );
            return Ok(false);
        }
        let rows = DET_PROBE_ROWS;
        let xs: Vec<u16> = (0..rows * ld).map(|i| probe_bf16(i as u64)).collect(); // [rows, ld]
        let x = self.upload_bytes(DType::BF16, bytemuck::cast_slice(&xs))?;
        let want = self.alloc_zeroed(DType::F32, rows * m)?; // [rows, m]
        let got = self.alloc_zeroed(DType::F32, rows * m)?; // [rows, m]
        let dims = ProductDims { n: rows, k, m, ld };
        // SAFETY: x holds rows*ld bf16, both outputs rows*m f32, w is the caller's weight of m
        // rows ld apart; all live until the downloads below, which wait for the stream.
        let ran = unsafe {
            pinned.matmul(
                self.stream.cu_stream() as _,
                (x.ptr(), w, want.ptr()),
                dims,
                0.0,
                algo,
            )
        };
        match ran {
            Ok(()) => {}
            // A candidate that refuses the probe's row count is simply not used.
            Err(e) if algo.is_some() => {
                tracing::warn!("deterministic mode: candidate algorithm for {shape} refused: {e}");
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        // SAFETY: as above; det_mma_16 takes 16 rows, k % 16 == 0 and w % 8 == 0 were checked by
        // the caller, x is a fresh (aligned) allocation.
        unsafe { self.launch_reference_chain(x.ptr(), w, got.ptr(), dims)? };
        let mut a = vec![0u8; rows * m * 4];
        let mut b = vec![0u8; rows * m * 4];
        self.download_raw(&want, 0, &mut a)?;
        self.download_raw(&got, 0, &mut b)?;
        let differ = a
            .chunks_exact(4)
            .zip(b.chunks_exact(4))
            .filter(|(p, q)| p != q)
            .count();
        if differ > 0 {
            tracing::warn!(
                "deterministic mode: cuBLASLt ({}) differs from the reference chain on {shape} \
                 at {differ} of {} elements; the shape keeps its pinned algorithm",
                if algo.is_some() {
                    "a per-row-count candidate"
                } else {
                    "the pinned algorithm"
                },
                rows * m
            );
        }
        Ok(differ == 0)
    }

    /// `out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T` through `det_mma_16` (`gemv.cu`), the
    /// reference chain the probe compares cuBLASLt with; rows of x and w `dims.ld` apart.
    ///
    /// # Safety
    /// `x`, `w`, `out` must be device addresses of `(n-1)*ld + k` bf16, `(m-1)*ld + k` bf16 and
    /// `n*m` f32 elements, live until the kernel has run; `n <= 16`, `k % 16 == 0`,
    /// `ld % 4 == 0`, x and w 8-byte aligned.
    pub(super) unsafe fn launch_reference_chain(
        &self,
        x: u64,
        w: u64,
        out: u64,
        dims: ProductDims,
    ) -> Result<(), BackendError> {
        let ProductDims { n, k, m, ld } = dims;
        if n > 16 {
            return Err(BackendError::Unsupported(format!(
                "the reference chain takes at most 16 rows, not {n}"
            )));
        }
        let f = self.modules.function(KernelId::Gemv, None, "det_mma_16")?;
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(m, "m")?);
        let ldi = to_i32(ld, "ld")?;
        let warps = m.div_ceil(8);
        let cfg = LaunchConfig {
            grid_dim: (
                to_i32(warps.div_ceil(DET_WARPS_PER_CTA), "grid")? as u32,
                1,
                1,
            ),
            block_dim: (32 * DET_WARPS_PER_CTA as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params = [
            arg(&out),
            arg(&x),
            arg(&w),
            arg(&ni),
            arg(&ki),
            arg(&mi),
            arg(&ldi),
        ];
        // SAFETY: the parameters are det_mma's (out, x, w, n, k, m, ld) in order, alive for the call;
        // the sizes are the caller's contract; before its wait for the prerequisites the kernel
        // reads only w, which no kernel writes.
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }
    }

    /// `out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16) + beta * out` at raw device addresses.
    fn gemm_bf16_f32(
        &self,
        x: u64,
        w: u64,
        out: u64,
        dims: ProductDims,
        beta: f32,
    ) -> Result<(), BackendError> {
        let ProductDims { n, k, m, .. } = dims;
        let to_dim = |v: usize| {
            i32::try_from(v).map_err(|_| BackendError::Unsupported(format!("matmul dimension {v}")))
        };
        let (mi, ni, ki) = (to_dim(m)?, to_dim(n)?, to_dim(k)?);
        if let Some(pinned) = &self.pinned {
            // SAFETY: as below (the caller's buffers, this backend's stream).
            return unsafe { self.det_product(pinned, (x, w, out), dims, beta) };
        }
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

#[cfg(test)]
mod tests {
    use super::auto_gemv_split;

    #[test]
    fn gemv_split_keeps_the_grid_in_one_wave() {
        // Llama-3-8B on 132 SMs (1056 CTAs of 8 warps in a wave).
        assert_eq!(auto_gemv_split(6144, 132), 1); // qkv: 768 CTAs
        assert_eq!(auto_gemv_split(4096, 132), 2); // o, down: 1024 CTAs
        assert_eq!(auto_gemv_split(28672, 132), 1); // gate_up: several waves anyway
        assert_eq!(auto_gemv_split(128256, 132), 1); // lm head
        assert_eq!(auto_gemv_split(64, 132), 8); // tiny products: every warp a share
        assert_eq!(auto_gemv_split(1000, 0), 1);
    }
}
