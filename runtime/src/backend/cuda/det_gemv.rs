//! Deterministic mode's products of few rows on sov's own kernels (`det_gemv_*` in `gemv.cu`,
//! listed in [`DET_GEMV_KERNELS`]), which give bit for bit the reference chain's result
//! (`det_mma_16`: one mma.sync m16n8k16 chain over K per element), as every split-K-1 cuBLASLt
//! algorithm the probe has checked does ([`super::gemm`]).
//!
//! Design: a product of at most [`DET_GEMV_MAX_ROWS`] rows whose weight shape passed the probe
//! takes, once per process, shape and row count, the fastest of cuBLASLt (the algorithm
//! `det_algo` chose) and the kernels, timed with CUDA events on the real operands into a
//! scratch output, each launch after a read of [`FLUSH_BYTES`] (`read_sweep`) that evicts the
//! operands from the L2 (in a decode step a weight is never in L2 either) and behind a stand-in
//! for the kernel before it in a step (`lead_spin`, [`super::CudaTuning::deterministic_lead_us`]):
//! a kernel of sov's, launched with programmatic dependent launch, issues its first weight copies
//! under it, as in the step, where cuBLASLt cannot (at one row on the H200 that moved qkv from
//! cuBLASLt to `det_gemv_32_k512`, and batch 1 from 209.6 to 222.0 tok/s); a kernel is taken only if it beats cuBLASLt by
//! [`super::CudaTuning::deterministic_kernel_margin`] percent. Every candidate gives the same bits, so another pick in another process (timing
//! noise, another GPU) changes no token. Decided outside graph captures only (a step is captured
//! after one eager run of it): an undecided product inside a capture takes cuBLASLt. Below compute
//! capability 9.0 (no bulk copies) every product stays on cuBLASLt.
//! On the H200 (2026-12-04, Llama-3-8B shapes, down in two parts of K, `det_split.rs`): at one
//! row o takes `det_gemv_16` (14.2 vs 22.6 us as timed here) and down `det_gemv_32_k512` (34.3
//! vs 68.6 us for cuBLASLt's two products), at 16 rows o `det_gemv_32` (19.3 vs 21.7 us) and down
//! `det_gemv_32_k512` (39.6-39.8 vs 51.0-55.7 us); qkv, gate/up and the lm head stay on cuBLASLt.
//! A product in two parts of K times its candidates that way: cuBLASLt as the two products, a
//! kernel as its one launch over both halves.
//! The eviction reads rather than writes: a memset (the first design) left the L2 full of dirty
//! lines that every candidate paid to write back, unevenly (down at 16 rows: cuBLASLt 55.8 vs 50.5
//! us alone under Nsight Compute, `det_gemv_32` 54.8 vs 42.6 back to back). The picks came out the
//! same but for which of the kernels; none of these single-launch times sees the overlap a
//! kernel's early weight copies get in a step (programmatic dependent launch), which cuBLASLt has
//! not.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::{DET_GEMV_KERNELS, DET_GEMV_MAX_ROWS, DetGemvKernel, KernelId};

use super::det_picks::SmallPick;
use super::device::{CudaBackend, grid_for};
use super::driver_error::driver_err;
use super::gemm_pinned::PinnedGemm;
use super::ops::to_i32;
use super::pdl::arg;
use super::product_dims::ProductDims;
use crate::backend::{BackendError, DType};

/// Bytes read before each timed launch so that no operand is in the L2 (50 MB on an H200).
const FLUSH_BYTES: usize = 128 << 20;
/// Timed launches per candidate (after one warm-up); the median counts.
const TIMED_LAUNCHES: usize = 5;

impl CudaBackend {
    /// The kernel that serves this deterministic product, or `None` for cuBLASLt (with `algo`,
    /// `det_algo`'s choice): see the module doc. `x` and `w` are device addresses; `dims` is one
    /// of the product's `split` parts along K (`det_split.rs`; 1: the whole product).
    pub(super) fn det_small_pick(
        &self,
        pinned: &PinnedGemm,
        algo: Option<cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>,
        x: u64,
        w: u64,
        dims: ProductDims,
        split: usize,
    ) -> Result<SmallPick, BackendError> {
        let ProductDims { n, k, ld, .. } = dims;
        // The bulk copies need 16-byte aligned rows and parts; the chain needs k in k16 steps.
        if n == 0
            || n > DET_GEMV_MAX_ROWS
            || !k.is_multiple_of(16)
            || !ld.is_multiple_of(8)
            || !x.is_multiple_of(16)
            || !w.is_multiple_of(16)
            || !(1..=2).contains(&split)
            || pinned.chain_ok(dims.weight())? != Some(true)
        {
            return Ok(None);
        }
        if let Some(pick) = self.det_picks.get(dims)? {
            return Ok(pick);
        }
        if self.stream_capturing()? {
            return Ok(None);
        }
        // The kernels' bulk copies and mbarriers need compute capability 9.0.
        let (major, _) = self.ctx.compute_capability().map_err(driver_err)?;
        let pick = if major >= 9 {
            self.time_small_candidates(pinned, algo, (x, w), dims, split)?
        } else {
            None
        };
        self.det_picks.set(dims, pick)?;
        Ok(pick)
    }

    /// Times cuBLASLt and each kernel on this product (see the module doc) and returns the pick.
    fn time_small_candidates(
        &self,
        pinned: &PinnedGemm,
        algo: Option<cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>,
        (x, w): (u64, u64),
        dims: ProductDims,
        split: usize,
    ) -> Result<SmallPick, BackendError> {
        let ProductDims { n, m, .. } = dims;
        let shape = dims.weight();
        // Without room for the timing buffers (a KV cache sized to fill the device), keep cuBLASLt.
        let buffers = self
            .alloc_zeroed(DType::F32, n * m)
            .and_then(|scratch| Ok((scratch, self.alloc_zeroed(DType::U32, FLUSH_BYTES / 4 + 4)?)));
        let (scratch, flush) = match buffers {
            Ok(b) => b, // [n, m] f32 output, [FLUSH_BYTES / 4 + 4] u32 (zeros, then the sink)
            Err(BackendError::OutOfMemory { bytes }) => {
                tracing::debug!(
                    "deterministic product {n} rows @ {shape} in {split}: no room to time the \
                     kernels ({bytes} bytes); cuBLASLt kept"
                );
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let out = scratch.ptr();
        let mut times = Vec::with_capacity(1 + DET_GEMV_KERNELS.len());
        for pick in std::iter::once(None).chain(DET_GEMV_KERNELS.iter().copied().map(Some)) {
            let mut launch = || match pick {
                // SAFETY: x and w hold the product's rows (the caller's contract), out n*m f32;
                // all live until the synchronisation in `median_ms`.
                None => unsafe { self.det_lt_parts(pinned, algo, (x, w, out), dims, 0.0, split) },
                // SAFETY: as above; the kernel's conditions were checked by the caller.
                Some(kernel) => unsafe {
                    self.launch_det_gemv(kernel, (x, w, out), dims, 0.0, split)
                },
            };
            match (self.median_ms(&flush, &mut launch), pick) {
                (Ok(ms), _) => times.push((pick, ms)),
                // A kernel the device cannot launch here (say, not enough shared memory at this
                // row count) is no candidate; cuBLASLt failing is an error.
                (Err(e), Some(kernel)) => {
                    tracing::debug!(
                        "deterministic product {n} rows @ {shape} in {split}: {} not launched: {e}",
                        kernel.name
                    )
                }
                (Err(e), None) => return Err(e),
            }
        }
        let cublas = times[0].1;
        let bound = cublas * (1.0 - self.tuning.deterministic_kernel_margin as f32 / 100.0);
        let pick = times[1..]
            .iter()
            .filter(|(_, t)| *t <= bound)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .and_then(|(p, _)| *p);
        let timed: Vec<String> = times
            .iter()
            .map(|(p, t)| format!("{} {t:.4} ms", p.map_or("cuBLASLt", |k| k.name)))
            .collect();
        tracing::debug!(
            "deterministic product {n} rows @ {shape} in {split}: {}; picked {}",
            timed.join(", "),
            pick.map_or("cuBLASLt", |p| p.name)
        );
        Ok(pick)
    }

    /// Median milliseconds of [`TIMED_LAUNCHES`] runs of `launch` (after one warm-up), each after
    /// a read of `flush` (`[FLUSH_BYTES / 4 + 4]` u32 zeros, see [`Self::evict_l2`]).
    fn median_ms(
        &self,
        flush: &super::CudaBuffer,
        launch: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<f32, BackendError> {
        launch()?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut times = Vec::with_capacity(TIMED_LAUNCHES);
        for _ in 0..TIMED_LAUNCHES {
            self.evict_l2(flush)?;
            let start = self.ctx.new_event(flags).map_err(driver_err)?;
            let end = self.ctx.new_event(flags).map_err(driver_err)?;
            start.record(&self.stream).map_err(driver_err)?;
            self.lead_spin()?;
            launch()?;
            end.record(&self.stream).map_err(driver_err)?;
            end.synchronize().map_err(driver_err)?;
            times.push(start.elapsed_ms(&end).map_err(driver_err)?);
        }
        times.sort_by(f32::total_cmp);
        Ok(times[TIMED_LAUNCHES / 2])
    }

    /// The stand-in (`lead_spin`, [`super::CudaTuning::deterministic_lead_us`]; nothing at 0)
    /// for the kernel a decode step runs before a product, launched the ordinary way; the
    /// candidate after it may launch under it if it is launched with programmatic dependent
    /// launch. The same for every candidate, so it adds the same time to each, less what a
    /// candidate overlaps it.
    fn lead_spin(&self) -> Result<(), BackendError> {
        let us = self.tuning.deterministic_lead_us;
        if us == 0 {
            return Ok(());
        }
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "lead_spin")?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ns = us * 1000;
        let mut params = [arg(&ns)];
        // SAFETY: the kernel takes one u32, alive for the call, and touches no memory.
        unsafe { self.launch_serial(&f, cfg, &mut params) }
    }

    /// Reads the first [`FLUSH_BYTES`] of `flush` (zeros, `[FLUSH_BYTES / 4 + 4]` u32) with
    /// `read_sweep`, whose sink (the last four words) the xor of zeros never matches.
    fn evict_l2(&self, flush: &super::CudaBuffer) -> Result<(), BackendError> {
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "read_sweep")?;
        let words = FLUSH_BYTES / 16;
        let cfg = LaunchConfig {
            grid_dim: (grid_for(words, 256).min(4096), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (src, sink, key) = (flush.ptr(), flush.ptr_at(FLUSH_BYTES / 4), 1u32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&src).arg(&words).arg(&key).arg(&sink);
        // SAFETY: `flush` holds FLUSH_BYTES / 4 + 4 u32 (the caller's allocation): the kernel reads
        // `words` 16-byte words from its start and may write one u32 at `sink`, past them.
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        Ok(())
    }

    /// `out[n, m] (f32) = x @ w^T (+ beta * out)` through `kernel`, over `split` consecutive
    /// parts of `dims.k` columns of rows `dims.ld` apart (1: one chain; 2: two halves added as
    /// `d1 + (d0 + beta * out)`, `det_split.rs`).
    ///
    /// # Safety
    /// `x`, `w`, `out` must be device addresses of `(n-1)*ld + split*k` bf16,
    /// `(m-1)*ld + split*k` bf16 and `n*m` f32 elements, live until the kernel has run;
    /// `1 <= n <= 16`, `k % 16 == 0`, `ld % 8 == 0`, x and w 16-byte aligned, `split` 1 or 2
    /// (2: compute capability 9.0, as every `det_gemv_*` launch).
    pub(super) unsafe fn launch_det_gemv(
        &self,
        kernel: DetGemvKernel,
        (x, w, out): (u64, u64, u64),
        dims: ProductDims,
        beta: f32,
        split: usize,
    ) -> Result<(), BackendError> {
        let ProductDims { n, k, m, ld } = dims;
        if !(1..=2).contains(&split) {
            return Err(BackendError::Unsupported(format!(
                "det_gemv takes K in 1 or 2 parts, not {split}"
            )));
        }
        let f = self.modules.function(KernelId::Gemv, None, kernel.name)?;
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(m, "m")?);
        let ldi = to_i32(ld, "ld")?;
        let cfg = LaunchConfig {
            grid_dim: (
                to_i32(m.div_ceil(kernel.rows_per_cta()), "grid")? as u32,
                split as u32,
                1,
            ),
            block_dim: (kernel.threads() as u32, 1, 1),
            shared_mem_bytes: kernel.shared_bytes(n) as u32,
        };
        let mut params = [
            arg(&out),
            arg(&x),
            arg(&w),
            arg(&ni),
            arg(&ki),
            arg(&mi),
            arg(&beta),
            arg(&ldi),
        ];
        // SAFETY: the parameters are the kernel's (out, x, w, n, k, m, beta, ld) in order, alive
        // for the call; the sizes are the caller's contract; the shared memory was allowed at
        // load (modules.rs, for 16 rows); before its wait for the prerequisites the kernel reads
        // only w, which no kernel writes. With two parts the grid is a whole number of clusters of
        // the two (its y dimension), as the kernel's exchange requires.
        unsafe {
            if split == 2 {
                self.launch_overlapping_in_clusters(&f, cfg, &mut params, (1, 2, 1))
            } else {
                self.launch_overlapping(&f, cfg, &mut params)
            }
        }
    }
}
