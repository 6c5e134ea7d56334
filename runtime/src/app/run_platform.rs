//! What a run's signed heads say it ran on: the backend and precision of its newest head, and
//! from the precision the deterministic order (attention split length, parts of K) and the KV
//! cache's format that a resume or a replay of the run must keep, whatever this build's defaults.
//!
//! Design: the heads are the record (`sov audit` verifies them); these read the newest head
//! without verifying it, to choose how to start, and a head that does not parse is an error
//! rather than a silent default.

use std::path::Path;

use crate::backend::cuda::CudaTuning;
use crate::checkpoint::{CheckpointError, Platform, newest_platform, tlog};

/// The backend and precision the newest signed head of the checkpoint directory `dir` names
/// (all `None`: no head yet, or heads from before they named their platform).
pub fn signed_platform(dir: &Path) -> Result<Platform, CheckpointError> {
    newest_platform(&tlog::scan(dir)?)
}

/// The deterministic order (attention split length, parts of K) the newest signed head of the
/// run directory `resume` names, so that a resumed run keeps the arithmetic it started with
/// (None: no run to resume, no checkpoint directory yet, or not a deterministic run).
pub fn resume_order(resume: Option<&Path>) -> Result<Option<(usize, usize)>, CheckpointError> {
    Ok(resume_precision(resume)?
        .as_deref()
        .and_then(CudaTuning::deterministic_order))
}

/// Whether the newest signed head of the run directory `resume` names an e4m3 KV cache
/// ([`CudaTuning::names_kv_e4m3`]), which a resumed run then keeps unless told otherwise.
pub fn resume_kv_e4m3(resume: Option<&Path>) -> Result<bool, CheckpointError> {
    Ok(resume_precision(resume)?
        .as_deref()
        .is_some_and(CudaTuning::names_kv_e4m3))
}

/// The precision the newest signed head of the run directory `resume` names (None: no run to
/// resume, no checkpoint directory yet, or no precision named).
fn resume_precision(resume: Option<&Path>) -> Result<Option<String>, CheckpointError> {
    let Some(run) = resume else { return Ok(None) };
    let dir = super::run_dir::checkpoint_dir(run);
    if !dir.is_dir() {
        return Ok(None); // starting the engine says what is wrong with the directory
    }
    Ok(signed_platform(&dir)?.precision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointStore;
    use crate::checkpoint::fixture::{MODEL, SPEC, finished, key, request};
    use crate::engine::draw::DRAW_RULE;

    /// A run directory whose heads name `precision` on CUDA (one finished request, one head).
    fn run_on(precision: &str) -> tempfile::TempDir {
        let run = tempfile::tempdir().unwrap();
        let platform = Platform {
            backend: Some("cuda".into()),
            precision: Some(precision.into()),
            sampler: Some(DRAW_RULE.into()),
        };
        let dir = super::super::run_dir::checkpoint_dir(run.path());
        let mut store = CheckpointStore::open_on(&dir, key(), SPEC, MODEL, None, platform).unwrap();
        store.accept(&request(1)).unwrap();
        store.finish(&[finished(1, "x")]).unwrap();
        run
    }

    #[test]
    fn a_resume_keeps_the_order_its_heads_name() {
        assert_eq!(resume_order(None).unwrap(), None);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            resume_order(Some(empty.path())).unwrap(),
            None,
            "no checkpoints yet"
        );
        let run = run_on("bf16-deterministic-split256-ksplit2");
        assert_eq!(resume_order(Some(run.path())).unwrap(), Some((256, 2)));
        let run = run_on("bf16-deterministic");
        assert_eq!(resume_order(Some(run.path())).unwrap(), Some((128, 1)));
        assert!(!resume_kv_e4m3(Some(run.path())).unwrap());
        let run = run_on("bf16-deterministic-split256-ksplit2-kvfp8");
        assert_eq!(resume_order(Some(run.path())).unwrap(), Some((256, 2)));
        assert!(resume_kv_e4m3(Some(run.path())).unwrap());
        assert!(!resume_kv_e4m3(None).unwrap());
        let run = run_on("fp8-w8a8-bf16edges1");
        assert_eq!(resume_order(Some(run.path())).unwrap(), None);
        let dir = super::super::run_dir::checkpoint_dir(run.path());
        assert_eq!(
            signed_platform(&dir).unwrap().precision.as_deref(),
            Some("fp8-w8a8-bf16edges1")
        );
    }
}
