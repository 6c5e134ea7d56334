//! FP8 products through cuBLASLt: e4m3 x e4m3, f32 accumulation, f32 output.
//!
//! Design: the layout of [`super::gemm`] (cuBLAS's `C[m, n] = op(W)[m, k] · X[k, n]` with `W`
//! transposed, the "TN" form Hopper's FP8 kernels require). The scales of the W8A8 scheme
//! (`fp8.cu`) are one f32 per weight row and one per input row, which is cuBLASLt's outer-vector
//! scale mode (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`, cuBLAS 12.9+): `A_SCALE_POINTER` gets
//! the `[m]` weight scales and `B_SCALE_POINTER` the `[n]` input scales, and the product comes out
//! scaled. Where this cuBLASLt refuses that mode (no algorithm from its heuristic), the product
//! runs with unit scales ([`ScaleMode::Unit`]) and the caller rescales it (`fp8_rescale`): one
//! more pass over the output. The mode that worked is remembered for the process; the algorithm of
//! each `(m, n, k)` is the heuristic's first pick, cached.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lt, sys};

use super::buffer::CudaBuffer;
use super::lt_problem::LtProblem;
use crate::backend::BackendError;

/// Workspace bytes an algorithm may use (NVIDIA's recommendation for Hopper).
pub(super) const FP8_WORKSPACE_BYTES: usize = 32 << 20;

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
    algos: Mutex<HashMap<(usize, usize, usize, ScaleMode), sys::cublasLtMatmulAlgo_t>>,
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

/// The descriptors of an FP8 product: `C[m, n] (f32) = W^T · X` with `W: [k, m]` e4m3 (ld k),
/// `X: [k, n]` e4m3 (ld k); with `scales = Some((sw, sx))` in outer-vector mode, `sw` `[m]` and
/// `sx` `[n]` f32.
fn fp8_problem(
    dims: (usize, usize, usize),
    scales: Option<(u64, u64)>,
) -> Result<LtProblem, BackendError> {
    let p = LtProblem::tn(dims, sys::cudaDataType_t::CUDA_R_8F_E4M3, "cuBLASLt FP8")?;
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
        })
    }

    /// The scale mode products use, once the first one has found it (`None` before).
    pub(super) fn mode(&self) -> Option<ScaleMode> {
        self.mode.lock().ok().and_then(|m| *m)
    }

    /// The heuristic's algorithm for `p` of shape `key`, cached.
    fn algo(
        &self,
        p: &LtProblem,
        key: (usize, usize, usize, ScaleMode),
    ) -> Result<sys::cublasLtMatmulAlgo_t, BackendError> {
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
            let (m, n, k, mode) = key;
            lt_err(
                &format!("no algorithm for {n}x{k} @ {m}x{k}^T ({mode:?})"),
                e,
            )
        })?;
        algos.insert(key, found.algo);
        Ok(found.algo)
    }

    /// `out[n, m] (f32) = qx[n, k] @ qw[m, k]^T` (e4m3) on `stream`, scaled by `sw` `[m]` and `sx`
    /// `[n]` where the returned mode is [`ScaleMode::OuterVector`]; unscaled (the caller
    /// rescales) where it is [`ScaleMode::Unit`].
    ///
    /// # Safety
    /// The addresses must be device buffers of at least `n*k` (`qx`), `m*k` (`qw`) bytes, `n`
    /// (`sx`), `m` (`sw`) and `n*m` (`out`) f32, live until the product has run on `stream`;
    /// `k % 16 == 0` and `m % 4 == 0` (cuBLASLt's FP8 alignment).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        &self,
        stream: sys::cudaStream_t,
        (qx, sx): (u64, u64),
        (qw, sw): (u64, u64),
        out: u64,
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
            let scales = (mode == ScaleMode::OuterVector).then_some((sw, sx));
            let p = fp8_problem((m, n, k), scales)?;
            let algo = match self.algo(&p, (m, n, k, mode)) {
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
