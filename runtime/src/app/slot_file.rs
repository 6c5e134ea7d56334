//! The live control surface: the 32 slots mapped from a 128-byte file in the run directory, so
//! another process (`sov slots get/set`, a script) reads and steers a running engine.
//!
//! Design: a shared, writable memory map (`MAP_SHARED`) viewed as `[AtomicU32; 32]`. Every access
//! on either side is an atomic load or store of one aligned 32-bit word, so readers never see a
//! torn slot; multi-slot fields (the receipt digest) are written slot by slot.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use memmap2::MmapRaw;

use crate::engine::EngineError;
use crate::scheduler::{SlotMemory, Slots};

/// Bytes of the slot file: 32 little-endian u32 words.
pub const SLOT_FILE_LEN: u64 = 32 * 4;

/// A slot file mapped into memory.
#[derive(Debug)]
pub struct SlotFile {
    map: MmapRaw,
    path: PathBuf,
}

fn err(path: &Path, reason: impl ToString) -> EngineError {
    EngineError::SlotFile {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl SlotFile {
    /// Creates (or resets to zeros) the slot file at `path` and maps it.
    pub fn create(path: &Path) -> Result<Self, EngineError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| err(path, e))?;
        file.set_len(SLOT_FILE_LEN).map_err(|e| err(path, e))?;
        Self::map(file, path)
    }

    /// Maps the existing slot file of a running engine.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| err(path, e))?;
        let len = file.metadata().map_err(|e| err(path, e))?.len();
        if len != SLOT_FILE_LEN {
            return Err(err(
                path,
                format!("is {len} bytes, a slot file is {SLOT_FILE_LEN}"),
            ));
        }
        Self::map(file, path)
    }

    fn map(file: std::fs::File, path: &Path) -> Result<Self, EngineError> {
        let map = MmapRaw::map_raw(&file).map_err(|e| err(path, e))?;
        if map.len() < SLOT_FILE_LEN as usize || !(map.as_ptr() as usize).is_multiple_of(4) {
            return Err(err(path, "mapping too small or misaligned"));
        }
        Ok(Self {
            map,
            path: path.to_path_buf(),
        })
    }

    /// The slot file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The 32 slots.
    pub fn cells(&self) -> &[AtomicU32; 32] {
        // SAFETY: `map` is a live, writable shared mapping of at least 128 bytes (checked in `map`),
        // page-aligned (checked 4-aligned), and it outlives the returned reference (borrowed from
        // self). AtomicU32 has the size and alignment of u32 and permits shared mutation; all access
        // to this memory, here and in other processes' sov, goes through atomic loads and stores.
        unsafe { &*(self.map.as_mut_ptr() as *const [AtomicU32; 32]) }
    }
}

impl SlotMemory for SlotFile {
    fn cells(&self) -> &[AtomicU32; 32] {
        SlotFile::cells(self)
    }
}

/// Creates (or resets) the slot file at `path` and returns the slots mapped from it: the control
/// surface a started engine publishes to (see `EngineConfig::slots`).
pub fn create_slots(path: &Path) -> Result<Slots, EngineError> {
    Ok(Slots::from_memory(Arc::new(SlotFile::create(path)?)))
}

/// Opens the slots of a running engine from its slot file.
pub fn open_slots(path: &Path) -> Result<Slots, EngineError> {
    Ok(Slots::from_memory(Arc::new(SlotFile::open(path)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slots");
        let a = SlotFile::create(&path).unwrap();
        let b = SlotFile::open(&path).unwrap();
        a.cells()[6].store(3, Ordering::SeqCst);
        assert_eq!(b.cells()[6].load(Ordering::SeqCst), 3);
        b.cells()[5].store(1, Ordering::SeqCst);
        assert_eq!(a.cells()[5].load(Ordering::SeqCst), 1);
        std::fs::write(dir.path().join("short"), [0u8; 12]).unwrap();
        assert!(SlotFile::open(&dir.path().join("short")).is_err());
        assert!(SlotFile::open(&dir.path().join("missing")).is_err());
    }
}
