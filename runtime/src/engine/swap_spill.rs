//! The swap pool's file tier: KV blocks of swapped-out sequences that do not fit the host pool,
//! kept in one file in the run directory, written and read block by block.
//!
//! Design: a fixed array of block-sized slots in a file of at most `capacity` slots (bounded on
//! disk as the host pool is in memory), with a free list; a swapped sequence owns the slots its
//! blocks went to, in block-table order. The file exists only while some block is in it: it is
//! created (mode 0600) by the first spill and removed when its last block is read back or
//! dropped, and when the pool is dropped, so a clean exit leaves nothing; a killed process can
//! leave it, and the next start in that run directory removes it ([`remove_leftover`]), since a
//! checkpoint never refers to it (swapped sequences are recomputed on resume). A failed write or
//! read is returned to the caller, which recomputes the sequence instead.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The spill file's name inside the run directory.
pub const SPILL_FILE: &str = "kv-swap.spill";

/// A spill-file operation failed.
#[derive(Debug, Error)]
pub enum SpillError {
    /// Not enough free slots (nothing was written).
    #[error("swap file full: need {needed} blocks, {free} free")]
    Full {
        /// Slots the write needed.
        needed: usize,
        /// Slots that were free.
        free: usize,
    },
    /// The bytes are not a whole number of blocks of this file's block size.
    #[error("{len} bytes are not {blocks} blocks of {block_bytes} bytes")]
    Shape {
        /// Bytes given.
        len: usize,
        /// Blocks they should hold.
        blocks: usize,
        /// The file's block size in bytes.
        block_bytes: usize,
    },
    /// The file could not be created, written or read.
    #[error("swap file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// Removes a spill file a killed process left in `run_dir`; true when there was one.
pub fn remove_leftover(run_dir: &Path) -> io::Result<bool> {
    match std::fs::remove_file(run_dir.join(SPILL_FILE)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The file tier of the swap pool.
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
    /// Most slots the file may hold.
    capacity: usize,
    /// Bytes of one block (one slot), fixed by the first write.
    block_bytes: usize,
    /// Open while some slot is in use.
    file: Option<File>,
    /// Free slot ids below `high`; ids from `high` up were never written.
    free: Vec<u32>,
    high: u32,
    used: usize,
}

impl SpillFile {
    /// A tier of at most `capacity` blocks in file `path` (nothing is created until a spill).
    pub fn new(path: PathBuf, capacity: usize) -> Self {
        Self {
            path,
            capacity,
            block_bytes: 0,
            file: None,
            free: Vec::new(),
            high: 0,
            used: 0,
        }
    }

    /// Slots not in use.
    pub fn free_count(&self) -> usize {
        self.capacity - self.used
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.used
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, source: io::Error) -> SpillError {
        SpillError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Writes `bytes` (`[blocks, block_bytes]`) to free slots, returning them in block order.
    pub fn write(&mut self, bytes: &[u8], blocks: usize) -> Result<Vec<u32>, SpillError> {
        if blocks > self.free_count() {
            return Err(SpillError::Full {
                needed: blocks,
                free: self.free_count(),
            });
        }
        let block_bytes = if self.block_bytes == 0 && blocks > 0 {
            bytes.len() / blocks
        } else {
            self.block_bytes
        };
        if blocks == 0 || block_bytes == 0 || bytes.len() != blocks * block_bytes {
            return Err(SpillError::Shape {
                len: bytes.len(),
                blocks,
                block_bytes,
            });
        }
        self.block_bytes = block_bytes;
        if self.file.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&self.path)
                .map_err(|e| self.io(e))?;
            self.file = Some(f);
        }
        let mut slots = Vec::with_capacity(blocks);
        for _ in 0..blocks {
            slots.push(self.free.pop().unwrap_or_else(|| {
                self.high += 1;
                self.high - 1
            }));
        }
        self.used += blocks;
        let written = match &self.file {
            Some(f) => slots
                .iter()
                .zip(bytes.chunks_exact(block_bytes))
                .try_for_each(|(&s, chunk)| f.write_all_at(chunk, s as u64 * block_bytes as u64)),
            None => Ok(()),
        };
        if let Err(e) = written {
            self.release(&slots);
            return Err(self.io(e));
        }
        Ok(slots)
    }

    /// Reads the blocks at `slots`, in order (`[slots.len(), block_bytes]`).
    pub fn read(&self, slots: &[u32]) -> Result<Vec<u8>, SpillError> {
        let bb = self.block_bytes;
        // [slots.len(), block_bytes]
        let mut out = vec![0u8; slots.len() * bb];
        let Some(f) = &self.file else {
            return Err(self.io(io::Error::new(
                io::ErrorKind::NotFound,
                "no block is spilled",
            )));
        };
        for (&s, chunk) in slots.iter().zip(out.chunks_exact_mut(bb)) {
            f.read_exact_at(chunk, s as u64 * bb as u64)
                .map_err(|e| self.io(e))?;
        }
        Ok(out)
    }

    /// Gives `slots` back; the last one in use removes the file.
    pub fn release(&mut self, slots: &[u32]) {
        self.used -= slots.len().min(self.used);
        self.free.extend_from_slice(slots);
        if self.used == 0 {
            self.close();
        }
    }

    /// Closes and removes the file, forgetting every slot.
    fn close(&mut self) {
        self.free.clear();
        self.high = 0;
        self.used = 0;
        if self.file.take().is_some()
            && let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!("swap file {}: removing it failed: {e}", self.path.display());
        }
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_the_file_is_bounded_and_goes_away() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SPILL_FILE);
        let mut f = SpillFile::new(path.clone(), 3);
        assert!(!path.exists(), "nothing is created before a spill");
        // [2 blocks, 4 bytes]
        let a: Vec<u8> = (0..8).collect();
        let sa = f.write(&a, 2).unwrap();
        assert!(path.exists());
        assert_eq!(f.free_count(), 1);
        // [2 blocks, 4 bytes]: one slot left
        let b: Vec<u8> = (100..108).collect();
        assert!(matches!(
            f.write(&b, 2),
            Err(SpillError::Full { needed: 2, free: 1 })
        ));
        assert!(matches!(f.write(&b[..5], 1), Err(SpillError::Shape { .. })));
        let sb = f.write(&b[..4], 1).unwrap();
        assert_eq!(f.read(&sa).unwrap(), a);
        assert_eq!(f.read(&sb).unwrap(), &b[..4]);
        f.release(&sa);
        assert!(path.exists(), "a block is still spilled");
        // A freed slot is reused; the file never grows past 3 slots.
        let sc = f.write(&b[4..], 1).unwrap();
        assert!(sc[0] < 3);
        assert_eq!(f.read(&sc).unwrap(), &b[4..]);
        assert!(std::fs::metadata(&path).unwrap().len() <= 12);
        f.release(&sb);
        f.release(&sc);
        assert!(!path.exists(), "the last block read back removes the file");
        f.write(&a, 2).unwrap();
        drop(f);
        assert!(!path.exists(), "dropping the pool removes the file");
    }

    #[test]
    fn a_leftover_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SPILL_FILE), b"stale").unwrap();
        assert!(remove_leftover(dir.path()).unwrap());
        assert!(!remove_leftover(dir.path()).unwrap());
    }
}
