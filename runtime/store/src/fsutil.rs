//! Small durable-file helpers: write-once files (temp, fsync, rename, fsync directory) and
//! append-then-fsync for the append-only logs.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use super::error::{CheckpointError, Result};

/// Suffix of files being written; a leftover one is the trace of a torn write.
pub const TMP_SUFFIX: &str = ".tmp";

/// fsync a directory so renames and creations inside it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io(dir, e))
}

/// Create `path` with `bytes` exactly once: write `path.tmp`, fsync, rename, fsync the directory.
/// Refuses to replace an existing file (nothing committed is ever rewritten).
pub fn write_once(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    if path.exists() {
        return Err(CheckpointError::Usage(format!(
            "{} already exists; checkpoint files are never rewritten",
            path.display()
        )));
    }
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| CheckpointError::io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| CheckpointError::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(|e| CheckpointError::io(&path, e))?;
    sync_dir(dir)
}

/// Open an append-only file for appending (creating it if absent).
pub fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| CheckpointError::io(path, e))
}

/// Append bytes and fsync the data.
pub fn append_sync(file: &mut File, path: &Path, bytes: &[u8]) -> Result<()> {
    file.write_all(bytes)
        .and_then(|_| file.sync_data())
        .map_err(|e| CheckpointError::io(path, e))
}

/// Length of a file, 0 when it does not exist.
pub fn len_or_zero(path: &Path) -> Result<u64> {
    match fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(CheckpointError::io(path, e)),
    }
}

/// Cut an uncommitted torn tail off an append-only file (only ever beyond the committed length).
pub fn truncate_tail(path: &Path, committed_len: u64) -> Result<()> {
    if len_or_zero(path)? <= committed_len {
        return Ok(());
    }
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| CheckpointError::io(path, e))?;
    f.set_len(committed_len)
        .and_then(|_| f.sync_all())
        .map_err(|e| CheckpointError::io(path, e))
}
