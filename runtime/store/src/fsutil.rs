//! Small durable-file helpers: write-once files (temp, fsync, rename, fsync directory) and
//! append-then-fsync for the append-only logs.
//!
//! Privacy: a run directory holds every prompt and answer, so directories are created 0700 and
//! files 0600 (the umask can only narrow these), and [`exposure`] names any group- or
//! other-accessible one (like ssh does for keys).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file the store creates.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory the store creates.
pub const DIR_MODE: u32 = 0o700;

/// Create `dir` (and missing parents) with mode 0700; an existing one is left as it is.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| CheckpointError::io(dir, e))
}

/// Warnings for `dir` and the files in it that group or others may access (empty when private).
pub fn exposure(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mode = |p: &Path| -> Result<u32> {
        fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .map_err(|e| CheckpointError::io(p, e))
    };
    let m = mode(dir)?;
    if m & 0o077 != 0 {
        out.push(format!(
            "{}: directory mode {m:o} lets group or others read prompts and answers; run: chmod 700 {}",
            dir.display(),
            dir.display()
        ));
    }
    for entry in fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))? {
        let path = entry.map_err(|e| CheckpointError::io(dir, e))?.path();
        let m = mode(&path)?;
        if m & 0o077 != 0 {
            out.push(format!(
                "{}: mode {m:o} lets group or others read it; run: chmod 600 {}",
                path.display(),
                path.display()
            ));
        }
    }
    Ok(out)
}

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
    replace_file(dir, name, bytes)
}

/// Open an append-only file for appending (creating it if absent).
pub fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
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

/// Replace `dir/name` atomically with `bytes` (mode 0600): write `name.tmp`, fsync, rename over
/// the old file, fsync the directory. A crash leaves the old or the new file, never a mix.
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&tmp)
        .map_err(|e| CheckpointError::io(&tmp, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| CheckpointError::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(|e| CheckpointError::io(&path, e))?;
    sync_dir(dir)
}
