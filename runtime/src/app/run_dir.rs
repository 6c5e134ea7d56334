//! Where a running engine keeps its files: a run directory under sov's state directory
//! ([`super::dirs::SovDirs::state`]) holding the slot file and the checkpoint directory;
//! `<state>/current-run` names the newest run so `sov slots` finds it without arguments.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::engine::EngineError;

fn io_err(path: &Path, e: std::io::Error) -> EngineError {
    EngineError::SlotFile {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// The file naming the newest run directory.
pub fn current_run_pointer(state_dir: &Path) -> PathBuf {
    state_dir.join("current-run")
}

/// Creates a fresh run directory `<state_dir>/runs/<unix-secs>-<pid>` and points `current-run` at
/// it.
pub fn create_run_dir(state_dir: &Path) -> Result<PathBuf, EngineError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = state_dir
        .join("runs")
        .join(format!("{secs}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let pointer = current_run_pointer(state_dir);
    std::fs::write(&pointer, dir.display().to_string()).map_err(|e| io_err(&pointer, e))?;
    Ok(dir)
}

/// The newest run directory, as `current-run` names it.
pub fn current_run_dir(state_dir: &Path) -> Result<PathBuf, EngineError> {
    let pointer = current_run_pointer(state_dir);
    let text = std::fs::read_to_string(&pointer).map_err(|e| io_err(&pointer, e))?;
    Ok(PathBuf::from(text.trim()))
}

/// The checkpoint directory inside a run directory.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// The slot file of a run directory.
pub fn slot_path(run_dir: &Path) -> PathBuf {
    run_dir.join("slots")
}
