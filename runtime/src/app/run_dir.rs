//! Where a running engine keeps its files: a run directory under sov's state directory
//! ([`super::dirs::SovDirs::state`]) holding the slot file and the checkpoint directory;
//! `<state>/current-run` names the newest run so `sov slots` finds it without arguments.
//!
//! Design: the journal in a run directory holds every prompt and answer, so run directories (and
//! the state directory above them) are created private to their owner (0700), and an existing one
//! that others can read is reported. A process using a run directory holds its [`RunLock`] (an
//! advisory lock on `<run>/lock`), so a second engine cannot resume the same run at the same time
//! and `sov runs prune` never deletes a run in use. A run directory that a process created for
//! itself and that ends holding nothing to resume or audit (checkpoints off: only the slot file
//! and the lock) is removed when that process releases it ([`RunLock::discard_when_released`]),
//! so benchmarks and `--checkpoint off` runs leave nothing behind.

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
    private_dir(state_dir)?;
    let runs = state_dir.join("runs");
    private_dir(&runs)?;
    let dir = runs.join(format!("{secs}-{}", std::process::id()));
    private_dir(&dir)?;
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

/// Creates `dir` (and missing parents) with mode 0700; an existing directory is kept as it is,
/// with a warning when group or others may read it (see [`is_shared`]).
pub fn private_dir(dir: &Path) -> Result<(), EngineError> {
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(io_err(dir, e)),
    }
    if is_shared(dir)? {
        tracing::warn!(
            "{} can be read by other users (mode {:o}); the journal in a run directory holds every prompt and answer: chmod 700 it",
            dir.display(),
            mode_of(dir)? & 0o777
        );
    }
    Ok(())
}

fn mode_of(path: &Path) -> Result<u32, EngineError> {
    Ok(std::fs::metadata(path)
        .map_err(|e| io_err(path, e))?
        .permissions()
        .mode())
}

/// Whether group or others have any access to `path`.
pub fn is_shared(path: &Path) -> Result<bool, EngineError> {
    Ok(mode_of(path)? & 0o077 != 0)
}

/// The lock file of a run directory.
pub fn lock_path(run_dir: &Path) -> PathBuf {
    run_dir.join("lock")
}

/// An exclusive advisory lock on a run directory, held while an engine uses it (released on drop
/// or when the process dies, however it dies).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    dir: PathBuf,
    /// Remove the directory on release if it holds only what the engine's start put there.
    discard: bool,
}

/// The files an engine without checkpoints leaves in its run directory: the slot file and the
/// lock. A directory holding anything else is never removed on release.
const SCRATCH_FILES: [&str; 2] = ["slots", "lock"];

impl RunLock {
    /// Takes the lock of `run_dir`, failing at once if another process holds it.
    pub fn acquire(run_dir: &Path) -> Result<Self, EngineError> {
        let path = lock_path(run_dir);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        match file.try_lock() {
            Ok(()) => Ok(Self {
                _file: file,
                dir: run_dir.to_path_buf(),
                discard: false,
            }),
            Err(TryLockError::WouldBlock) => Err(EngineError::SlotFile {
                path: run_dir.display().to_string(),
                reason: "the run directory is in use by another sov process".into(),
            }),
            Err(TryLockError::Error(e)) => Err(io_err(&path, e)),
        }
    }

    /// Whether some process holds `run_dir`'s lock now (false when it has none).
    pub fn is_held(run_dir: &Path) -> bool {
        let Ok(file) = File::open(lock_path(run_dir)) else {
            return false;
        };
        matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock))
    }

    /// The locked run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// On release, removes the run directory if it then holds only the slot file and the lock
    /// (nothing was journaled or checkpointed), and `<state>/current-run` if it names it. For a
    /// directory this process created for itself; one the user named is never removed.
    pub fn discard_when_released(&mut self) {
        self.discard = true;
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if self.discard {
            remove_scratch_run_dir(&self.dir);
        }
    }
}

/// Removes `dir` if it holds only `SCRATCH_FILES`, and the `current-run` pointer two levels up
/// if it names `dir`; anything else (a journal, a checkpoint, a file the user put there) keeps the
/// directory whole. Failures are logged, never raised: a leftover directory is harmless.
pub fn remove_scratch_run_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let names: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    if names.iter().any(|n| !SCRATCH_FILES.iter().any(|s| n == *s)) {
        tracing::debug!(
            "keeping run directory {}: it holds more than its slots",
            dir.display()
        );
        return;
    }
    for name in SCRATCH_FILES {
        let _ = std::fs::remove_file(dir.join(name));
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!("run directory {} not removed: {e}", dir.display());
        return;
    }
    if let Some(state) = dir.parent().and_then(Path::parent) {
        let pointer = current_run_pointer(state);
        if std::fs::read_to_string(&pointer).is_ok_and(|t| Path::new(t.trim()) == dir) {
            let _ = std::fs::remove_file(&pointer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dirs_are_private_and_locked_by_one_process_at_a_time() {
        let state = tempfile::tempdir().unwrap();
        let dir = create_run_dir(state.path()).unwrap();
        for d in [state.path().join("runs"), dir.clone()] {
            assert_eq!(mode_of(&d).unwrap() & 0o777, 0o700, "{}", d.display());
        }
        assert!(!RunLock::is_held(&dir));
        let lock = RunLock::acquire(&dir).unwrap();
        assert_eq!(mode_of(&lock_path(&dir)).unwrap() & 0o777, 0o600);
        assert!(RunLock::is_held(&dir));
        let err = RunLock::acquire(&dir).unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
        drop(lock);
        assert!(!RunLock::is_held(&dir));
        RunLock::acquire(&dir).unwrap();
    }

    #[test]
    fn a_discarded_run_directory_goes_only_when_it_holds_nothing_but_its_slots() {
        let state = tempfile::tempdir().unwrap();
        let empty = create_run_dir(state.path()).unwrap();
        std::fs::write(slot_path(&empty), [0u8; 128]).unwrap();
        let mut lock = RunLock::acquire(&empty).unwrap();
        lock.discard_when_released();
        drop(lock);
        assert!(!empty.exists(), "a run with nothing journaled is removed");
        assert!(!current_run_pointer(state.path()).exists());

        let kept = create_run_dir(state.path()).unwrap();
        std::fs::create_dir(checkpoint_dir(&kept)).unwrap();
        std::fs::write(checkpoint_dir(&kept).join("journal.log"), b"x").unwrap();
        let mut lock = RunLock::acquire(&kept).unwrap();
        lock.discard_when_released();
        drop(lock);
        assert!(checkpoint_dir(&kept).join("journal.log").exists());
        assert!(
            lock_path(&kept).exists(),
            "nothing of a run with a journal is removed"
        );
        assert_eq!(current_run_dir(state.path()).unwrap(), kept);

        let plain = create_run_dir(state.path()).unwrap();
        drop(RunLock::acquire(&plain).unwrap());
        assert!(
            lock_path(&plain).exists(),
            "without discard the directory stays"
        );
    }

    #[test]
    fn a_readable_directory_is_reported_as_shared() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(is_shared(d.path()).unwrap());
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!is_shared(d.path()).unwrap());
    }
}
