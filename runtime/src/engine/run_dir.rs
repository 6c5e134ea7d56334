//! Where a running engine keeps its files: a run directory under sov's state directory
//! (`$SOV_STATE_DIR`, else `$XDG_STATE_HOME/sov`, else `~/.local/state/sov`), holding the slot file;
//! `state/current-run` names the newest run so `sov slots` finds it without arguments.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::EngineError;

/// sov's state directory (not created).
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SOV_STATE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("sov");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".local/state/sov")
}

fn io_err(path: &Path, e: std::io::Error) -> EngineError {
    EngineError::SlotFile {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// The file naming the newest run directory.
pub fn current_run_pointer() -> PathBuf {
    state_dir().join("current-run")
}

/// Creates a fresh run directory `state/runs/<unix-secs>-<pid>` and points `current-run` at it.
pub fn create_run_dir() -> Result<PathBuf, EngineError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = state_dir()
        .join("runs")
        .join(format!("{secs}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let pointer = current_run_pointer();
    std::fs::write(&pointer, dir.display().to_string()).map_err(|e| io_err(&pointer, e))?;
    Ok(dir)
}

/// The newest run directory, as `current-run` names it.
pub fn current_run_dir() -> Result<PathBuf, EngineError> {
    let pointer = current_run_pointer();
    let text = std::fs::read_to_string(&pointer).map_err(|e| io_err(&pointer, e))?;
    Ok(PathBuf::from(text.trim()))
}

/// The slot file of a run directory.
pub fn slot_path(run_dir: &Path) -> PathBuf {
    run_dir.join("slots")
}
