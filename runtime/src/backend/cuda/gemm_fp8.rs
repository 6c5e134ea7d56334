//! FP8 products through cuBLASLt: e4m3 x e4m3, f32 accumulation, f32 (or bf16) output.
//!
//! Design: the layout of [`super::gemm`] (cuBLAS's `C[m, n] = op(W)[m, k] · X[k, n]` with `W`
//! transposed, the "TN" form Hopper's FP8 kernels require). The scales of the W8A8 scheme
//! (`fp8.cu`) are one f32 per weight row and one per input row, which is cuBLASLt's outer-vector
//! scale mode (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`, cuBLAS 12.9+): `A_SCALE_POINTER` gets
//! the `[m]` weight scales and `B_SCALE_POINTER` the `[n]` input scales, and the product comes out
//! scaled. Where this cuBLASLt refuses that mode (no algorithm from its heuristic), the product
//! runs with unit scales ([`ScaleMode::Unit`]) and the caller rescales it (`fp8_rescale`): one
//! more pass over the output. The backend runs one small product when it opens
//! ([`Fp8Gemm::probe`]), so every product of a run takes the same mode. The handle, workspace and
//! choice of algorithm per shape are [`super::gemm_lt`]'s. A bf16 output ([`Fp8Out::Bf16`], the
//! gate/up product's, `fp8.rs`) is the scaled f32 result rounded once, so it exists only in
//! outer-vector mode.

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::cublaslt::sys;

use super::gemm_lt::{LtGemm, LtKind, LtOperands};
use super::gemm_tune::KernelTimer;
use super::lt_problem::LtProblem;
use crate::backend::BackendError;

/// The element type an FP8 product writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Fp8Out {
    F32,
    Bf16,
}

impl Fp8Out {
    fn cuda_type(self) -> sys::cudaDataType_t {
        match self {
            Fp8Out::F32 => sys::cudaDataType_t::CUDA_R_32F,
            Fp8Out::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
        }
    }
}

/// How a cuBLASLt FP8 product applies the scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// Outer-vector scales inside cuBLASLt: the output is final.
    OuterVector,
    /// Unit scales: the caller multiplies the output by its row and column scales.
    Unit,
}

/// What the FP8 products of a backend found out about its cuBLASLt: the scale mode and whether
/// bf16 outputs run.
pub(super) struct Fp8Gemm {
    /// `None` until the first product found which mode this cuBLASLt supports.
    mode: Mutex<Option<ScaleMode>>,
    /// Whether [`Self::probe`] ran a bf16-output product.
    bf16_out: AtomicBool,
}

/// An FP8 product's device addresses: input codes and scales, weight codes and scales, output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fp8Operands {
    pub(super) qx: u64,
    pub(super) sx: u64,
    pub(super) qw: u64,
    pub(super) sw: u64,
    pub(super) out: u64,
}

impl Fp8Operands {
    fn lt(self) -> LtOperands {
        LtOperands {
            w: self.qw,
            x: self.qx,
            out: self.out,
        }
    }
}

/// The descriptors of an FP8 product: `C[m, n] (f32 or bf16) = W^T · X` with `W: [k, m]` e4m3
/// (ld k), `X: [k, n]` e4m3 (ld k); with `scales = Some((sw, sx))` in outer-vector mode, `sw` `[m]`
/// and `sx` `[n]` f32.
fn fp8_problem(
    dims: (usize, usize, usize),
    scales: Option<(u64, u64)>,
    out: Fp8Out,
) -> Result<LtProblem, BackendError> {
    let e4m3 = sys::cudaDataType_t::CUDA_R_8F_E4M3;
    let p = LtProblem::tn_into(dims, e4m3, out.cuda_type(), "cuBLASLt FP8")?;
    if let Some((sw, sx)) = scales {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let mode =
            sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
        let (swp, sxp) = (sw as *const c_void, sx as *const c_void);
        // SAFETY: each value has its attribute's type (an i32 enum, device pointers as
        // `*const c_void`).
        unsafe {
            p.set_attr(A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode)?;
            p.set_attr(A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode)?;
            p.set_attr(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &swp)?;
            p.set_attr(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sxp)?;
        }
    }
    Ok(p)
}

impl Fp8Gemm {
    /// A backend's FP8 state before its first product.
    pub(super) fn new() -> Self {
        Self {
            mode: Mutex::new(None),
            bf16_out: AtomicBool::new(false),
        }
    }

    /// Bytes of device memory [`Self::probe`] needs.
    pub(super) const PROBE_BYTES: usize = 2048;

    /// Runs a 16 x 16 @ 16 x 16 product on `zeros` (at least [`Self::PROBE_BYTES`] zeroed bytes)
    /// on `stream`, in f32 and then in bf16, so the scale mode is settled before the model's
    /// first product and [`Self::bf16_out`] says whether bf16 outputs run.
    ///
    /// # Safety
    /// `zeros` must be device memory of at least [`Self::PROBE_BYTES`] bytes, live until `stream`
    /// has run the products.
    pub(super) unsafe fn probe(
        &self,
        lt: &LtGemm,
        stream: sys::cudaStream_t,
        zeros: u64,
    ) -> Result<(), BackendError> {
        // [16, 16] e4m3 input and weight, [16] f32 scales each, [16, 16] f32 (or bf16) output.
        let ops = Fp8Operands {
            qx: zeros,
            sx: zeros + 256,
            qw: zeros + 512,
            sw: zeros + 768,
            out: zeros + 1024,
        };
        let dims = (16, 16, 16);
        // SAFETY: the caller's contract on `zeros`; each piece is as large as the product needs.
        let mode = unsafe { self.matmul(lt, stream, ops, Fp8Out::F32, dims, None)? };
        if mode == ScaleMode::OuterVector {
            // SAFETY: as above (the bf16 output takes half the f32 one's bytes).
            let bf16 = unsafe { self.matmul(lt, stream, ops, Fp8Out::Bf16, dims, None) };
            if let Err(e) = &bf16 {
                tracing::info!("cuBLASLt FP8 products: no bf16 output ({e})");
            }
            self.bf16_out.store(bf16.is_ok(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether products may write bf16 ([`Fp8Out::Bf16`]): outer-vector scales, and the probe's
    /// bf16 product ran.
    pub(super) fn bf16_out(&self) -> bool {
        self.bf16_out.load(Ordering::Relaxed)
    }

    /// The scale mode products use, once the first one has found it (`None` before).
    pub(super) fn mode(&self) -> Option<ScaleMode> {
        self.mode.lock().ok().and_then(|m| *m)
    }

    /// The problem and algorithm key of an FP8 product in `mode`.
    fn problem(
        ops: Fp8Operands,
        mode: ScaleMode,
        out_type: Fp8Out,
        (n, k, m): (usize, usize, usize),
    ) -> Result<(LtProblem, super::gemm_lt::LtKey), BackendError> {
        let outer_vector = mode == ScaleMode::OuterVector;
        let scales = outer_vector.then_some((ops.sw, ops.sx));
        let p = fp8_problem((m, n, k), scales, out_type)?;
        let kind = LtKind::Fp8 {
            outer_vector,
            bf16_out: out_type == Fp8Out::Bf16,
        };
        Ok((p, (m, n, k, kind)))
    }

    /// `out[n, m] = qx[n, k] @ qw[m, k]^T` (e4m3) on `stream` through `lt`, in f32 or (`out_type`
    /// [`Fp8Out::Bf16`], outer-vector mode only) bf16, scaled by `sw` `[m]` and `sx` `[n]` where
    /// the returned mode is [`ScaleMode::OuterVector`]; unscaled (the caller rescales) where it is
    /// [`ScaleMode::Unit`]. With a `timer`, a shape not seen before may be tuned first
    /// ([`LtGemm::matmul`]).
    ///
    /// # Safety
    /// The addresses must be device buffers of at least `n*k` (`qx`), `m*k` (`qw`) bytes, `n`
    /// (`sx`), `m` (`sw`) f32 and `n*m` (`out`) elements of `out_type`, live until the product
    /// has run on `stream`; `k % 16 == 0` and `m % 4 == 0` (cuBLASLt's FP8 alignment).
    pub(super) unsafe fn matmul(
        &self,
        lt: &LtGemm,
        stream: sys::cudaStream_t,
        ops: Fp8Operands,
        out_type: Fp8Out,
        dims: (usize, usize, usize),
        timer: Option<&dyn KernelTimer>,
    ) -> Result<ScaleMode, BackendError> {
        let known = self.mode();
        let modes: &[ScaleMode] = match known {
            Some(ScaleMode::OuterVector) => &[ScaleMode::OuterVector],
            Some(ScaleMode::Unit) => &[ScaleMode::Unit],
            None => &[ScaleMode::OuterVector, ScaleMode::Unit],
        };
        let mut last_err = None;
        for &mode in modes {
            if mode == ScaleMode::Unit && out_type == Fp8Out::Bf16 {
                last_err = Some(BackendError::Unsupported(
                    "a bf16 FP8 product without cuBLASLt's outer-vector scales".into(),
                ));
                continue;
            }
            let (p, key) = Self::problem(ops, mode, out_type, dims)?;
            // SAFETY: the caller's contract on the operands; `p` is made for them.
            match unsafe { lt.matmul(stream, &p, key, ops.lt(), 0.0, timer) } {
                Ok(()) => {
                    if known.is_none()
                        && let Ok(mut slot) = self.mode.lock()
                    {
                        tracing::info!("cuBLASLt FP8 products: scales {mode:?}");
                        *slot = Some(mode);
                    }
                    return Ok(mode);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| BackendError::Device("cuBLASLt FP8: no mode".into())))
    }

    #[cfg(test)]
    /// Microseconds of each of the heuristic's candidates (up to
    /// [`super::gemm_lt::MAX_CANDIDATES`]) for this product, in the heuristic's order
    /// ([`LtGemm::candidate_times`]).
    ///
    /// # Safety
    /// As for [`Self::matmul`]; the scale mode must be settled ([`Self::probe`] ran).
    pub(super) unsafe fn candidate_times(
        &self,
        lt: &LtGemm,
        stream: sys::cudaStream_t,
        ops: Fp8Operands,
        out_type: Fp8Out,
        dims: (usize, usize, usize),
        timer: &dyn KernelTimer,
    ) -> Result<Vec<Option<f64>>, BackendError> {
        let mode = self
            .mode()
            .ok_or_else(|| BackendError::Device("cuBLASLt FP8: scale mode not probed".into()))?;
        let (p, key) = Self::problem(ops, mode, out_type, dims)?;
        // SAFETY: the caller's contract; `p` is made for these operands.
        let count = super::gemm_lt::MAX_CANDIDATES;
        unsafe { lt.candidate_times(stream, &p, key, ops.lt(), count, timer) }
    }
}
