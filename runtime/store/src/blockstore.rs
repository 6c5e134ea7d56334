//! Content-addressed KV block store: one append-only segment file of raw block bytes
//! (`blocks.seg`) and an append-only index (`blocks.idx`) of fixed 56-byte entries
//! `[hash 32][offset u64][len u32][zero u32][checksum 8]` (little-endian; checksum = BLAKE3-keyed
//! over the first 48 bytes). Blocks are laid out contiguously in index order, so every committed
//! segment byte belongs to exactly one indexed block and a flipped byte anywhere is found by
//! re-hashing. Each block is stored once; checkpoints write only blocks not yet present.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::digest::{Digest, block_hash, record_checksum};
use super::error::{CheckpointError, Result};
use super::fsutil;

/// File name of the segment.
pub const SEGMENT_FILE: &str = "blocks.seg";
/// File name of the index.
pub const INDEX_FILE: &str = "blocks.idx";
/// Bytes per index entry.
pub const ENTRY_LEN: usize = 56;

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// BLAKE3 content address of the block's bytes.
    pub hash: Digest,
    /// Byte offset of the block in `blocks.seg` (entries are laid out contiguously from 0).
    pub offset: u64,
    /// Length of the block in bytes.
    pub len: u32,
}

impl IndexEntry {
    /// The 56 on-disk bytes.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        out[..32].copy_from_slice(&self.hash);
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..44].copy_from_slice(&self.len.to_le_bytes());
        let check = record_checksum(&[&out[..48]]);
        out[48..].copy_from_slice(&check);
        out
    }

    /// Decode 56 bytes; None when the checksum or the reserved word is wrong.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENTRY_LEN || bytes[44..48] != [0; 4] {
            return None;
        }
        if record_checksum(&[&bytes[..48]]) != bytes[48..] {
            return None;
        }
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&bytes[..32]);
        let mut off = [0u8; 8];
        off.copy_from_slice(&bytes[32..40]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[40..44]);
        Some(Self {
            hash,
            offset: u64::from_le_bytes(off),
            len: u32::from_le_bytes(len),
        })
    }
}

/// Read `count` index entries from the start of the index and check them: checksums, contiguous
/// layout from offset 0, no duplicate hash. Errors name the entry.
pub fn read_index(dir: &Path, count: u64) -> Result<Vec<IndexEntry>> {
    let path = dir.join(INDEX_FILE);
    let need = count
        .checked_mul(ENTRY_LEN as u64)
        .ok_or_else(|| CheckpointError::corrupt(INDEX_FILE, None, "entry count overflows"))?;
    let have = fsutil::len_or_zero(&path)?;
    if have < need {
        return Err(CheckpointError::corrupt(
            INDEX_FILE,
            None,
            format!("truncated: {have} bytes, {need} committed"),
        ));
    }
    let mut bytes = vec![0u8; need as usize]; // [count, 56]
    if need > 0 {
        File::open(&path)
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| CheckpointError::io(&path, e))?;
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut seen = HashMap::with_capacity(count as usize);
    let mut next_offset = 0u64;
    for (i, raw) in bytes.chunks_exact(ENTRY_LEN).enumerate() {
        let e = IndexEntry::decode(raw).ok_or_else(|| {
            CheckpointError::corrupt(INDEX_FILE, None, format!("entry {i} fails its checksum"))
        })?;
        if e.offset != next_offset {
            return Err(CheckpointError::corrupt(
                INDEX_FILE,
                None,
                format!(
                    "entry {i} at offset {} breaks the contiguous layout (expected {next_offset})",
                    e.offset
                ),
            ));
        }
        if seen.insert(e.hash, i).is_some() {
            return Err(CheckpointError::corrupt(
                INDEX_FILE,
                None,
                format!("entry {i} duplicates a block"),
            ));
        }
        next_offset += u64::from(e.len);
        entries.push(e);
    }
    Ok(entries)
}

/// Re-hash every block of `entries` from the segment (which must hold exactly `segment_len`
/// committed bytes, the end of the last entry). `on_block` sees each verified block.
pub fn verify_segment(
    dir: &Path,
    entries: &[IndexEntry],
    segment_len: u64,
    mut on_block: impl FnMut(&IndexEntry, &[u8]),
) -> Result<()> {
    let end = entries.last().map_or(0, |e| e.offset + u64::from(e.len));
    if end != segment_len {
        return Err(CheckpointError::corrupt(
            INDEX_FILE,
            None,
            format!("index covers {end} segment bytes but {segment_len} are committed"),
        ));
    }
    let path = dir.join(SEGMENT_FILE);
    let have = fsutil::len_or_zero(&path)?;
    if have < segment_len {
        return Err(CheckpointError::corrupt(
            SEGMENT_FILE,
            None,
            format!("truncated: {have} bytes, {segment_len} committed"),
        ));
    }
    if entries.is_empty() {
        return Ok(());
    }
    let mut f = std::io::BufReader::with_capacity(
        1 << 20,
        File::open(&path).map_err(|e| CheckpointError::io(&path, e))?,
    );
    let mut buf = Vec::new(); // [len] one block's bytes
    for (i, e) in entries.iter().enumerate() {
        buf.resize(e.len as usize, 0);
        f.read_exact(&mut buf)
            .map_err(|err| CheckpointError::io(&path, err))?;
        if block_hash(&buf) != e.hash {
            return Err(CheckpointError::corrupt(
                SEGMENT_FILE,
                None,
                format!(
                    "block {i} (bytes {}..{}) does not match its hash",
                    e.offset,
                    e.offset + u64::from(e.len)
                ),
            ));
        }
        on_block(e, &buf);
    }
    Ok(())
}

/// The writable store: a map of committed (and appended) blocks plus the two append handles.
pub struct BlockStore {
    dir: PathBuf,
    map: HashMap<Digest, IndexEntry>,
    entries: u64,
    segment_len: u64,
    segment: Option<File>,
    index: Option<File>,
}

impl BlockStore {
    /// Open over already-verified committed entries; the files must hold exactly these entries (the
    /// caller truncated any torn tail).
    pub fn new(dir: &Path, committed: &[IndexEntry]) -> Self {
        let segment_len = committed.last().map_or(0, |e| e.offset + u64::from(e.len));
        Self {
            dir: dir.to_path_buf(),
            map: committed.iter().map(|e| (e.hash, *e)).collect(),
            entries: committed.len() as u64,
            segment_len,
            segment: None,
            index: None,
        }
    }

    /// Number of indexed blocks.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Committed segment length in bytes.
    pub fn segment_len(&self) -> u64 {
        self.segment_len
    }

    /// Whether a block with this hash is stored.
    pub fn contains(&self, hash: &Digest) -> bool {
        self.map.contains_key(hash)
    }

    /// Append the blocks not yet stored (deduplicated), fsync segment then index. Each block comes
    /// with its content hash, which the caller computed from exactly these bytes with
    /// [`block_hash`] (the store's public entry points do). Returns (new blocks, bytes appended to
    /// segment + index).
    pub fn append(&mut self, blocks: &[(Digest, &[u8])]) -> Result<(u64, u64)> {
        let mut idx_bytes = Vec::new(); // [new blocks, 56]
        let mut new: Vec<(IndexEntry, &[u8])> = Vec::new();
        let mut fresh = std::collections::HashSet::new();
        let mut offset = self.segment_len;
        for &(hash, block) in blocks {
            if self.map.contains_key(&hash) || !fresh.insert(hash) {
                continue;
            }
            let len = u32::try_from(block.len())
                .map_err(|_| CheckpointError::Usage("a KV block over 4 GiB".into()))?;
            let entry = IndexEntry { hash, offset, len };
            offset += u64::from(len);
            idx_bytes.extend_from_slice(&entry.encode());
            new.push((entry, block));
        }
        if new.is_empty() {
            return Ok((0, 0));
        }
        let seg_path = self.dir.join(SEGMENT_FILE);
        let idx_path = self.dir.join(INDEX_FILE);
        if self.segment.is_none() {
            self.segment = Some(fsutil::open_append(&seg_path)?);
        }
        if self.index.is_none() {
            self.index = Some(fsutil::open_append(&idx_path)?);
        }
        if let Some(f) = self.segment.as_mut() {
            for (_, block) in &new {
                f.write_all(block)
                    .map_err(|e| CheckpointError::io(&seg_path, e))?;
            }
            f.sync_data()
                .map_err(|e| CheckpointError::io(&seg_path, e))?;
        }
        if let Some(f) = self.index.as_mut() {
            fsutil::append_sync(f, &idx_path, &idx_bytes)?;
        }
        let seg_bytes = offset - self.segment_len;
        self.segment_len = offset;
        self.entries += new.len() as u64;
        let n = new.len() as u64;
        for (e, _) in new {
            self.map.insert(e.hash, e);
        }
        Ok((n, seg_bytes + idx_bytes.len() as u64))
    }

    /// Read one block and check its hash.
    pub fn read(&self, hash: &Digest) -> Result<Vec<u8>> {
        let e = self.map.get(hash).ok_or_else(|| {
            CheckpointError::corrupt(
                SEGMENT_FILE,
                None,
                format!("block {} is not stored", super::digest::to_hex(hash)),
            )
        })?;
        let path = self.dir.join(SEGMENT_FILE);
        let mut buf = vec![0u8; e.len as usize]; // [len] block bytes
        File::open(&path)
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(e.offset))?;
                f.read_exact(&mut buf)
            })
            .map_err(|err| CheckpointError::io(&path, err))?;
        if block_hash(&buf) != *hash {
            return Err(CheckpointError::corrupt(
                SEGMENT_FILE,
                None,
                format!("block at offset {} does not match its hash", e.offset),
            ));
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_dedups_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = BlockStore::new(dir.path(), &[]);
        let a = vec![1u8; 100];
        let b = vec![2u8; 50];
        let (ha, hb) = (block_hash(&a), block_hash(&b));
        let (n, bytes) = s.append(&[(ha, &a), (hb, &b), (ha, &a)]).unwrap();
        assert_eq!((n, bytes), (2, 150 + 2 * ENTRY_LEN as u64));
        assert_eq!(s.append(&[(ha, &a)]).unwrap(), (0, 0));
        assert_eq!(s.read(&block_hash(&b)).unwrap(), b);
        let entries = read_index(dir.path(), 2).unwrap();
        let mut seen = 0;
        verify_segment(dir.path(), &entries, 150, |_, _| seen += 1).unwrap();
        assert_eq!(seen, 2);
    }

    #[test]
    fn index_entry_detects_every_flipped_bit() {
        let e = IndexEntry {
            hash: [3; 32],
            offset: 77,
            len: 9,
        };
        let bytes = e.encode();
        assert_eq!(IndexEntry::decode(&bytes), Some(e));
        for i in 0..ENTRY_LEN {
            for bit in 0..8 {
                let mut b = bytes;
                b[i] ^= 1 << bit;
                assert_eq!(IndexEntry::decode(&b), None, "byte {i} bit {bit}");
            }
        }
    }
}
