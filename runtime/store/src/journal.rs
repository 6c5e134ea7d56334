//! The request journal (`journal.log`): append-only, checksummed records, fsynced on every append,
//! so a request accepted after the newest checkpoint survives a crash, and a marker per checkpoint
//! mirrors each receipt's digest (a later rollback or fork of the receipts then disagrees with it).
//!
//! Framing: [`super::frame`] under magic `SOVJ`. A record cut short at the end of the file is a torn
//! write and is dropped; any complete record that fails its checks is corruption. The body is
//! validated with bytecheck. Each record's body bytes are a leaf of the verifiable log
//! ([`super::tlog`]): the scan also returns their RFC 6962 leaf hashes.

use std::fs::File;
use std::path::{Path, PathBuf};

use rkyv::{Archive, Deserialize, Serialize, rancor};

use super::digest::Digest;
use super::error::{CheckpointError, Result};
use super::merkle::{Hash, leaf_hash};
use super::snapshot::SamplingParams;
use super::{frame, fsutil};

/// File name of the journal.
pub const JOURNAL_FILE: &str = "journal.log";
const MAGIC: &[u8; 4] = b"SOVJ";

/// A request as accepted by the engine.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Engine-assigned request id, unique within the run directory.
    pub request_id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How to sample and when to stop.
    pub sampling: SamplingParams,
    /// Wall time of acceptance, unix milliseconds.
    pub accepted_ms: u64,
    /// Engine data the journal does not interpret; may be empty.
    pub extra: Vec<u8>,
}

/// A request the engine finished, with what it delivered (so a resumed engine can report it
/// without generating it again).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FinishedRecord {
    /// Id of the request (as in its [`RequestRecord`]).
    pub request_id: u64,
    /// Generated token ids (prompt excluded).
    pub output: Vec<u32>,
    /// The full generated text as delivered (stop strings removed).
    pub text: String,
    /// Why it ended, in OpenAI terms (`stop`, `length`, `error`).
    pub reason: String,
    /// Human-readable detail (the engine's finish reason, error text).
    pub detail: String,
}

/// One journal record.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum JournalRecord {
    /// A request was accepted (journaled before the engine admits it).
    Accepted(RequestRecord),
    /// Checkpoint `height` committed with this receipt digest.
    Checkpoint {
        /// Height of the committed receipt (1 for the first).
        height: u64,
        /// BLAKE3 digest of that receipt's body.
        receipt: Digest,
    },
    /// A request finished and its output was delivered.
    Finished(FinishedRecord),
    /// An engine process opened the journal with this model and spec (every start and resume),
    /// so a resume with other weights is refused even before the first checkpoint.
    Session {
        /// Digest of the model weights and config the engine loaded.
        model: Digest,
        /// `SPEC_DIGEST` of the scheduler machine the engine runs.
        spec: Digest,
        /// Wall time the session started, unix milliseconds.
        started_ms: u64,
    },
}

/// The canonical body bytes of a record (what the log's leaf is).
pub fn encode_body(record: &JournalRecord) -> Result<Vec<u8>> {
    rkyv::to_bytes::<rancor::Error>(record)
        .map(|b| b.to_vec())
        .map_err(|e| CheckpointError::Usage(format!("journal record serialization failed: {e}")))
}

/// Encode one framed record.
pub fn encode_record(record: &JournalRecord) -> Result<Vec<u8>> {
    frame::encode(MAGIC, &encode_body(record)?)
}

/// Decode a record body (validated). Never panics.
pub fn decode_body(body: &[u8]) -> Result<JournalRecord> {
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<JournalRecord, rancor::Error>(&aligned)
        .map_err(|e| CheckpointError::Decode(format!("invalid journal record: {e}")))
}

/// The parsed journal.
#[derive(Debug, Clone, Default)]
pub struct JournalScan {
    /// (byte offset, record), in file order; a record's position is its leaf index.
    pub records: Vec<(u64, JournalRecord)>,
    /// RFC 6962 leaf hash of each record's body, in file order.
    pub leaves: Vec<Hash>,
    /// Bytes of complete, valid records.
    pub valid_len: u64,
    /// Bytes after `valid_len` belonging to a torn final record (0 when none).
    pub torn_bytes: u64,
}

impl JournalScan {
    /// Requests accepted at or after byte `offset` (the position a snapshot recorded).
    pub fn accepted_since(&self, offset: u64) -> Vec<RequestRecord> {
        self.records
            .iter()
            .filter(|(at, _)| *at >= offset)
            .filter_map(|(_, r)| match r {
                JournalRecord::Accepted(req) => Some(req.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every accepted request, in file order.
    pub fn accepted(&self) -> Vec<RequestRecord> {
        self.accepted_since(0)
    }

    /// Every finished request, in file order.
    pub fn finished(&self) -> impl Iterator<Item = &FinishedRecord> {
        self.records.iter().filter_map(|(_, r)| match r {
            JournalRecord::Finished(f) => Some(f),
            _ => None,
        })
    }

    /// Checkpoint markers (height, receipt digest) in file order.
    pub fn markers(&self) -> impl Iterator<Item = (u64, &Digest)> {
        self.records.iter().filter_map(|(_, r)| match r {
            JournalRecord::Checkpoint { height, receipt } => Some((*height, receipt)),
            _ => None,
        })
    }
}

/// Parse journal bytes: all complete records must be valid; only the last may be torn.
pub fn scan_bytes(bytes: &[u8]) -> Result<JournalScan> {
    let frames = frame::scan(bytes, MAGIC, JOURNAL_FILE)?;
    let mut scan = JournalScan {
        valid_len: frames.valid_len,
        torn_bytes: frames.torn_bytes,
        ..JournalScan::default()
    };
    for (at, body) in frames.bodies {
        let record = decode_body(body).map_err(|e| {
            CheckpointError::corrupt(JOURNAL_FILE, None, format!("record at byte {at}: {e}"))
        })?;
        scan.records.push((at, record));
        scan.leaves.push(leaf_hash(body));
    }
    Ok(scan)
}

/// Read and parse the journal in `dir` (absent file = empty journal).
pub fn scan(dir: &Path) -> Result<JournalScan> {
    let path = dir.join(JOURNAL_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => scan_bytes(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(JournalScan::default()),
        Err(e) => Err(CheckpointError::io(&path, e)),
    }
}

/// Append handle on the journal.
pub struct Journal {
    path: PathBuf,
    file: Option<File>,
    len: u64,
}

impl Journal {
    /// Open for appending at `valid_len` (the caller has cut any torn tail).
    pub fn new(dir: &Path, valid_len: u64) -> Self {
        Self {
            path: dir.join(JOURNAL_FILE),
            file: None,
            len: valid_len,
        }
    }

    /// Current length in bytes (the position a snapshot records).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was ever journaled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `records` with one write and one fsync (group commit); returns the offset of the
    /// first. A crash mid-write leaves a torn tail that the next open discards.
    pub fn append_all(&mut self, records: &[JournalRecord]) -> Result<u64> {
        let bodies = records
            .iter()
            .map(encode_body)
            .collect::<Result<Vec<_>>>()?;
        self.append_bodies(&bodies)
    }

    /// Append a record and fsync before returning; returns its byte offset.
    pub fn append(&mut self, record: &JournalRecord) -> Result<u64> {
        self.append_all(std::slice::from_ref(record))
    }

    /// Appends records already encoded with [`encode_body`] (one write, one fsync); returns the
    /// offset of the first.
    pub fn append_bodies(&mut self, bodies: &[Vec<u8>]) -> Result<u64> {
        let mut bytes = Vec::new();
        for b in bodies {
            bytes.extend(frame::encode(MAGIC, b)?);
        }
        if self.file.is_none() {
            self.file = Some(fsutil::open_append(&self.path)?);
        }
        let at = self.len;
        if let Some(f) = self.file.as_mut() {
            fsutil::append_sync(f, &self.path, &bytes)?;
        }
        self.len += bytes.len() as u64;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(id: u64) -> JournalRecord {
        JournalRecord::Accepted(RequestRecord {
            request_id: id,
            prompt: vec![1, 2, 3],
            sampling: SamplingParams {
                seed: id,
                ..SamplingParams::greedy(8)
            },
            accepted_ms: 5,
            extra: vec![],
        })
    }

    fn journal_bytes() -> Vec<u8> {
        let mut b = encode_record(&req(1)).unwrap();
        b.extend(
            encode_record(&JournalRecord::Checkpoint {
                height: 1,
                receipt: [4; 32],
            })
            .unwrap(),
        );
        b.extend(encode_record(&req(2)).unwrap());
        b
    }

    #[test]
    fn scan_round_trip_and_since() {
        let b = journal_bytes();
        let s = scan_bytes(&b).unwrap();
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.valid_len, b.len() as u64);
        let since = s.accepted_since(s.records[1].0);
        assert_eq!(since.len(), 1);
        assert_eq!(since[0].request_id, 2);
        assert_eq!(s.markers().collect::<Vec<_>>(), vec![(1, &[4u8; 32])]);
    }

    #[test]
    fn every_truncation_is_a_torn_tail_and_every_flip_is_caught() {
        let b = journal_bytes();
        let boundaries: Vec<usize> = scan_bytes(&b)
            .unwrap()
            .records
            .iter()
            .map(|r| r.0 as usize)
            .collect();
        for cut in 0..b.len() {
            let s = scan_bytes(&b[..cut]).unwrap();
            let last_start = boundaries
                .iter()
                .copied()
                .filter(|&x| x <= cut)
                .max()
                .unwrap_or(0);
            assert_eq!(s.valid_len as usize, last_start, "cut {cut}");
        }
        for i in 0..b.len() {
            let mut m = b.clone();
            m[i] ^= 0x10;
            assert!(scan_bytes(&m).is_err(), "flip at {i} not caught");
        }
    }

    #[test]
    fn append_is_durable_and_rescannable() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::new(dir.path(), 0);
        assert_eq!(j.append(&req(1)).unwrap(), 0);
        let second = j.append(&req(2)).unwrap();
        let s = scan(dir.path()).unwrap();
        assert_eq!(s.records.len(), 2);
        assert_eq!(s.records[1].0, second);
        assert_eq!(s.valid_len, j.len());
    }

    proptest! {
        #[test]
        fn scanner_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = scan_bytes(&bytes);
            let _ = decode_body(&bytes);
        }
    }
}
