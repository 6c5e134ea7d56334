//! What a run's signed heads say it ran on: the backend and precision of its newest head, and
//! from the precision the deterministic order (attention split length, parts of K) that a resume
//! or a replay of the run must keep, whatever this build's defaults.
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
    let Some(run) = resume else { return Ok(None) };
    let dir = super::run_dir::checkpoint_dir(run);
    if !dir.is_dir() {
        return Ok(None); // starting the engine says what is wrong with the directory
    }
    Ok(signed_platform(&dir)?
        .precision
        .as_deref()
        .and_then(CudaTuning::deterministic_order))
}
