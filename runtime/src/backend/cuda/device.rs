//! Opening a GPU: library probes, context, stream, cuBLAS handle, memory transfers.
//!
//! Design: a backend is opened with a [`CudaTuning`] value (the measured defaults, or what the
//! program's edge built) and keeps it; nothing here reads the environment.

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream, result, sys};

use super::buffer::CudaBuffer;
use super::det_picks::SmallPicks;
use super::driver_error::driver_err;
use super::gemm_fp8::{FP8_WORKSPACE_BYTES, Fp8Gemm};
use super::gemm_pinned::{PinnedGemm, WORKSPACE_BYTES};
use super::modules::ModuleCache;
use super::tuning::CudaTuning;
use super::tuning::Quantization;
use super::upload_ring::{STAGED_UPLOAD_MAX_BYTES, UploadRing};
use crate::backend::{BackendError, DType, check_buffer};

/// The CUDA backend: one device, one stream, the kernel cache and scratch memory.
pub struct CudaBackend {
    pub(super) ordinal: usize,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    pub(super) modules: ModuleCache,
    /// The tuning the backend was opened with ([`CudaBackend::with_tuning`]).
    pub(super) tuning: CudaTuning,
    /// CTAs a split-K decode-attention launch aims to have in flight: the SMs times
    /// [`CudaTuning::decode_ctas_per_sm`].
    pub(super) split_target_ctas: usize,
    /// Longest split of a decode-attention launch (tokens): [`CudaTuning::decode_max_split_tokens`],
    /// `usize::MAX` when unlimited.
    pub(super) split_max_tokens: usize,
    /// Shortest split of a decode-attention launch where the context allows (tokens):
    /// [`CudaTuning::decode_min_split_tokens`].
    pub(super) split_min_tokens: usize,
    /// Streaming multiprocessors of the device.
    pub(super) sm_count: usize,
    /// Products that cuBLAS multiplies in bf16 take their input in bf16 straight from the RMSNorm
    /// and SwiGLU kernels ([`crate::backend::Backend::matmul_input_dtype`]); off
    /// ([`CudaBackend::with_bf16_inputs`]) the producers write f32 and each product casts it.
    pub(super) bf16_inputs: bool,
    /// Programmatic dependent launch ([`super::pdl`]): on where the device supports it (compute
    /// capability >= 9.0).
    pub(super) pdl: bool,
    /// Reusable scratch: the bf16 copy of matmul inputs and the decode-attention partials.
    pub(super) scratch: Mutex<Scratch>,
    /// Precise mode: matmul inputs as two bf16 terms (f32 accuracy, twice the weight reads; see
    /// `gemm`) and an f32 KV cache.
    pub(super) precise: bool,
    /// Deterministic mode's products ([`super::gemm_pinned`]); `None` unless
    /// [`CudaTuning::deterministic`].
    pub(super) pinned: Option<PinnedGemm>,
    /// Deterministic mode's pick, per product of few rows, between cuBLASLt and sov's kernels
    /// ([`super::det_gemv`]).
    pub(super) det_picks: SmallPicks,
    /// FP8 products through cuBLASLt ([`super::gemm_fp8`]); `None` unless
    /// [`CudaTuning::quantization`] is FP8.
    pub(super) fp8: Option<Fp8Gemm>,
    /// Page-locked staging of small uploads ([`super::upload_ring`]).
    pub(super) uploads: Mutex<UploadRing>,
}

/// Growable device scratch buffers, reused across ops (stream order makes reuse safe).
#[derive(Default)]
pub(super) struct Scratch {
    /// bf16 copy of a matmul input, `[n * k]` (`[2, n * k]` hi/lo terms in precise mode).
    pub(super) x_bf16: Option<CudaBuffer>,
    /// Decode partial outputs `[seqs, kv_heads, splits, group, head_dim]` f32.
    pub(super) part_o: Option<CudaBuffer>,
    /// Decode partial (max, sum) `[seqs, kv_heads, splits, group, 2]` f32.
    pub(super) part_ml: Option<CudaBuffer>,
    /// Split arrival counters `[seqs, kv_heads]` u32, kept zero between launches.
    pub(super) counters: Option<CudaBuffer>,
    /// Deterministic prefill attention: per-token block tables `[rows, max_blocks]` u32 and
    /// context lengths `[rows]` u32 (see `attention_rows.rs`).
    pub(super) row_tables: Option<CudaBuffer>,
    /// See `row_tables`.
    pub(super) row_ctx: Option<CudaBuffer>,
    /// FP8 products: the quantized input, `[n * k]` e4m3 then `[n]` f32 scales (see `fp8.rs`).
    pub(super) fp8_x: Option<CudaBuffer>,
    /// Bumped whenever a scratch buffer is (re)allocated: a CUDA graph captured under an older
    /// generation points at freed scratch and must be captured again.
    pub(super) generation: u64,
}

impl CudaBackend {
    /// The current scratch generation: bumped whenever the backend reallocates a scratch buffer,
    /// so a CUDA graph captured under an older generation points at freed memory and must be
    /// captured again.
    pub fn scratch_generation(&self) -> u64 {
        self.scratch
            .lock()
            .map(|s| s.generation)
            .unwrap_or(u64::MAX)
    }
}

/// Why no CUDA device can be used, if none can (library missing, no device, bad ordinal).
pub fn probe(ordinal: usize) -> Result<(), BackendError> {
    // SAFETY: each probe only tries to open the shared library; no symbol is called.
    let (driver, nvrtc, cublas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err(BackendError::Device(
            "CUDA requested but the driver library libcuda.so.1 was not found (no NVIDIA driver?)"
                .into(),
        ));
    }
    if !nvrtc {
        return Err(BackendError::Device(
            "CUDA requested but libnvrtc.so (CUDA 13 runtime compiler) was not found".into(),
        ));
    }
    if !cublas {
        return Err(BackendError::Device(
            "CUDA requested but libcublas.so (CUDA 13) was not found".into(),
        ));
    }
    let count = CudaContext::device_count().map_err(driver_err)?;
    if ordinal >= count.max(0) as usize {
        return Err(BackendError::Device(format!(
            "CUDA device {ordinal} requested but {count} device(s) found"
        )));
    }
    Ok(())
}

impl CudaBackend {
    /// Opens device `ordinal` with the measured default tuning ([`CudaTuning::default`]), or says
    /// clearly why it cannot.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        Self::with_tuning(ordinal, CudaTuning::default())
    }

    /// Opens device `ordinal` with `tuning` (checked first: [`CudaTuning::validate`]), or says
    /// clearly why it cannot.
    pub fn with_tuning(ordinal: usize, tuning: CudaTuning) -> Result<Self, BackendError> {
        tuning.validate()?;
        probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver_err)?;
        // SAFETY: every buffer of a backend is used on that backend's one stream, so cudarc's
        // cross-stream event tracking is not needed; with it off, no event of earlier work is
        // waited on inside a graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err)?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| BackendError::Device(format!("cuBLAS init: {e:?}")))?;
        let (major, minor) = ctx.compute_capability().map_err(driver_err)?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err)? as usize;
        let modules = ModuleCache::new(
            ctx.clone(),
            format!("compute_{major}{minor}"),
            tuning.kernels.clone(),
        )?;
        let mut backend = Self {
            ordinal,
            ctx,
            stream,
            blas,
            modules,
            split_target_ctas: sm_count * tuning.decode_ctas_per_sm,
            split_max_tokens: tuning.decode_max_split_tokens.unwrap_or(usize::MAX),
            split_min_tokens: tuning.decode_min_split_tokens,
            sm_count,
            bf16_inputs: true,
            pdl: major >= 9,
            tuning,
            scratch: Mutex::new(Scratch::default()),
            precise: false,
            pinned: None,
            det_picks: SmallPicks::default(),
            fp8: None,
            uploads: Mutex::new(UploadRing::default()),
        };
        backend.keep_freed_memory()?;
        if backend.tuning.deterministic {
            let workspace = backend.alloc_zeroed(DType::U32, WORKSPACE_BYTES / 4)?;
            let rows = backend.tuning.deterministic_gemm_rows;
            backend.pinned = Some(PinnedGemm::new(workspace, rows)?);
        }
        if backend.tuning.kv_e4m3 && (major, minor) < (8, 9) {
            return Err(BackendError::Unsupported(format!(
                "an FP8 KV cache (--kv-dtype fp8) on compute capability {major}.{minor} (needs 8.9)"
            )));
        }
        if backend.tuning.quantization == Quantization::Fp8W8A8 {
            if (major, minor) < (8, 9) {
                return Err(BackendError::Unsupported(format!(
                    "FP8 (--quantization fp8) on compute capability {major}.{minor} (needs 8.9)"
                )));
            }
            let workspace = backend.alloc_zeroed(DType::U32, FP8_WORKSPACE_BYTES / 4)?;
            backend.fp8 = Some(Fp8Gemm::new(workspace)?);
            backend.probe_fp8()?;
        }
        Ok(backend)
    }

    /// Whether the backend runs in deterministic (batch-invariant) mode
    /// ([`CudaTuning::deterministic`]): what a receipt's precision names.
    pub fn deterministic(&self) -> bool {
        self.tuning.deterministic
    }

    /// The tuning the backend was opened with.
    pub fn tuning(&self) -> &CudaTuning {
        &self.tuning
    }

    /// Whether products cuBLAS multiplies in bf16 get their input in bf16 from its producer
    /// (`true`, the default) or in f32, cast by the product (`false`). The values multiplied, and
    /// so every result, are the same either way (a GPU test compares the logits bit for bit); the
    /// default saved 2-4% of a decode step at batch 16-256 on the H200, so `false` is only for
    /// that comparison.
    pub fn with_bf16_inputs(mut self, on: bool) -> Self {
        self.bf16_inputs = on;
        self
    }

    /// Precise mode: matmul inputs keep f32 accuracy (split into two bf16 terms, two GEMMs, twice
    /// the weight reads) and the KV cache is f32. Off by default (bf16 matmul inputs and KV cache,
    /// as bf16 inference does); used to check the compute path against the f32 CPU backend.
    pub fn with_precise(mut self, on: bool) -> Self {
        self.precise = on;
        self
    }

    /// Device name as the driver reports it.
    pub fn device_name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    /// Allocates `len` elements of `dtype`, zero-filled.
    pub(super) fn alloc_zeroed(
        &self,
        dtype: DType,
        len: usize,
    ) -> Result<CudaBuffer, BackendError> {
        self.alloc_with(dtype, len, |bytes| self.stream.alloc_zeros::<u8>(bytes))
    }

    /// Allocates `len` elements of `dtype` and leaves them as they were (no memset).
    ///
    /// # Safety
    /// The caller writes every element (in stream order) before anything reads one.
    pub(super) unsafe fn alloc_unwritten(
        &self,
        dtype: DType,
        len: usize,
    ) -> Result<CudaBuffer, BackendError> {
        // SAFETY: the caller's contract: every byte is written before it is read.
        self.alloc_with(dtype, len, |bytes| unsafe {
            self.stream.alloc::<u8>(bytes)
        })
    }

    /// `len` elements of `dtype` (at least one) from `alloc`, retried once after handing the
    /// pool's idle memory back when the device is out of memory.
    fn alloc_with(
        &self,
        dtype: DType,
        len: usize,
        alloc: impl Fn(usize) -> Result<cudarc::driver::CudaSlice<u8>, cudarc::driver::DriverError>,
    ) -> Result<CudaBuffer, BackendError> {
        let bytes = len.max(1) * dtype.size_bytes();
        let oom =
            |e: &cudarc::driver::DriverError| e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;
        let mem = match alloc(bytes) {
            // Memory the pool kept (mem_pool.rs) may be what is missing outside it: hand it
            // back and try once more.
            Err(e) if oom(&e) => {
                self.release_idle_memory()?;
                alloc(bytes)
            }
            other => other,
        }
        .map_err(|e| {
            if oom(&e) {
                BackendError::OutOfMemory { bytes }
            } else {
                driver_err(e)
            }
        })?;
        Ok(CudaBuffer { dtype, len, mem })
    }

    /// Whether the backend's stream is capturing a graph (a staged copy enqueued now would be
    /// replayed from its staging slot long after the slot was reused).
    fn capturing(&self) -> Result<bool, BackendError> {
        let status = self.stream.capture_status().map_err(driver_err)?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Uploads raw little-endian bytes as a buffer of `dtype` (`bytes.len() / size` elements).
    /// Uploads of up to [`STAGED_UPLOAD_MAX_BYTES`] outside a graph capture go through the
    /// staging ring ([`super::upload_ring`]) and return without waiting for the stream; the
    /// others copy from pageable memory into a zeroed buffer.
    pub(super) fn upload_bytes(
        &self,
        dtype: DType,
        bytes: &[u8],
    ) -> Result<CudaBuffer, BackendError> {
        let len = bytes.len() / dtype.size_bytes();
        let bytes = &bytes[..len * dtype.size_bytes()];
        if len == 0 || bytes.len() > STAGED_UPLOAD_MAX_BYTES || self.capturing()? {
            return self.upload_pageable(dtype, bytes);
        }
        // SAFETY: every byte of the buffer is written by the copy enqueued next, which runs in
        // stream order before anything enqueued after it can read the buffer.
        let buf = unsafe { self.alloc_unwritten(dtype, len)? };
        let mut ring = self
            .uploads
            .lock()
            .map_err(|_| BackendError::Device("upload ring lock poisoned".into()))?;
        ring.stage(&self.ctx, &self.stream, buf.ptr(), bytes)?;
        Ok(buf)
    }

    /// Uploads `bytes` (whole elements of `dtype`) into a zeroed buffer, copying from pageable
    /// memory (large uploads; [`Self::upload_bytes`] picks).
    fn upload_pageable(&self, dtype: DType, bytes: &[u8]) -> Result<CudaBuffer, BackendError> {
        let len = bytes.len() / dtype.size_bytes();
        let mut buf = self.alloc_zeroed(dtype, len)?;
        if !bytes.is_empty() {
            self.stream
                .memcpy_htod(bytes, &mut buf.mem.slice_mut(0..bytes.len()))
                .map_err(driver_err)?;
        }
        Ok(buf)
    }

    /// Copies `out.len()` bytes starting at byte `offset` of `buf` to the host (synchronous).
    pub(super) fn download_raw(
        &self,
        buf: &CudaBuffer,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller checked offset + out.len() <= buf's size; the copy is waited for
        // before `out` is used or dropped.
        unsafe {
            result::memcpy_dtoh_async(out, buf.ptr() + offset as u64, self.stream.cu_stream())
                .map_err(driver_err)?;
        }
        self.stream.synchronize().map_err(driver_err)
    }

    /// Copies elements `elem_offset .. elem_offset + out.len()` of the f32 buffer `buf` to the
    /// host (one logits row of a step whose logits stay on the device).
    pub fn download_f32_at(
        &self,
        buf: &CudaBuffer,
        elem_offset: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        check_buffer(
            "download_f32_at",
            "buf",
            buf,
            DType::F32,
            elem_offset + out.len(),
        )?;
        self.download_raw(buf, elem_offset * 4, bytemuck::cast_slice_mut(out))
    }

    /// Writes `bytes` at byte `offset` of `buf`.
    pub(super) fn upload_raw(
        &self,
        buf: &mut CudaBuffer,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller checked the range; the stream is synchronised before returning, so
        // `bytes` outlives the copy.
        unsafe {
            result::memcpy_htod_async(buf.ptr() + offset as u64, bytes, self.stream.cu_stream())
                .map_err(driver_err)?;
        }
        self.stream.synchronize().map_err(driver_err)
    }

    /// Copies each host slice into the start of its u32 buffer, all on the stream, then waits once
    /// (a decode step's inputs: one synchronisation instead of one per buffer). Each buffer must
    /// be u32 and hold its slice.
    pub fn upload_u32_many(
        &self,
        copies: &mut [(&mut CudaBuffer, &[u32])],
    ) -> Result<(), BackendError> {
        for (buf, data) in copies.iter() {
            check_buffer("upload_u32_many", "buffer", &**buf, DType::U32, data.len())?;
        }
        let mut first_err = None;
        for (buf, data) in copies.iter_mut() {
            if data.is_empty() || first_err.is_some() {
                continue;
            }
            let bytes: &[u8] = bytemuck::cast_slice(data);
            // SAFETY: the buffer holds at least data.len() u32 (checked above); the stream is
            // synchronised below, on every path, before the host slices can be dropped.
            let copied =
                unsafe { result::memcpy_htod_async(buf.ptr(), bytes, self.stream.cu_stream()) };
            first_err = copied.err();
        }
        let synced = self.stream.synchronize();
        if let Some(e) = first_err {
            return Err(driver_err(e));
        }
        synced.map_err(driver_err)
    }

    /// Device-to-device copy of `bytes` bytes between raw addresses, on the stream.
    pub(super) fn copy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<(), BackendError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller checked both ranges lie inside live allocations.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver_err)
    }
}

/// Grid size for a grid-stride kernel over `n` items with `threads` per block.
pub(super) fn grid_for(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads).clamp(1, 1 << 20) as u32
}
