//! cuBLASLt products with an algorithm chosen per shape: the handle, workspace and algorithm
//! choices shared by the bf16 products of fast mode ([`super::gemm`]) and the FP8 ones
//! ([`super::gemm_fp8`]).
//!
//! Design: a product is a [`LtProblem`] (sov's "TN" layout) run with one algorithm. With more
//! than one candidate ([`super::CudaTuning::gemm_candidates`]) the first product of a shape that
//! runs outside a stream capture times the heuristic's first candidates on its own buffers and
//! keeps the fastest ([`super::gemm_tune`]); a row count of a class already tuned takes the
//! class's algorithm where cuBLASLt accepts it. The choices are process-wide, per device: every
//! backend of a process on one GPU multiplies a shape with the same algorithm (so two engines in
//! one process give the same bits), and each shape is timed once. With one candidate each
//! backend takes the heuristic's first pick, untimed: the same algorithm in every run.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{LazyLock, Mutex, MutexGuard};

use cudarc::cublaslt::{result as lt, sys};

use super::buffer::CudaBuffer;
use super::gemm_tune::{KernelTimer, pick, row_class};
use super::lt_problem::LtProblem;
use crate::backend::BackendError;

/// Workspace bytes an algorithm may use (NVIDIA's recommendation for Hopper).
pub(super) const LT_WORKSPACE_BYTES: usize = 32 << 20;

/// Most heuristic candidates a shape's tuning times.
pub(super) const MAX_CANDIDATES: usize = 16;

/// The element types and scaling of a product, part of what its algorithm is chosen for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum LtKind {
    /// bf16 x bf16, f32 out.
    Bf16,
    /// e4m3 x e4m3, with cuBLASLt's outer-vector scales or unit ones, f32 or bf16 out.
    Fp8 { outer_vector: bool, bf16_out: bool },
}

/// What an algorithm is chosen for: `(m, n, k)` (weight rows, input rows, depth) and the kind.
pub(super) type LtKey = (usize, usize, usize, LtKind);

/// A product's device addresses: `out[n, m] = x[n, k] @ w[m, k]^T`.
#[derive(Debug, Clone, Copy)]
pub(super) struct LtOperands {
    pub(super) w: u64,
    pub(super) x: u64,
    pub(super) out: u64,
}

type Algo = sys::cublasLtMatmulAlgo_t;

/// The timed choices of a process, per device ordinal and shape (and per row class).
#[derive(Default)]
struct Choices {
    shapes: HashMap<(usize, LtKey), Algo>,
    classes: HashMap<(usize, LtKey), Algo>,
}

// SAFETY: an algorithm is plain data (64 bytes of configuration), not tied to a handle or thread.
unsafe impl Send for Choices {}

static CHOICES: LazyLock<Mutex<Choices>> = LazyLock::new(Mutex::default);

fn choices() -> Result<MutexGuard<'static, Choices>, BackendError> {
    CHOICES
        .lock()
        .map_err(|_| BackendError::Device("cuBLASLt algorithm choices poisoned".into()))
}

/// A cuBLASLt handle, its workspace and the heuristic's first picks of this backend.
pub(super) struct LtGemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaBuffer,
    /// Device ordinal: the key of the process-wide choices.
    ordinal: usize,
    /// Heuristic candidates timed per new shape (1: the first pick, untimed).
    candidates: usize,
    /// The heuristic's first pick per shape (with one candidate).
    firsts: Mutex<HashMap<LtKey, Algo>>,
}

// SAFETY: the handle is used only under the backend's stream order (one op at a time through
// `&CudaBackend`), and cuBLASLt handles may be used from any thread; the caches are behind
// mutexes.
unsafe impl Send for LtGemm {}
// SAFETY: as for Send.
unsafe impl Sync for LtGemm {}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_err(what: &str, e: lt::CublasError) -> BackendError {
    BackendError::Device(format!("cuBLASLt {what}: {e:?}"))
}

fn shape_name((m, n, k, kind): LtKey) -> String {
    format!("{n}x{k} @ {m}x{k}^T ({kind:?})")
}

impl LtGemm {
    /// A handle on device `ordinal` with `workspace` (at least [`LT_WORKSPACE_BYTES`] bytes of
    /// device memory) that times up to `candidates` of the heuristic's algorithms for each new
    /// product shape (clamped to 1..=[`MAX_CANDIDATES`]; 1: the heuristic's first pick, untimed).
    pub(super) fn new(
        workspace: CudaBuffer,
        ordinal: usize,
        candidates: usize,
    ) -> Result<Self, BackendError> {
        let handle = lt::create_handle().map_err(|e| lt_err("init", e))?;
        Ok(Self {
            handle,
            workspace,
            ordinal,
            candidates: candidates.clamp(1, MAX_CANDIDATES),
            firsts: Mutex::new(HashMap::new()),
        })
    }

    /// The heuristic's first `count` algorithms for `p` (at least one, else an error).
    fn heuristic(
        &self,
        p: &LtProblem,
        key: LtKey,
        count: usize,
    ) -> Result<Vec<Algo>, BackendError> {
        let count = count.clamp(1, MAX_CANDIDATES);
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
        let ws = LT_WORKSPACE_BYTES;
        // SAFETY: `pref` was just created; the value is a usize of the size given. The heuristic
        // reads descriptors alive for the call and writes at most `count` results into an array
        // of MAX_CANDIDATES >= count; an all-zero result struct is a valid value it overwrites.
        let found = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                size_of::<usize>(),
            );
            let mut results: [sys::cublasLtMatmulHeuristicResult_t; MAX_CANDIDATES] =
                std::mem::zeroed();
            let mut got: i32 = 0;
            let found = set.and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    p.desc,
                    p.a,
                    p.b,
                    p.c,
                    p.c,
                    pref,
                    count as i32,
                    results.as_mut_ptr(),
                    &mut got,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            found.map(|_| {
                results[..(got.max(0) as usize).min(count)]
                    .iter()
                    .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                    .map(|r| r.algo)
                    .collect::<Vec<_>>()
            })
        };
        let what = || format!("no algorithm for {}", shape_name(key));
        let found = found.map_err(|e| lt_err(&what(), e))?;
        if found.is_empty() {
            return Err(BackendError::Device(format!("cuBLASLt: {}", what())));
        }
        Ok(found)
    }

    /// Whether `algo` runs `p` within the workspace.
    fn accepts(&self, p: &LtProblem, algo: &Algo) -> bool {
        // SAFETY: descriptors and algorithm are live; an all-zero result struct is a valid value
        // the check overwrites.
        unsafe {
            let mut result: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let status = sys::cublasLtMatmulAlgoCheck(
                self.handle,
                p.desc,
                p.a,
                p.b,
                p.c,
                p.c,
                algo,
                &mut result,
            );
            status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && result.workspaceSize <= LT_WORKSPACE_BYTES
        }
    }

    /// The algorithm for `p` of shape `key`. With one candidate: the heuristic's first pick,
    /// cached per backend. Otherwise: the process's choice for the shape; else its row class's
    /// ([`row_class`] of `n`) where cuBLASLt accepts it for this shape; else, with a `timer`
    /// that can time now, the timed choice among the heuristic's first candidates (each run
    /// through `run`); else the heuristic's first pick, not kept (a stream capture cannot time:
    /// the next product of the shape outside one chooses).
    fn algo(
        &self,
        p: &LtProblem,
        key: LtKey,
        timer: Option<&dyn KernelTimer>,
        run: &mut dyn FnMut(&Algo) -> Result<(), BackendError>,
    ) -> Result<Algo, BackendError> {
        if self.candidates <= 1 {
            let mut firsts = self
                .firsts
                .lock()
                .map_err(|_| BackendError::Device("cuBLASLt algorithm cache poisoned".into()))?;
            if let Some(a) = firsts.get(&key) {
                return Ok(*a);
            }
            let first = self.heuristic(p, key, 1)?[0];
            firsts.insert(key, first);
            return Ok(first);
        }
        let (m, n, k, kind) = key;
        let (shape, class) = (
            (self.ordinal, key),
            (self.ordinal, (m, row_class(n), k, kind)),
        );
        {
            let mut chosen = choices()?;
            if let Some(a) = chosen.shapes.get(&shape) {
                return Ok(*a);
            }
            if let Some(a) = chosen.classes.get(&class).copied()
                && self.accepts(p, &a)
            {
                chosen.shapes.insert(shape, a);
                return Ok(a);
            }
        }
        let Some(timer) = timer.filter(|t| t.can_time()) else {
            return Ok(self.heuristic(p, key, 1)?[0]);
        };
        let found = self.heuristic(p, key, self.candidates)?;
        let chosen = if found.len() > 1 {
            let times: Vec<Option<f64>> = found
                .iter()
                .map(|a| timer.time_us(&mut || run(a)).ok())
                .collect();
            let chosen = pick(&times).unwrap_or(0);
            tracing::debug!(
                "cuBLASLt {}: candidate {chosen} of {} (us: {times:?})",
                shape_name(key),
                found.len()
            );
            chosen
        } else {
            0
        };
        let a = found[chosen];
        let mut kept = choices()?;
        kept.classes.entry(class).or_insert(a);
        Ok(*kept.shapes.entry(shape).or_insert(a))
    }

    /// Queues `p` with `algo` on `stream`: `out = x @ w^T + beta * out`.
    ///
    /// # Safety
    /// `p` must describe the buffers of `ops`, live until the product has run on `stream`.
    unsafe fn run(
        &self,
        stream: sys::cudaStream_t,
        p: &LtProblem,
        algo: &Algo,
        ops: LtOperands,
        beta: f32,
    ) -> Result<(), BackendError> {
        let alpha = 1.0f32;
        // SAFETY: descriptors and algorithm are live; the buffers are the caller's contract;
        // the workspace holds LT_WORKSPACE_BYTES, the most the heuristic was allowed.
        unsafe {
            lt::matmul(
                self.handle,
                p.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                ops.w as *const c_void,
                p.a,
                ops.x as *const c_void,
                p.b,
                ops.out as *const c_void,
                p.c,
                ops.out as *mut c_void,
                p.c,
                algo,
                self.workspace.ptr() as *mut c_void,
                LT_WORKSPACE_BYTES,
                stream,
            )
        }
        .map_err(|e| lt_err("matmul", e))
    }

    /// `out = x @ w^T + beta * out` for `p` of shape `key` on `stream`, with the shape's
    /// algorithm ([`Self::algo`]; a shape not seen before is timed through `timer` where `beta`
    /// is 0, since the candidates' runs overwrite `out`).
    ///
    /// # Safety
    /// `p` must describe the buffers of `ops`, live until the product has run on `stream`.
    pub(super) unsafe fn matmul(
        &self,
        stream: sys::cudaStream_t,
        p: &LtProblem,
        key: LtKey,
        ops: LtOperands,
        beta: f32,
        timer: Option<&dyn KernelTimer>,
    ) -> Result<(), BackendError> {
        let timer = timer.filter(|_| beta == 0.0);
        // SAFETY: the caller's contract on `p` and `ops`.
        let mut run = |a: &Algo| unsafe { self.run(stream, p, a, ops, 0.0) };
        let algo = self.algo(p, key, timer, &mut run)?;
        // SAFETY: as above.
        unsafe { self.run(stream, p, &algo, ops, beta) }
            .map_err(|e| BackendError::Device(format!("{e} ({})", shape_name(key))))
    }

    #[cfg(test)]
    /// Microseconds of each of the heuristic's first `count` candidates for `p` (`None` where one
    /// failed to run), in the heuristic's order, timed by `timer` (for benchmarks; each
    /// overwrites the output).
    ///
    /// # Safety
    /// As for [`Self::matmul`].
    pub(super) unsafe fn candidate_times(
        &self,
        stream: sys::cudaStream_t,
        p: &LtProblem,
        key: LtKey,
        ops: LtOperands,
        count: usize,
        timer: &dyn KernelTimer,
    ) -> Result<Vec<Option<f64>>, BackendError> {
        let found = self.heuristic(p, key, count)?;
        Ok(found
            .iter()
            // SAFETY: the caller's contract on `p` and `ops`.
            .map(|a| {
                timer
                    .time_us(&mut || unsafe { self.run(stream, p, a, ops, 0.0) })
                    .ok()
            })
            .collect())
    }
}
