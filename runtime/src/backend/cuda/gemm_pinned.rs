//! Batch-invariant matrix products: cuBLASLt with one pinned algorithm per weight shape.
//!
//! Design (the deterministic mode of `kernels/docs/deterministic.md`): cuBLAS picks its kernel --
//! tile shape, K split, reduction -- from the problem size, so a token's row of `x @ w^T` rounds
//! differently at different batch sizes. Here the algorithm of each weight shape `(m, k)` is chosen
//! once, by cuBLASLt's heuristic for a product of [`super::CudaTuning::deterministic_gemm_rows`]
//! rows, and then used for every row count. A fixed algorithm fixes the tile, the K split and the
//! order in which each output element's K chunks are accumulated; the row count only decides how
//! many column tiles run, so an output row does not depend on how many rows share the launch
//! (`deterministic_tests.rs` checks it bit for bit for 1..=256 rows and more up to 2048). The
//! pinned algorithm is the first candidate that does not split K: on the H200 every such cuBLASLt
//! algorithm gave the bits of one chain of m16n8k16 steps over K
//! (kernels/bench/logs/det-probe-2026-12-03T0457.log), so [`PinnedGemm::candidate`] may offer the
//! fastest one for each row count, which the caller (`gemm.rs`) uses once a probe product shows its
//! bits equal the reference chain's. bf16 operands, f32 accumulation and f32 output, in the layout
//! of [`super::gemm`]: cuBLAS's `C[m, n] = op(W)[m, k] · X[k, n]` with `W` transposed.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lt, sys};

use super::buffer::CudaBuffer;
use super::lt_problem::LtProblem;
use super::product_dims::{ProductDims, WeightSlice};
use crate::backend::BackendError;

/// Workspace bytes a pinned algorithm may use (NVIDIA's recommendation for Hopper).
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

/// Most rows one launch of a pinned algorithm takes; longer products run in launches of this
/// many rows (the same rows, so the same results). On the H200 every Llama-3-8B product ran at
/// each of 1..=256 rows with the algorithms picked at 128 rows, while the down projection's
/// (k = 14336) rejected 2048 rows with CUBLAS_STATUS_INVALID_VALUE
/// (gpu-exactness-2026-12-01T1803.log, not kept).
pub(super) const MAX_LAUNCH_ROWS: usize = 256;

/// Most rows one launch of a per-row-count candidate ([`PinnedGemm::candidate`]) takes: the
/// heuristic chose it for that many rows (or fewer), and it does not split K, so it needs no
/// workspace growing with the rows. Wider launches keep the GPU busy at decode batches of
/// 257..=1024, where launches of [`MAX_LAUNCH_ROWS`] rows leave too few output tiles to fill it
/// and read every weight once per launch.
pub(super) const CANDIDATE_LAUNCH_ROWS: usize = 1024;

/// A cuBLASLt handle, its workspace and the pinned algorithm of each weight shape.
pub(super) struct PinnedGemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaBuffer,
    /// The heuristic's rows for choosing an algorithm.
    pick_rows: usize,
    algos: Mutex<HashMap<WeightSlice, sys::cublasLtMatmulAlgo_t>>,
    /// Per weight shape: whether the pinned algorithm's bits equalled the reference chain's
    /// (`det_mma_16` in `gemv.cu`) on the probe product (see [`super::gemm`]).
    pinned_chain: Mutex<HashMap<WeightSlice, bool>>,
    /// Per weight shape and rows: the heuristic's first candidate for `rows` rows that does not
    /// split K.
    per_rows: Mutex<HashMap<(WeightSlice, usize), Option<sys::cublasLtMatmulAlgo_t>>>,
    /// Per weight shape and algorithm bytes: whether that algorithm's bits equalled the reference
    /// chain.
    verified: Mutex<HashMap<AlgoKey, bool>>,
}

/// A weight shape and an algorithm's opaque bytes.
type AlgoKey = (WeightSlice, [u64; 8]);

/// Heuristic candidates read for a weight shape; the pinned one is the first whose K is not split
/// (see [`PinnedGemm::algo`]), or the first if none is.
const CANDIDATES: usize = 8;

/// The split-K factor of `algo` (1: each output element one accumulation chain over K).
fn split_k(algo: &sys::cublasLtMatmulAlgo_t) -> Option<u32> {
    let mut v: u32 = 0;
    let mut written = 0usize;
    // SAFETY: `algo` is a valid algorithm from the heuristic; the buffer is a u32, the attribute's
    // type (uint32_t), of the size given.
    let s = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            (&mut v) as *mut u32 as *mut c_void,
            size_of::<u32>(),
            &mut written,
        )
    };
    (s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
}

// SAFETY: the handle is used only under the backend's stream order (one op at a time through
// `&CudaBackend`, whose ops are not reentrant), and cuBLASLt handles may be used from any thread;
// the algorithm cache is behind a mutex.
unsafe impl Send for PinnedGemm {}
// SAFETY: as for Send: shared use goes through the mutex or through cuBLASLt calls that only
// read the handle.
unsafe impl Sync for PinnedGemm {}

impl Drop for PinnedGemm {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_err(what: &str, e: lt::CublasError) -> BackendError {
    BackendError::Device(format!("cuBLASLt {what}: {e:?}"))
}

impl PinnedGemm {
    /// A handle with `workspace` (at least [`WORKSPACE_BYTES`] bytes of device memory) choosing
    /// algorithms at `pick_rows` rows.
    pub(super) fn new(workspace: CudaBuffer, pick_rows: usize) -> Result<Self, BackendError> {
        let handle = lt::create_handle().map_err(|e| lt_err("init", e))?;
        Ok(Self {
            handle,
            workspace,
            pick_rows: pick_rows.max(1),
            algos: Mutex::new(HashMap::new()),
            pinned_chain: Mutex::new(HashMap::new()),
            per_rows: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
        })
    }

    /// Whether weight shape `w`'s pinned algorithm gave the reference chain's bits
    /// (`det_mma_16` in `gemv.cu`) on the probe product: `None` until decided
    /// ([`Self::set_chain_ok`]).
    pub(super) fn chain_ok(&self, w: WeightSlice) -> Result<Option<bool>, BackendError> {
        let verdicts = self
            .pinned_chain
            .lock()
            .map_err(|_| BackendError::Device("reference-chain cache poisoned".into()))?;
        Ok(verdicts.get(&w).copied())
    }

    /// Records [`Self::chain_ok`] for weight shape `w` (decided once per process).
    pub(super) fn set_chain_ok(&self, w: WeightSlice, on: bool) -> Result<(), BackendError> {
        self.pinned_chain
            .lock()
            .map_err(|_| BackendError::Device("reference-chain cache poisoned".into()))?
            .insert(w, on);
        Ok(())
    }

    /// The heuristic's first algorithm for a product of `rows` rows of weight shape `w` that does
    /// not split K (None: none among its first [`CANDIDATES`]). Every such algorithm seen on the
    /// H200 gave the bits of one chain of m16n8k16 steps over K (kernels/docs/deterministic.md), so
    /// the caller may use it in place of the pinned one once [`Self::verified`] says so.
    pub(super) fn candidate(
        &self,
        w: WeightSlice,
        rows: usize,
    ) -> Result<Option<sys::cublasLtMatmulAlgo_t>, BackendError> {
        let poisoned = || BackendError::Device("cuBLASLt candidate cache poisoned".into());
        if let Some(c) = self
            .per_rows
            .lock()
            .map_err(|_| poisoned())?
            .get(&(w, rows))
        {
            return Ok(*c);
        }
        let got = self.heuristic(w, rows, false)?;
        let pick = got.iter().copied().find(|a| split_k(a) == Some(1));
        self.per_rows
            .lock()
            .map_err(|_| poisoned())?
            .insert((w, rows), pick);
        Ok(pick)
    }

    /// Whether `algo` gave the reference chain's bits for weight shape `w` (None: untested).
    pub(super) fn verified(
        &self,
        w: WeightSlice,
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> Result<Option<bool>, BackendError> {
        let v = self
            .verified
            .lock()
            .map_err(|_| BackendError::Device("cuBLASLt verification cache poisoned".into()))?;
        Ok(v.get(&(w, algo.data)).copied())
    }

    /// Records whether `algo` gave the reference chain's bits for weight shape `w`.
    pub(super) fn set_verified(
        &self,
        w: WeightSlice,
        algo: &sys::cublasLtMatmulAlgo_t,
        ok: bool,
    ) -> Result<(), BackendError> {
        self.verified
            .lock()
            .map_err(|_| BackendError::Device("cuBLASLt verification cache poisoned".into()))?
            .insert((w, algo.data), ok);
        Ok(())
    }

    /// The split-K factor of weight shape `w`'s pinned algorithm (choosing it if needed).
    pub(super) fn pinned_split_k(&self, w: WeightSlice) -> Result<Option<u32>, BackendError> {
        Ok(split_k(&self.algo(w)?))
    }

    /// The pinned algorithm of weight shape `w`, chosen on first use: the heuristic's first
    /// candidate for `pick_rows` rows that does not split K, or its first if all do.
    fn algo(&self, w: WeightSlice) -> Result<sys::cublasLtMatmulAlgo_t, BackendError> {
        let mut algos = self
            .algos
            .lock()
            .map_err(|_| BackendError::Device("cuBLASLt algorithm cache poisoned".into()))?;
        if let Some(a) = algos.get(&w) {
            return Ok(*a);
        }
        let got = self.heuristic(w, self.pick_rows, true)?;
        // The first candidate that does not split K: each output element is then one chain of
        // k16 tensor-core steps, the order of the reference kernel (det_mma in gemv.cu).
        let found = got
            .iter()
            .find(|a| split_k(a) == Some(1))
            .or(got.first())
            .copied()
            .ok_or_else(|| BackendError::Device(format!("cuBLASLt: no algorithm for {w}")))?;
        algos.insert(w, found);
        Ok(found)
    }

    /// The heuristic's first [`CANDIDATES`] algorithms for `rows` rows of weight shape `w`;
    /// with `inplace_only`, split-K only with the in-place reduction (the splits added into the
    /// output in order, counters in the workspace): a reduction through a workspace buffer needs
    /// room growing with the row count, so an algorithm picked at `pick_rows` could not run a
    /// long prefill (2048 rows of the 14336-wide down projection failed so).
    fn heuristic(
        &self,
        w: WeightSlice,
        rows: usize,
        inplace_only: bool,
    ) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, BackendError> {
        let WeightSlice { m, k, ld } = w;
        let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
        let p = LtProblem::tn_strided((m, rows, k), ld, bf16, "cuBLASLt")?;
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
        let ws = WORKSPACE_BYTES;
        // SAFETY: `pref` was just created; the buffers are a usize and a u32, of the sizes given.
        // The heuristic reads descriptors created above, alive for the call, and writes at most
        // CANDIDATES results; an all-zero result struct is a valid value it overwrites.
        let found = unsafe {
            let mut set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                size_of::<usize>(),
            );
            let mask = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_INPLACE as u32;
            if inplace_only {
                set = set.and_then(|_| {
                    lt::set_matmul_pref_attribute(
                        pref,
                        sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                        (&mask) as *const u32 as *const c_void,
                        size_of::<u32>(),
                    )
                });
            }
            let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
                std::mem::zeroed();
            let mut count: i32 = 0;
            let found = set.and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    p.desc,
                    p.a,
                    p.b,
                    p.c,
                    p.c,
                    pref,
                    CANDIDATES as i32,
                    results.as_mut_ptr(),
                    &mut count,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            found.map(|_| {
                results[..(count.max(0) as usize).min(CANDIDATES)]
                    .iter()
                    .map(|r| r.algo)
                    .collect::<Vec<_>>()
            })
        }
        .map_err(|e| lt_err(&format!("no algorithm for {rows} rows @ {w}"), e))?;
        Ok(found)
    }

    /// `out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16) + beta * out` on `stream` with `algo`
    /// (one of [`Self::candidate`]'s, verified by the caller) or else the pinned algorithm of
    /// the weight shape, in launches of at most [`CANDIDATE_LAUNCH_ROWS`] rows with `algo` (it was
    /// chosen for that many) or [`MAX_LAUNCH_ROWS`] with the pinned algorithm. Rows of `x` and `w`
    /// lie `dims.ld` elements apart.
    ///
    /// # Safety
    /// `x`, `w` and `out` must be device addresses of at least `(n-1)*ld + k`, `(m-1)*ld + k` bf16
    /// and `n*m` f32 elements, live until the product has run on `stream`.
    pub(super) unsafe fn matmul(
        &self,
        stream: sys::cudaStream_t,
        (x, w, out): (u64, u64, u64),
        dims: ProductDims,
        beta: f32,
        algo: Option<sys::cublasLtMatmulAlgo_t>,
    ) -> Result<(), BackendError> {
        let ProductDims { n, k, m, ld } = dims;
        let (algo, launch_rows) = match algo {
            Some(a) => (a, CANDIDATE_LAUNCH_ROWS),
            None => (self.algo(dims.weight())?, MAX_LAUNCH_ROWS),
        };
        let alpha = 1.0f32;
        for row0 in (0..n).step_by(launch_rows) {
            let rows = launch_rows.min(n - row0);
            let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
            let p = LtProblem::tn_strided((m, rows, k), ld, bf16, "cuBLASLt")?;
            let (xs, outs) = (x + (row0 * ld * 2) as u64, out + (row0 * m * 4) as u64);
            // SAFETY: descriptors and algorithm are live; rows row0..row0 + rows of x (bf16) and
            // out (f32) lie inside the caller's buffers (its contract); the workspace holds
            // WORKSPACE_BYTES, the most the heuristic was allowed.
            unsafe {
                lt::matmul(
                    self.handle,
                    p.desc,
                    (&alpha) as *const f32 as *const c_void,
                    (&beta) as *const f32 as *const c_void,
                    w as *const c_void,
                    p.a,
                    xs as *const c_void,
                    p.b,
                    outs as *const c_void,
                    p.c,
                    outs as *mut c_void,
                    p.c,
                    &algo,
                    self.workspace.ptr() as *mut c_void,
                    WORKSPACE_BYTES,
                    stream,
                )
            }
            .map_err(|e| lt_err(&format!("matmul ({rows}x{k} @ {m}x{k}^T)"), e))?;
        }
        Ok(())
    }
}
