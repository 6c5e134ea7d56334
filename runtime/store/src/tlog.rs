//! The verifiable log over the journal, in the RFC 6962 / C2SP tlog-checkpoint model: every
//! journal record (its canonical body bytes) is a leaf of an append-only Merkle tree
//! ([`super::merkle`]), and `heads.log` holds the signed tree heads ([`super::head`]).
//!
//! `heads.log` framing: [`super::frame`] under magic `SOVH`; each body is an rkyv [`HeadRecord`]:
//! the signed head note and the leaf hashes it added since the previous head, so a verifier can
//! name the exact journal record that differs from what was signed without trusting the journal.
//! A head is written (fsync) after the records it covers are durable in the journal and before
//! the client hears about them.
//!
//! [`audit_log`] checks: every head's signature (`verify_strict`), one origin (derived from the
//! first leaf), tree sizes growing, each head's stored leaf hashes reproducing its signed root, an
//! RFC 6962 consistency proof between consecutive heads, and every signed leaf equal to the hash of
//! the journal record at its index (a rewritten-and-resealed, removed, inserted or moved record is
//! named). Records after the newest head are the unsigned tail (journaled, not yet attested).

use std::fs::File;
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use rkyv::{Archive, Deserialize, Serialize, rancor};

use super::error::{CheckpointError, Result};
use super::head::{self, TreeHead, origin_for};
use super::journal::{JOURNAL_FILE, JournalRecord, JournalScan};
use super::merkle::{Hash, Tree, verify_consistency};
use super::{frame, fsutil};

/// File name of the signed heads.
pub const HEADS_FILE: &str = "heads.log";
const MAGIC: &[u8; 4] = b"SOVH";

/// One entry of `heads.log`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HeadRecord {
    /// The signed head note (C2SP tlog-checkpoint).
    pub note: String,
    /// Leaf hashes of the records this head added (previous head's size up to this one's).
    pub leaves: Vec<Hash>,
}

/// Encode one framed head record.
pub fn encode(record: &HeadRecord) -> Result<Vec<u8>> {
    let body = rkyv::to_bytes::<rancor::Error>(record)
        .map_err(|e| CheckpointError::Usage(format!("head record serialization failed: {e}")))?;
    frame::encode(MAGIC, &body)
}

/// Decode a head record body (validated). Never panics.
pub fn decode_body(body: &[u8]) -> Result<HeadRecord> {
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<HeadRecord, rancor::Error>(&aligned)
        .map_err(|e| CheckpointError::Decode(format!("invalid head record: {e}")))
}

/// The parsed `heads.log`.
#[derive(Debug, Clone, Default)]
pub struct HeadsScan {
    /// (byte offset, record), in file order.
    pub records: Vec<(u64, HeadRecord)>,
    /// Bytes of complete, valid records.
    pub valid_len: u64,
    /// Bytes of a torn final record (0 when none).
    pub torn_bytes: u64,
}

/// Parse `heads.log` bytes: all complete records must be valid; only the last may be torn.
pub fn scan_bytes(bytes: &[u8]) -> Result<HeadsScan> {
    let frames = frame::scan(bytes, MAGIC, HEADS_FILE)?;
    let mut out = HeadsScan {
        valid_len: frames.valid_len,
        torn_bytes: frames.torn_bytes,
        ..HeadsScan::default()
    };
    for (at, body) in frames.bodies {
        let rec = decode_body(body).map_err(|e| {
            CheckpointError::corrupt(HEADS_FILE, None, format!("record at byte {at}: {e}"))
        })?;
        out.records.push((at, rec));
    }
    Ok(out)
}

/// Read and parse `heads.log` in `dir` (absent = no heads).
pub fn scan(dir: &Path) -> Result<HeadsScan> {
    let path = dir.join(HEADS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => scan_bytes(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HeadsScan::default()),
        Err(e) => Err(CheckpointError::io(&path, e)),
    }
}

/// Append handle on `heads.log`.
pub struct HeadsLog {
    path: PathBuf,
    file: Option<File>,
}

impl HeadsLog {
    /// Open for appending (the caller has cut any torn tail).
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(HEADS_FILE),
            file: None,
        }
    }

    /// Append a head record and fsync.
    pub fn append(&mut self, record: &HeadRecord) -> Result<()> {
        let bytes = encode(record)?;
        if self.file.is_none() {
            self.file = Some(fsutil::open_append(&self.path)?);
        }
        match self.file.as_mut() {
            Some(f) => fsutil::append_sync(f, &self.path, &bytes),
            None => Ok(()),
        }
    }
}

/// The verified log.
#[derive(Debug, Clone, Default)]
pub struct LogAudit {
    /// Every head, verified, in order.
    pub heads: Vec<TreeHead>,
    /// The newest head's note text.
    pub newest_note: Option<String>,
    /// The tree over every journal record (the signed ones first).
    pub tree: Tree,
    /// Leaves covered by the newest head.
    pub signed: u64,
    /// Bytes of a torn final head record.
    pub torn_bytes: u64,
    /// The unsigned tail ends in finished records or a checkpoint marker whose head a crash
    /// prevented.
    pub tail_awaits_head: bool,
}

impl LogAudit {
    /// The newest head.
    pub fn newest(&self) -> Option<&TreeHead> {
        self.heads.last()
    }

    /// Journal records after the newest head (journaled, not yet covered by a signature).
    pub fn unsigned(&self) -> u64 {
        self.tree.size() - self.signed
    }
}

/// Short description of a journal record for error messages.
pub fn describe(record: &JournalRecord) -> String {
    match record {
        JournalRecord::Accepted(r) => format!("Accepted request {}", r.request_id),
        JournalRecord::Finished(f) => format!("Finished request {}", f.request_id),
        JournalRecord::Checkpoint { height, .. } => format!("Checkpoint marker {height}"),
        JournalRecord::Session { .. } => "Session".into(),
    }
}

/// Verify `heads` under `key` and against the `journal` (see the module doc).
pub fn audit_log(journal: &JournalScan, heads: &HeadsScan, key: &VerifyingKey) -> Result<LogAudit> {
    let mut signed = Tree::default();
    let mut verified: Vec<TreeHead> = Vec::new();
    for (k, (at, rec)) in heads.records.iter().enumerate() {
        let n = k + 1;
        let bad = |what: String| {
            CheckpointError::corrupt(HEADS_FILE, None, format!("head {n} (byte {at}): {what}"))
        };
        let h = head::open(&rec.note, key).map_err(|e| bad(e.to_string()))?;
        let prev_size = signed.size();
        if h.size != prev_size + rec.leaves.len() as u64 || h.size <= prev_size {
            return Err(bad(format!(
                "signs tree size {} but carries {} leaves after size {prev_size}",
                h.size,
                rec.leaves.len()
            )));
        }
        for l in &rec.leaves {
            signed.push(*l);
        }
        let root = signed.root(h.size).map_err(|e| bad(e.to_string()))?;
        if root != h.root {
            return Err(bad(
                "the leaf hashes stored with it do not give its signed root (heads.log altered)"
                    .into(),
            ));
        }
        let origin = origin_for(&signed.leaves()[0]);
        if h.origin != origin {
            return Err(bad(format!(
                "origin {} is not this log's ({origin}): a head of another run",
                h.origin
            )));
        }
        if let Some(p) = verified.last() {
            let proof = signed
                .consistency_proof(p.size, h.size)
                .map_err(|e| bad(e.to_string()))?;
            verify_consistency(p.size, h.size, &p.root, &h.root, &proof)
                .map_err(|e| bad(format!("not consistent with head {}: {e}", n - 1)))?;
        }
        verified.push(h);
    }
    compare_journal(journal, signed.leaves(), &verified)?;
    let tail_awaits_head = check_unsigned_tail(journal, signed.size() as usize)?;
    check_requests(journal)?;
    let mut tree = signed.clone();
    for l in &journal.leaves[signed.size() as usize..] {
        tree.push(*l);
    }
    Ok(LogAudit {
        newest_note: heads.records.last().map(|(_, r)| r.note.clone()),
        signed: signed.size(),
        heads: verified,
        tree,
        torn_bytes: heads.torn_bytes,
        tail_awaits_head,
    })
}

/// Every signed leaf must be the hash of the journal record at its index.
fn compare_journal(journal: &JournalScan, signed: &[Hash], heads: &[TreeHead]) -> Result<()> {
    let j = &journal.leaves;
    let head_of = |i: usize| {
        heads
            .iter()
            .position(|h| h.size > i as u64)
            .map_or(0, |k| k + 1)
    };
    for (i, s) in signed.iter().enumerate() {
        let Some(ji) = j.get(i) else {
            return Err(CheckpointError::corrupt(
                JOURNAL_FILE,
                None,
                format!(
                    "the signed log (head {}) holds {} records, the journal only {}: records removed from the end (truncated or rolled back)",
                    heads.len(),
                    signed.len(),
                    j.len()
                ),
            ));
        };
        if ji == s {
            continue;
        }
        let (at, rec) = &journal.records[i];
        let this = format!("record {i} ({}, byte {at})", describe(rec));
        let what = if j.get(i + 1) == Some(s) {
            format!("{this} is not in the signed log: inserted before signed leaf {i}")
        } else if signed.get(i + 1) == Some(ji) {
            format!("signed leaf {i} is missing: a record was removed before {this}")
        } else if let Some(p) = signed.iter().position(|x| x == ji) {
            format!(
                "{this} was moved: head {} signed it as leaf {p}",
                head_of(p)
            )
        } else {
            format!(
                "{this} was rewritten: its hash differs from leaf {i} signed by head {}",
                head_of(i)
            )
        };
        return Err(CheckpointError::corrupt(JOURNAL_FILE, None, what));
    }
    Ok(())
}

/// The unsigned tail can only be what a crash leaves: the store signs a head right after every
/// group of `Finished` records and every checkpoint marker, before appending anything else, so
/// in the tail such a group may only be followed by a new engine session (a resume). Anything else
/// means signed heads were removed.
/// Returns whether the tail ends in such a group (the store then signs a head over it at open).
fn check_unsigned_tail(journal: &JournalScan, signed: usize) -> Result<bool> {
    let mut pending: Option<(usize, bool)> = None; // (first record awaiting a head, is Finished)
    for (i, (at, rec)) in journal.records.iter().enumerate().skip(signed) {
        match (pending, rec) {
            (_, JournalRecord::Session { .. }) => pending = None,
            (Some((_, true)), JournalRecord::Finished(_)) => {}
            (Some((g, _)), _) => {
                let (gat, grec) = &journal.records[g];
                return Err(CheckpointError::corrupt(
                    JOURNAL_FILE,
                    None,
                    format!(
                        "record {g} ({}, byte {gat}) has no signed head, yet record {i} ({}, byte {at}) follows it: signed heads removed (heads.log truncated or rolled back)",
                        describe(grec),
                        describe(rec)
                    ),
                ));
            }
            (None, JournalRecord::Finished(_)) => pending = Some((i, true)),
            (None, JournalRecord::Checkpoint { .. }) => pending = Some((i, false)),
            (None, JournalRecord::Accepted(_)) => {}
        }
    }
    Ok(pending.is_some())
}

/// Request-level sanity over the whole journal (catches a duplicated record even in the unsigned
/// tail): a request is accepted once, finished only after it was accepted, and finished again only
/// by a later engine session (a resume that ran it anew).
fn check_requests(journal: &JournalScan) -> Result<()> {
    use std::collections::HashMap;
    let mut accepted: HashMap<u64, usize> = HashMap::new();
    let mut finished: HashMap<u64, u64> = HashMap::new(); // request -> session number
    let mut session = 0u64;
    for (i, (at, rec)) in journal.records.iter().enumerate() {
        let bad = |what: &str| {
            CheckpointError::corrupt(
                JOURNAL_FILE,
                None,
                format!("record {i} ({}, byte {at}): {what}", describe(rec)),
            )
        };
        match rec {
            JournalRecord::Session { .. } => session += 1,
            JournalRecord::Accepted(r) => {
                if let Some(first) = accepted.insert(r.request_id, i) {
                    return Err(bad(&format!(
                        "request already accepted by record {first} (duplicated)"
                    )));
                }
            }
            JournalRecord::Finished(f) => {
                if !accepted.contains_key(&f.request_id) {
                    return Err(bad("finishes a request never accepted before it"));
                }
                if finished.insert(f.request_id, session) == Some(session) {
                    return Err(bad("request already finished in this session (duplicated)"));
                }
            }
            JournalRecord::Checkpoint { .. } => {}
        }
    }
    Ok(())
}

/// Check a head known from outside the directory (a client's receipt, a witness) against the
/// verified log: same origin, not beyond the newest head (else the directory was rolled back),
/// same root at its size (else a fork), and consistent with the newest head.
pub fn check_known_head(log: &LogAudit, note_text: &str, key: &VerifyingKey) -> Result<TreeHead> {
    let bad = |what: String| CheckpointError::corrupt(HEADS_FILE, None, what);
    let h = head::open(note_text, key).map_err(|e| bad(format!("the given head: {e}")))?;
    let Some(newest) = log.newest() else {
        return Err(bad(format!(
            "rollback: the given head signs {} records, the directory has no signed head",
            h.size
        )));
    };
    if h.origin != newest.origin {
        return Err(bad(format!(
            "the given head is of another log ({}, this one is {})",
            h.origin, newest.origin
        )));
    }
    if h.size > newest.size {
        return Err(bad(format!(
            "rollback: the given head signs {} records, the directory's newest head only {}",
            h.size, newest.size
        )));
    }
    let root = log.tree.root(h.size).map_err(|e| bad(e.to_string()))?;
    if root != h.root {
        return Err(bad(format!(
            "fork: the log's root at size {} differs from the given head's",
            h.size
        )));
    }
    let proof = log
        .tree
        .consistency_proof(h.size, newest.size)
        .map_err(|e| bad(e.to_string()))?;
    verify_consistency(h.size, newest.size, &h.root, &newest.root, &proof).map_err(|e| {
        bad(format!(
            "the given head is not consistent with the newest: {e}"
        ))
    })?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec() -> HeadRecord {
        HeadRecord {
            note: "x\n\n\u{2014} k AAAA\n".into(),
            leaves: vec![[1; 32], [2; 32]],
        }
    }

    #[test]
    fn scan_round_trip_flips_and_truncations() {
        let mut b = encode(&rec()).unwrap();
        b.extend(encode(&rec()).unwrap());
        let s = scan_bytes(&b).unwrap();
        assert_eq!(s.records.len(), 2);
        assert_eq!(s.records[1].1, rec());
        for i in 0..b.len() {
            let mut m = b.clone();
            m[i] ^= 0x04;
            assert!(scan_bytes(&m).is_err(), "flip at {i} not caught");
        }
        for cut in 0..b.len() {
            let s = scan_bytes(&b[..cut]).unwrap();
            assert_eq!(s.valid_len + s.torn_bytes, cut as u64);
        }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = scan_bytes(&bytes);
            let _ = decode_body(&bytes);
        }
    }
}
