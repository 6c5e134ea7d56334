//! The request journal (`journal.log`): append-only, checksummed records, fsynced on every append,
//! so a request accepted after the newest checkpoint survives a crash, and a marker per checkpoint
//! mirrors each receipt's digest (a later rollback or fork of the receipts then disagrees with it).
//!
//! Record framing: `[magic "SOVJ"][len u32][header check 4][body check 8][body: rkyv]` (little-endian;
//! checks are keyed BLAKE3). A record cut short at the end of the file is a torn write and is dropped;
//! any complete record that fails its checks is corruption. The body is validated with bytecheck.

use std::fs::File;
use std::path::{Path, PathBuf};

use rkyv::{Archive, Deserialize, Serialize, rancor};

use super::digest::{Digest, record_checksum};
use super::error::{CheckpointError, Result};
use super::fsutil;
use super::snapshot::SamplingParams;

/// File name of the journal.
pub const JOURNAL_FILE: &str = "journal.log";
const MAGIC: &[u8; 4] = b"SOVJ";
const HEADER_LEN: usize = 20;
/// Largest record body accepted when reading (guards allocation on a corrupted length).
const MAX_BODY: u32 = 256 << 20;

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

/// Encode one framed record.
pub fn encode_record(record: &JournalRecord) -> Result<Vec<u8>> {
    let body = rkyv::to_bytes::<rancor::Error>(record)
        .map_err(|e| CheckpointError::Usage(format!("journal record serialization failed: {e}")))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_BODY)
        .ok_or_else(|| CheckpointError::Usage("journal record too large".into()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    let hcheck = record_checksum(&[MAGIC, &len.to_le_bytes()]);
    out.extend_from_slice(&hcheck[..4]);
    out.extend_from_slice(&record_checksum(&[&body]));
    out.extend_from_slice(&body);
    Ok(out)
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
    /// (byte offset, record), in file order.
    pub records: Vec<(u64, JournalRecord)>,
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
    let corrupt = |at: usize, what: &str| {
        CheckpointError::corrupt(JOURNAL_FILE, None, format!("record at byte {at}: {what}"))
    };
    let mut scan = JournalScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER_LEN {
            // Only a torn header may be short, and it must still be a prefix of a plausible header.
            if !MAGIC.starts_with(&rest[..rest.len().min(4)]) {
                return Err(corrupt(at, "bad magic"));
            }
            scan.torn_bytes = rest.len() as u64;
            break;
        }
        if &rest[..4] != MAGIC {
            return Err(corrupt(at, "bad magic"));
        }
        let len_bytes = [rest[4], rest[5], rest[6], rest[7]];
        if record_checksum(&[MAGIC, &len_bytes])[..4] != rest[8..12] {
            return Err(corrupt(at, "header checksum mismatch"));
        }
        let len = u32::from_le_bytes(len_bytes);
        if len > MAX_BODY {
            return Err(corrupt(at, "length too large"));
        }
        let end = HEADER_LEN + len as usize;
        if rest.len() < end {
            scan.torn_bytes = rest.len() as u64;
            break;
        }
        let body = &rest[HEADER_LEN..end];
        if record_checksum(&[body])[..] != rest[12..20] {
            return Err(corrupt(at, "body checksum mismatch"));
        }
        let record = decode_body(body).map_err(|e| corrupt(at, &e.to_string()))?;
        scan.records.push((at as u64, record));
        at += end;
        scan.valid_len = at as u64;
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
        let mut bytes = Vec::new();
        for r in records {
            bytes.extend(encode_record(r)?);
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

    /// Append a record and fsync before returning; returns its byte offset.
    pub fn append(&mut self, record: &JournalRecord) -> Result<u64> {
        let bytes = encode_record(record)?;
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
