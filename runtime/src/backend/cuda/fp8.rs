//! FP8 W8A8 on the CUDA backend: weights quantized at load, inputs quantized per token before each
//! product, and the choice of product kernel by shape.
//!
//! Design (the scheme and its exact scale math are in `kernels/cuda/fp8.cu`): a linear layer's
//! weight `[m, k]` (under [`Quantization::Fp8W8A8`], [`CudaBackend::upload_projection_impl`]) is
//! uploaded in bf16, quantized on the device by `quantize_rows_bf16` and stored as one
//! [`DType::F8E4M3`] buffer: `m*k` e4m3 bytes, then (from byte [`scales_offset`]) the `[m]` f32
//! scales; an FP8 checkpoint's weight (compressed-tensors, `crate::loader::fp8`) is uploaded in
//! that layout as it is ([`CudaBackend::upload_fp8_rows`]). A product `x[n, k] @ w^T` quantizes
//! `x` (f32 or bf16) into the backend's scratch (`[n*k]` e4m3, then `[n]` f32 scales) and
//! multiplies on one of three paths ([`Fp8Path`]): the small-M tensor-core kernel for
//! `n <= CudaTuning::fp8_small_max_rows` (batch-1 decode: cuBLASLt FP8 is no GEMV), cuBLASLt
//! ([`super::gemm_fp8`]) above that, and a scalar kernel for shapes neither takes
//! (`k % 16 != 0`, or `m % 4 != 0` for cuBLASLt). Products of very few rows (one by default)
//! skip the scratch: their kernel quantizes the input itself ([`super::fp8_fused`]); an input
//! that arrives as quantized rows ([`DType::F8E4M3`], written by its producer:
//! [`super::fp8_inputs`]) is multiplied as it is. The lm head
//! and the embedding stay bf16, as in the FP8-dynamic checkpoints.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, grid_for};
use super::driver_error::driver_err;
use super::gemm_fp8::{Fp8Gemm, Fp8Out, ScaleMode};
use super::ops::{GateUpRows, to_i32};
use super::pdl::arg;
use super::tuning::Quantization;
use crate::backend::{Backend, BackendError, DType, ProjectionSite, check_buffer};
use crate::loader::tensor::{Fp8Rows, HostData, HostTensor};

/// Threads of a `quantize_rows_*` CTA (`QUANT_THREADS` in `fp8.cu`).
const QUANT_THREADS: u32 = 256;
/// Longest row the `quantize_rows_vec_*` kernels take (`QUANT_THREADS * 8 * QUANT_VEC_CHUNKS`).
const QUANT_VEC_MAX_K: usize = 16384;
/// Weight rows a CTA of the small-M kernel takes.
const SMALL_ROWS_PER_CTA: usize = 16;

/// Byte offset of the scales in an FP8 buffer of `len` e4m3 values (256-byte aligned).
pub(super) fn scales_offset(len: usize) -> usize {
    len.div_ceil(256) * 256
}

/// Which kernel multiplies an FP8 product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Path {
    /// By shape, as [`CudaBackend::matmul`] picks it.
    Auto,
    /// `fp8_gemm_small_*` (n <= 32, k % 16 == 0).
    Small,
    /// `fp8_small_q_*`: the small-M product quantizing its own input (`fp8_fused.rs`; n <= 8,
    /// k % 16 == 0, n * k <= 32 KiB, and within [`super::CudaTuning::fp8_fused_max_rows`]).
    SmallFused,
    /// cuBLASLt (k % 16 == 0, m % 4 == 0).
    CublasLt,
    /// `fp8_gemm_scalar` (any shape; slow).
    Scalar,
}

impl CudaBackend {
    /// [`crate::backend::Backend::upload_projection`]: FP8 under [`Quantization::Fp8W8A8`] for a
    /// 2-D tensor, except that a bf16 (or wider) weight in one of the layers
    /// [`super::CudaTuning::fp8_bf16_edge_layers`] keeps stays bf16; else the bf16 upload. An
    /// FP8 checkpoint's codes upload as they are wherever they sit.
    pub(super) fn upload_projection_impl(
        &self,
        tensor: HostTensor,
        site: ProjectionSite,
    ) -> Result<CudaBuffer, BackendError> {
        if self.tuning.quantization != Quantization::Fp8W8A8 || tensor.shape.len() != 2 {
            return self.upload_weight_owned(tensor);
        }
        let (m, k) = (tensor.shape[0], tensor.shape[1]);
        if let HostData::Fp8(rows) = &tensor.data {
            return self.upload_fp8_rows(rows, m, k);
        }
        if site.from_edge() < self.tuning.fp8_bf16_edge_layers {
            return self.upload_weight_owned(tensor);
        }
        let bf = self.upload_weight(&tensor)?;
        drop(tensor);
        self.quantize_weight(&bf, m, k)
    }

    /// Uploads an FP8 checkpoint's weight `[m, k]` as it is: its e4m3 codes, then (from
    /// `scales_offset`) its `[m]` row scales, the layout [`Self::quantize_weight`] writes.
    pub fn upload_fp8_rows(
        &self,
        rows: &Fp8Rows,
        m: usize,
        k: usize,
    ) -> Result<CudaBuffer, BackendError> {
        if rows.codes.len() != m * k || rows.scales.len() != m {
            return Err(BackendError::Shape {
                op: "upload_fp8_rows",
                detail: format!(
                    "[{m}, {k}] needs {} codes and {m} scales, got {} and {}",
                    m * k,
                    rows.codes.len(),
                    rows.scales.len()
                ),
            });
        }
        let off = scales_offset(m * k);
        // [off + 4*m] bytes: the codes, zeros up to `off`, the scales (little-endian f32).
        let mut bytes = Vec::with_capacity(off + 4 * m);
        bytes.extend_from_slice(&rows.codes);
        bytes.resize(off, 0);
        bytes.extend_from_slice(bytemuck::cast_slice(&rows.scales));
        let mut q = self.upload_bytes(DType::F8E4M3, &bytes)?;
        q.len = m * k;
        Ok(q)
    }

    /// Quantizes a bf16 weight `[m, k]` into an FP8 buffer (e4m3 rows, then the row scales).
    pub fn quantize_weight(
        &self,
        w: &CudaBuffer,
        m: usize,
        k: usize,
    ) -> Result<CudaBuffer, BackendError> {
        check_buffer("quantize_weight", "w", w, DType::BF16, m * k)?;
        let off = scales_offset(m * k);
        let mut q = self.alloc_zeroed(DType::F8E4M3, off + 4 * m)?;
        q.len = m * k;
        let (qp, sp) = (q.ptr(), q.ptr() + off as u64);
        // SAFETY: q holds m*k bytes then m f32 at byte `off`; w holds m*k bf16.
        unsafe { self.quantize_rows("quantize_rows_bf16", qp, sp, w.ptr(), m, k)? };
        Ok(q)
    }

    /// Launches `name` (`quantize_rows_f32` or `_bf16`) over `rows` rows of `k`.
    ///
    /// # Safety
    /// `q` must hold `rows*k` bytes, `scale` `rows` f32 and `x` `rows*k` of the kernel's input type.
    unsafe fn quantize_rows(
        &self,
        name: &str,
        q: u64,
        scale: u64,
        x: u64,
        rows: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        if rows == 0 {
            return Ok(());
        }
        // The register-held variant (same values) where the row fits it.
        let vec_name = format!(
            "quantize_rows_vec_{}",
            name.trim_start_matches("quantize_rows_")
        );
        let name = if k.is_multiple_of(8) && k <= QUANT_VEC_MAX_K {
            vec_name.as_str()
        } else {
            name
        };
        let f = self.modules.function(KernelId::Fp8, None, name)?;
        let ki = to_i32(k, "k")?;
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(rows).map_err(|_| too_big(rows))?, 1, 1),
            block_dim: (QUANT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params = [arg(&q), arg(&scale), arg(&x), arg(&ki)];
        // SAFETY: the parameters are the kernel's (q, scale, x, k), alive for the call; sizes are
        // the caller's contract; the kernel waits for its prerequisites before touching memory.
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }
    }

    /// Grows the FP8 input scratch to `n` rows of `k` (e4m3 values, then `n` f32 scales).
    pub(super) fn reserve_fp8_scratch(&self, n: usize, k: usize) -> Result<(), BackendError> {
        let need = scales_offset(n * k) + 4 * n;
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        if scratch.fp8_x.as_ref().is_none_or(|b| b.len < need) {
            scratch.fp8_x = Some(self.alloc_zeroed(DType::F8E4M3, need.next_power_of_two())?);
            scratch.generation += 1;
        }
        Ok(())
    }

    /// Quantizes `x` (`[n, k]` f32 or bf16) into the FP8 scratch and returns the addresses of its
    /// e4m3 values and scales.
    pub(super) fn quantize_input(
        &self,
        x: &CudaBuffer,
        n: usize,
        k: usize,
    ) -> Result<(u64, u64), BackendError> {
        self.reserve_fp8_scratch(n, k)?;
        let scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        let Some(buf) = scratch.fp8_x.as_ref() else {
            return Err(BackendError::Device("FP8 scratch missing".into()));
        };
        let (qp, sp) = (buf.ptr(), buf.ptr() + scales_offset(n * k) as u64);
        let name = if x.dtype == DType::BF16 {
            "quantize_rows_bf16"
        } else {
            "quantize_rows_f32"
        };
        // SAFETY: the scratch holds n*k bytes then n f32 at scales_offset(n*k) (reserved above);
        // the caller checked x.
        unsafe { self.quantize_rows(name, qp, sp, x.ptr(), n, k)? };
        Ok((qp, sp))
    }

    /// Checks an FP8 product's input `x` (`[n, k]`: quantized rows, bf16 or f32) and weight `w`
    /// (`[m, k]` e4m3 codes, then their `[m]` scales); returns the rows' codes and scales
    /// addresses where `x` arrives quantized.
    fn check_fp8_operands(
        op: &'static str,
        x: &CudaBuffer,
        w: &CudaBuffer,
        (n, k, m): (usize, usize, usize),
    ) -> Result<Option<(u64, u64)>, BackendError> {
        let rows = match x.dtype {
            DType::F8E4M3 => Some(Self::quantized_rows(op, x, n, k)?),
            DType::BF16 => {
                check_buffer(op, "x", x, DType::BF16, n * k)?;
                None
            }
            _ => {
                check_buffer(op, "x", x, DType::F32, n * k)?;
                None
            }
        };
        check_buffer(op, "w", w, DType::F8E4M3, m * k)?;
        if w.mem.len() < scales_offset(m * k) + 4 * m {
            return Err(BackendError::Shape {
                op,
                detail: format!("w holds no scales for {m} rows"),
            });
        }
        Ok(rows)
    }

    /// `out[n, m] = x[n, k] @ w^T` for an FP8 weight `w` (see the module doc) on `path`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_fp8(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        (n, k, m): (usize, usize, usize),
        path: Fp8Path,
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul (fp8)";
        // Quantized rows from the input's producer (`fp8_inputs.rs`), or rows to quantize here.
        let quantized = x.dtype == DType::F8E4M3;
        // The rows' codes and scales addresses, where they arrive quantized.
        let rows = Self::check_fp8_operands(OP, x, w, (n, k, m))?;
        check_buffer(OP, "out", out, DType::F32, n * m)?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        // The fused kernels quantize raw rows themselves.
        let fused = !quantized && self.fp8_fused_applies(n, k);
        match path {
            Fp8Path::SmallFused if !fused => return Err(unsupported("fused small-M", n, k, m)),
            Fp8Path::Auto | Fp8Path::SmallFused if fused => {
                return self.matmul_fp8_fused(x, w, out, (n, k, m));
            }
            _ => {}
        }
        let (qx, sx) = match rows {
            Some(rows) => rows,
            None => self.quantize_input(x, n, k)?,
        };
        let (qw, sw) = (w.ptr(), w.ptr() + scales_offset(m * k) as u64);
        let small_ok = k.is_multiple_of(16) && n <= super::tuning::FP8_SMALL_LIMIT;
        let lt_ok = k.is_multiple_of(16) && m.is_multiple_of(4) && self.fp8.is_some();
        let path = match path {
            Fp8Path::Auto if small_ok && n <= self.tuning.fp8_small_max_rows => Fp8Path::Small,
            Fp8Path::Auto if lt_ok => Fp8Path::CublasLt,
            Fp8Path::Auto if small_ok => Fp8Path::Small,
            Fp8Path::Auto => Fp8Path::Scalar,
            Fp8Path::Small if !small_ok => return Err(unsupported("small-M", n, k, m)),
            Fp8Path::CublasLt if !lt_ok => return Err(unsupported("cuBLASLt", n, k, m)),
            p => p,
        };
        let o = out.ptr();
        let (ni, ki, mi) = (to_i32(n, "n")?, to_i32(k, "k")?, to_i32(m, "m")?);
        let (name, cfg) = match path {
            Fp8Path::Small => {
                let tiles = n.div_ceil(8);
                let ctas = m.div_ceil(SMALL_ROWS_PER_CTA);
                // Few CTAs: the 16-warp form puts twice the warps on an SM (fp8.cu).
                let (form, threads) = if ctas < self.tuning.fp8_small_wide_ctas {
                    ("_wide", 512)
                } else {
                    ("", 256)
                };
                let cfg = LaunchConfig {
                    grid_dim: (ctas as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                };
                (format!("fp8_gemm_small{form}_{tiles}"), cfg)
            }
            Fp8Path::CublasLt => {
                let Some(lt) = self.fp8.as_ref() else {
                    return Err(unsupported("cuBLASLt", n, k, m));
                };
                let stream = self.stream.cu_stream() as _;
                // SAFETY: qx/sx hold n*k bytes and n f32 (the scratch, or the caller's quantized
                // rows checked by `quantized_rows`), qw/sw m*k bytes and m f32
                // (checked above), out n*m f32; k % 16 == 0 and m % 4 == 0 (lt_ok).
                let mode =
                    unsafe { lt.matmul(stream, (qx, sx), (qw, sw), (o, Fp8Out::F32), (n, k, m))? };
                if mode == ScaleMode::OuterVector {
                    return Ok(());
                }
                let cfg = LaunchConfig {
                    grid_dim: (grid_for(n * m, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let f = self.modules.function(KernelId::Fp8, None, "fp8_rescale")?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&o).arg(&sx).arg(&sw).arg(&ni).arg(&mi);
                // SAFETY: (out, sx, sw, n, m) as the kernel takes them; sizes checked above.
                unsafe { b.launch(cfg) }.map_err(driver_err)?;
                return Ok(());
            }
            _ => {
                let cfg = LaunchConfig {
                    grid_dim: (grid_for(n * m, 256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                ("fp8_gemm_scalar".to_string(), cfg)
            }
        };
        let f = self.modules.function(KernelId::Fp8, None, &name)?;
        let mut params = [
            arg(&o),
            arg(&qx),
            arg(&sx),
            arg(&qw),
            arg(&sw),
            arg(&ni),
            arg(&ki),
            arg(&mi),
        ];
        // SAFETY: both kernels take (out, qx, sx, qw, sw, n, k, m), alive for the call; the
        // buffers hold what those sizes need (checked above; the scratch reserved by
        // quantize_input, or the caller's quantized rows); the small kernel gets ceil(n / 8) <= 4 tiles and k % 16 == 0
        // (small_ok) and reads only the weights before its wait for the prerequisites; the
        // scalar kernel starts after the kernel before it.
        unsafe {
            if path == Fp8Path::Small {
                self.launch_overlapping(&f, cfg, &mut params)
            } else {
                self.launch_serial(&f, cfg, &mut params)
            }
        }
    }

    /// Settles the cuBLASLt FP8 scale mode and whether bf16 outputs run ([`Fp8Gemm::probe`]) with
    /// one product on zeros, before any of the model's.
    pub(super) fn probe_fp8(&self) -> Result<(), BackendError> {
        let Some(lt) = self.fp8.as_ref() else {
            return Ok(());
        };
        let zeros = self.alloc_zeroed(DType::U32, Fp8Gemm::PROBE_BYTES / 4)?; // [PROBE_BYTES] bytes
        let stream = self.stream.cu_stream() as _;
        // SAFETY: `zeros` holds PROBE_BYTES zeroed bytes and outlives the synchronize below.
        unsafe { lt.probe(stream, zeros.ptr())? };
        self.stream.synchronize().map_err(driver_err)
    }

    /// The gate/up product `gate_up[n, m] = x[n, k] @ w^T` of an FP8 weight in bf16, written over
    /// the first half of the f32 `gate_up` scratch's bytes, where
    /// [`super::CudaTuning::fp8_gate_up_bf16`] asks for it ([`Self::fp8_product_bf16`]); `None`
    /// (nothing run) otherwise.
    pub(super) fn gate_up_bf16(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        gate_up: &mut CudaBuffer,
        dims: (usize, usize, usize),
    ) -> Result<Option<GateUpRows>, BackendError> {
        const OP: &str = "matmul_silu_mul (fp8, bf16 gate/up)";
        let enabled = self.tuning.fp8_gate_up_bf16;
        Ok(self
            .fp8_product_bf16(OP, x, w, gate_up, dims, enabled)?
            .then(|| GateUpRows {
                ptr: gate_up.ptr(),
                bf16: true,
            }))
    }

    /// [`crate::backend::Backend::matmul_residual_delta`]: an FP8 product of more rows than the
    /// small-M kernel takes is written in bf16 where [`super::CudaTuning::fp8_delta_bf16`] asks
    /// for it ([`Self::fp8_product_bf16`]) and `out` is marked [`DType::BF16`]; any other product
    /// is [`Self::matmul_impl`]'s, `out` marked f32. `out` must have been made f32.
    pub(super) fn matmul_residual_delta_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        (n, k, m): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul_residual_delta (fp8, bf16 delta)";
        // A bf16 mark left by the previous step's product: the bytes were made f32.
        out.retype(DType::F32);
        let enabled = self.tuning.fp8_delta_bf16;
        if self.fp8_product_bf16(OP, x, w, out, (n, k, m), enabled)? {
            out.retype(DType::BF16);
            return Ok(());
        }
        self.matmul_impl(x, w, out, n, k, m)
    }

    /// An FP8 product `out[n, m] = x[n, k] @ w^T` written by cuBLASLt in bf16 (the scaled f32
    /// result rounded once) over the first half of the f32 buffer `out`'s bytes, where `enabled`
    /// (a tuning switch) holds, `w` is FP8, the product has more rows than the small-M kernel
    /// takes, cuBLASLt multiplies the shape (k % 16 == 0, m % 4 == 0) and writes bf16; `false`
    /// (nothing run) otherwise.
    fn fp8_product_bf16(
        &self,
        op: &'static str,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &CudaBuffer,
        (n, k, m): (usize, usize, usize),
        enabled: bool,
    ) -> Result<bool, BackendError> {
        let Some(lt) = self.fp8.as_ref() else {
            return Ok(false);
        };
        let quantized = x.dtype == DType::F8E4M3;
        let applies = enabled
            && lt.bf16_out()
            && w.dtype == DType::F8E4M3
            && n > self.tuning.fp8_small_max_rows
            && n > 0
            && k.is_multiple_of(16)
            && m.is_multiple_of(4)
            && (quantized || !self.fp8_fused_applies(n, k));
        if !applies {
            return Ok(false);
        }
        check_buffer(op, "out", out, DType::F32, n * m)?;
        let (qx, sx) = match Self::check_fp8_operands(op, x, w, (n, k, m))? {
            Some(rows) => rows,
            None => self.quantize_input(x, n, k)?,
        };
        let (qw, sw) = (w.ptr(), w.ptr() + scales_offset(m * k) as u64);
        let stream = self.stream.cu_stream() as _;
        // SAFETY: qx/sx hold n*k bytes and n f32 (the scratch, or the caller's quantized rows
        // checked by `quantized_rows`), qw/sw m*k bytes and m f32 (checked above); out holds
        // n*m f32, twice the n*m bf16 written; k % 16 == 0 and m % 4 == 0.
        unsafe {
            lt.matmul(
                stream,
                (qx, sx),
                (qw, sw),
                (out.ptr(), Fp8Out::Bf16),
                (n, k, m),
            )?
        };
        Ok(true)
    }

    /// The e4m3 bytes and the `[m]` scales of an FP8 weight of `m` rows (for tests and tools).
    pub fn download_fp8(
        &self,
        w: &CudaBuffer,
        m: usize,
    ) -> Result<(Vec<u8>, Vec<f32>), BackendError> {
        check_buffer("download_fp8", "w", w, DType::F8E4M3, w.len)?;
        if w.mem.len() < scales_offset(w.len) + 4 * m {
            return Err(BackendError::Shape {
                op: "download_fp8",
                detail: format!("w holds no scales for {m} rows"),
            });
        }
        let mut q = vec![0u8; w.len];
        self.download_raw(w, 0, &mut q)?;
        let mut s = vec![0f32; m];
        self.download_raw(w, scales_offset(w.len), bytemuck::cast_slice_mut(&mut s))?;
        Ok((q, s))
    }

    /// How cuBLASLt FP8 products apply their scales, once one has run (`None` before, or without
    /// FP8).
    pub fn fp8_scale_mode(&self) -> Option<ScaleMode> {
        self.fp8.as_ref().and_then(|g| g.mode())
    }
}

fn too_big(v: usize) -> BackendError {
    BackendError::Unsupported(format!("FP8 dimension {v}"))
}

fn unsupported(path: &str, n: usize, k: usize, m: usize) -> BackendError {
    BackendError::Unsupported(format!("the {path} FP8 product of {n}x{k} @ {m}x{k}^T"))
}
