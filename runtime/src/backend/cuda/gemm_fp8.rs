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
//! ([`Fp8Gemm::probe`]), so every product of a run takes the same mode; the algorithm of each
//! `(m, n, k, output)` is the heuristic's first pick, cached. A bf16 output ([`Fp8Out::Bf16`],
//! the gate/up product's, `fp8.rs`) is the scaled f32 result rounded once, so it exists only in
//! outer-vector mode.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::cublaslt::{result as lt, sys};

use super::buffer::CudaBuffer;
use super::lt_problem::LtProblem;
use crate::backend::BackendError;

/// Workspace bytes an algorithm may use (NVIDIA's recommendation for Hopper).
pub(super) const FP8_WORKSPACE_BYTES: usize = 32 << 20;

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

/// A cuBLASLt handle, its workspace and the algorithms found so far.
pub(super) struct Fp8Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaBuffer,
    /// `None` until the first product found which mode this cuBLASLt supports.
    mode: Mutex<Option<ScaleMode>>,
    algos: Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>>,
    /// Whether [`Self::probe`] ran a bf16-output product.
    bf16_out: AtomicBool,
}

// SAFETY: the handle is used only under the backend's stream order (one op at a time through
// `&CudaBackend`), and cuBLASLt handles may be used from any thread; the caches are behind
// mutexes.
unsafe impl Send for Fp8Gemm {}
// SAFETY: as for Send.
unsafe impl Sync for Fp8Gemm {}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_err(what: &str, e: lt::CublasError) -> BackendError {
    BackendError::Device(format!("cuBLASLt FP8 {what}: {e:?}"))
}

/// What an algorithm is cached by: `(m, n, k)`, the scale mode and the output type.
type AlgoKey = (usize, usize, usize, ScaleMode, Fp8Out);

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
    /// A handle with `workspace` (at least [`FP8_WORKSPACE_BYTES`] bytes of device memory).
    pub(super) fn new(workspace: CudaBuffer) -> Result<Self, BackendError> {
        let handle = lt::create_handle().map_err(|e| lt_err("init", e))?;
        Ok(Self {
            handle,
            workspace,
            mode: Mutex::new(None),
            algos: Mutex::new(HashMap::new()),
            bf16_out: AtomicBool::new(false),
        })
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
        stream: sys::cudaStream_t,
        zeros: u64,
    ) -> Result<(), BackendError> {
        // [16, 16] e4m3 input and weight, [16] f32 scales each, [16, 16] f32 (or bf16) output.
        let (qx, sx, qw, sw, out) = (zeros, zeros + 256, zeros + 512, zeros + 768, zeros + 1024);
        let dims = (16, 16, 16);
        // SAFETY: the caller's contract on `zeros`; each piece is as large as the product needs.
        let mode = unsafe { self.matmul(stream, (qx, sx), (qw, sw), (out, Fp8Out::F32), dims)? };
        if mode == ScaleMode::OuterVector {
            // SAFETY: as above (the bf16 output takes half the f32 one's bytes).
            let bf16 =
                unsafe { self.matmul(stream, (qx, sx), (qw, sw), (out, Fp8Out::Bf16), dims) };
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

    /// The heuristic's algorithm for `p` of shape `key`, cached.
    fn algo(&self, p: &LtProblem, key: AlgoKey) -> Result<sys::cublasLtMatmulAlgo_t, BackendError> {
        let mut algos = self
            .algos
            .lock()
            .map_err(|_| BackendError::Device("cuBLASLt FP8 algorithm cache poisoned".into()))?;
        if let Some(a) = algos.get(&key) {
            return Ok(*a);
        }
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
        let ws = FP8_WORKSPACE_BYTES;
        // SAFETY: `pref` was just created; the value is a usize of the size given. The heuristic
        // reads descriptors alive for the call.
        let found = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                size_of::<usize>(),
            );
            let found = set.and_then(|_| {
                lt::get_matmul_algo_heuristic(self.handle, p.desc, p.a, p.b, p.c, p.c, pref)
            });
            let _ = lt::destroy_matmul_pref(pref);
            found
        }
        .map_err(|e| {
            let (m, n, k, mode, out) = key;
            lt_err(
                &format!("no algorithm for {n}x{k} @ {m}x{k}^T ({mode:?}, {out:?} out)"),
                e,
            )
        })?;
        algos.insert(key, found.algo);
        Ok(found.algo)
    }

    /// `out[n, m] = qx[n, k] @ qw[m, k]^T` (e4m3) on `stream`, in f32 or (`out_type`
    /// [`Fp8Out::Bf16`], outer-vector mode only) bf16, scaled by `sw` `[m]` and `sx` `[n]` where
    /// the returned mode is [`ScaleMode::OuterVector`]; unscaled (the caller rescales) where it is
    /// [`ScaleMode::Unit`].
    ///
    /// # Safety
    /// The addresses must be device buffers of at least `n*k` (`qx`), `m*k` (`qw`) bytes, `n`
    /// (`sx`), `m` (`sw`) f32 and `n*m` (`out`) elements of `out_type`, live until the product
    /// has run on `stream`; `k % 16 == 0` and `m % 4 == 0` (cuBLASLt's FP8 alignment).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        &self,
        stream: sys::cudaStream_t,
        (qx, sx): (u64, u64),
        (qw, sw): (u64, u64),
        (out, out_type): (u64, Fp8Out),
        (n, k, m): (usize, usize, usize),
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
            let scales = (mode == ScaleMode::OuterVector).then_some((sw, sx));
            let p = fp8_problem((m, n, k), scales, out_type)?;
            let algo = match self.algo(&p, (m, n, k, mode, out_type)) {
                Ok(a) => a,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: descriptors and algorithm are live; the buffers are the caller's contract;
            // the workspace holds FP8_WORKSPACE_BYTES, the most the heuristic was allowed.
            let run = unsafe {
                lt::matmul(
                    self.handle,
                    p.desc,
                    (&alpha) as *const f32 as *const c_void,
                    (&beta) as *const f32 as *const c_void,
                    qw as *const c_void,
                    p.a,
                    qx as *const c_void,
                    p.b,
                    out as *const c_void,
                    p.c,
                    out as *mut c_void,
                    p.c,
                    &algo,
                    self.workspace.ptr() as *mut c_void,
                    FP8_WORKSPACE_BYTES,
                    stream,
                )
            };
            match run {
                Ok(()) => {
                    if known.is_none()
                        && let Ok(mut slot) = self.mode.lock()
                    {
                        tracing::info!("cuBLASLt FP8 products: scales {mode:?}");
                        *slot = Some(mode);
                    }
                    return Ok(mode);
                }
                Err(e) => last_err = Some(lt_err(&format!("matmul ({n}x{k} @ {m}x{k}^T)"), e)),
            }
        }
        Err(last_err.unwrap_or_else(|| BackendError::Device("cuBLASLt FP8: no mode".into())))
    }
}
