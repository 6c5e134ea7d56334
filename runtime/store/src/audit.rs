//! Full verification of a checkpoint directory — the one code path behind `sov verify`, the store's
//! startup check and resume. Stops at the first problem and names it (file, height, what).
//!
//! What is checked: the receipt files form heights 1..=n with no gap, duplicate or stray file; each
//! receipt is canonical, signed by the key (`verify_strict`), claims its own height and links to the
//! previous receipt's digest; each receipt's snapshot exists, matches the snapshot digest, decodes
//! (bytecheck) and matches the KV root; commit points never go backwards; the committed index
//! entries pass their checksums, are contiguous and unique, and every committed segment byte
//! re-hashes to its block; every block a snapshot names was committed by then; the journal's
//! records are intact and its checkpoint markers agree with the receipts (a receipt rolled back or
//! replaced disagrees); an optional anchor (height, digest) — e.g. from slots 7..15 or a witness —
//! pins the head; an optional witness policy requires k valid cosignatures per receipt. The
//! verifiable log over the journal ([`super::tlog::audit_log`]): every signed head, consistency
//! between consecutive heads, every signed leaf against its journal record, each head's checkpoint
//! line against the receipt chain; an optional known head note (a client's, a witness's) must be
//! in the log (else rollback or fork). Group- or other-accessible files are warned about.
//!
//! What is tolerated (a crash mid-checkpoint, reported as torn): bytes past the newest commit in the
//! index, segment, journal and heads log, leftover `*.tmp` files, and one snapshot at height n+1 with no
//! receipt. The writer discards these on open; nothing committed is ever rewritten.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;

use super::blockstore::{self, ENTRY_LEN, INDEX_FILE, IndexEntry, SEGMENT_FILE};
use super::digest::{Digest, kv_root, snapshot_digest, to_hex};
use super::error::{CheckpointError, Result};
use super::fsutil::{self, TMP_SUFFIX};
use super::journal::{self, JOURNAL_FILE, JournalScan};
use super::policy::Policy;
use super::receipt::{self, SignedReceipt};
use super::snapshot::{self, StoreCommit};
use super::tlog::{self, HEADS_FILE, LogAudit};
use super::witness::cosigned::COSIGNATURES_FILE;

/// File name of the receipt at `height`.
pub fn receipt_name(height: u64) -> String {
    format!("receipt-{height:08}.note")
}

/// File name of the snapshot at `height`.
pub fn snapshot_name(height: u64) -> String {
    format!("snapshot-{height:08}.snap")
}

/// Parse a canonical `prefix-NNNNNNNN.suffix` name.
fn height_of(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let h: u64 = digits.parse().ok()?;
    (format!("{prefix}{h:08}{suffix}") == name).then_some(h)
}

/// A receipt-chain head known from outside the directory (slots 7..15, a witness, a log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// Receipt height (1 for the first checkpoint).
    pub height: u64,
    /// BLAKE3 digest of the receipt body at `height`.
    pub digest: Digest,
}

impl Anchor {
    /// The anchor the slots mirror (slot 7 height, 8..15 digest); None at height 0 or without a
    /// digest (an engine whose first asynchronous checkpoint is not durable yet: its slot 7 has
    /// moved on, but no receipt is named).
    pub fn from_slots(slots: &[u32; 32]) -> Option<Self> {
        let digest = receipt::digest_from_slots(slots);
        (slots[7] > 0 && digest != [0; 32]).then_some(Self {
            height: u64::from(slots[7]),
            digest,
        })
    }

    /// With witnesses slot 7 holds the cosigned log size, not the receipt height: when the
    /// receipt at `height` in `dir` does not have this digest but another one does, the anchor at
    /// that receipt's height. Otherwise unchanged (a rolled-back directory, lacking the digest,
    /// is still refused by the audit).
    pub fn locate(self, dir: &Path) -> Self {
        let digest_at = |h: u64| {
            std::fs::read_to_string(dir.join(receipt_name(h)))
                .ok()
                .and_then(|t| receipt::parse_unverified(&t).ok())
                .map(|(_, d)| d)
        };
        if digest_at(self.height) == Some(self.digest) {
            return self;
        }
        (1..)
            .map_while(|h| digest_at(h).map(|d| (h, d)))
            .find(|(_, d)| *d == self.digest)
            .map_or(self, |(height, digest)| Self { height, digest })
    }
}

/// What to check beyond the directory itself.
#[derive(Debug, Clone, Copy)]
pub struct AuditOptions<'a> {
    /// The engine's public key every receipt must be signed with.
    pub key: &'a VerifyingKey,
    /// Witness policy each receipt must satisfy (k valid cosignatures); None checks none.
    pub policy: Option<&'a Policy>,
    /// Expected chain head; the audit fails if the chain is shorter (rollback) or differs there
    /// (fork).
    pub anchor: Option<Anchor>,
}

/// One verified checkpoint of the chain.
#[derive(Debug, Clone)]
pub struct ChainLink {
    /// The receipt, its signature verified.
    pub receipt: SignedReceipt,
    /// Where the append-only files stood at this checkpoint (from the snapshot header).
    pub commit: StoreCommit,
    /// Size of the snapshot file in bytes.
    pub snapshot_bytes: u64,
    /// Number of sequences the snapshot holds.
    pub sequences: usize,
    /// Valid witness cosignatures (0 without a policy).
    pub cosignatures: usize,
}

/// Leftovers of an interrupted checkpoint (uncommitted; safe to discard).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Torn {
    /// Bytes of `blocks.idx` past the newest commit point.
    pub index_bytes: u64,
    /// Bytes of `blocks.seg` past the newest commit point.
    pub segment_bytes: u64,
    /// Bytes at the end of `journal.log` that do not form an intact record.
    pub journal_bytes: u64,
    /// Bytes at the end of `heads.log` that do not form an intact record.
    pub heads_bytes: u64,
    /// Names of leftover temporary files in the directory.
    pub tmp_files: Vec<String>,
    /// Name of a snapshot at the next height that has no receipt.
    pub orphan_snapshot: Option<String>,
}

impl Torn {
    /// Whether the directory shows no sign of an interrupted write.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }

    /// Human-readable lines describing what is uncommitted.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (file, n) in [
            (INDEX_FILE, self.index_bytes),
            (SEGMENT_FILE, self.segment_bytes),
            (JOURNAL_FILE, self.journal_bytes),
            (HEADS_FILE, self.heads_bytes),
        ] {
            if n > 0 {
                out.push(format!(
                    "{file}: {n} uncommitted bytes after the newest checkpoint (torn write)"
                ));
            }
        }
        for f in &self.tmp_files {
            out.push(format!("{f}: leftover temporary file (torn write)"));
        }
        if let Some(f) = &self.orphan_snapshot {
            out.push(format!(
                "{f}: snapshot without a receipt (crash before the receipt was written)"
            ));
        }
        out
    }
}

/// The result of a successful audit.
#[derive(Debug, Clone)]
pub struct Audit {
    /// Heights 1..=n in order.
    pub chain: Vec<ChainLink>,
    /// Committed index entries (as of the newest receipt).
    pub entries: Vec<IndexEntry>,
    /// The journal as scanned (intact records, markers, torn tail).
    pub journal: JournalScan,
    /// Uncommitted leftovers the audit found (not errors).
    pub torn: Torn,
    /// The verified log over the journal.
    pub log: LogAudit,
    /// Bytes of intact records in `heads.log`.
    pub log_valid_len: u64,
    /// Privacy warnings (group- or other-accessible directory or files); not errors.
    pub warnings: Vec<String>,
}

impl Audit {
    /// The newest checkpoint, if any.
    pub fn head(&self) -> Option<&ChainLink> {
        self.chain.last()
    }

    /// Committed segment bytes (sum of committed block lengths).
    pub fn segment_len(&self) -> u64 {
        self.entries
            .last()
            .map_or(0, |e| e.offset + u64::from(e.len))
    }
}

fn corrupt(file: &str, height: Option<u64>, what: impl Into<String>) -> CheckpointError {
    CheckpointError::corrupt(file, height, what)
}

/// Directory listing sorted into the files the format knows.
#[derive(Default)]
struct Listing {
    receipts: BTreeMap<u64, String>,
    snapshots: BTreeMap<u64, String>,
    tmp_files: Vec<String>,
}

fn list(dir: &Path, key: &VerifyingKey) -> Result<Listing> {
    let mut listing = Listing::default();
    let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| CheckpointError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ft = entry
            .file_type()
            .map_err(|e| CheckpointError::io(entry.path(), e))?;
        if !ft.is_file() {
            return Err(corrupt(
                &name,
                None,
                "unexpected non-file entry in checkpoint directory",
            ));
        }
        names.push(name);
    }
    names.sort();
    for name in names {
        if let Some(h) = height_of(&name, "receipt-", ".note") {
            listing.receipts.insert(h, name);
        } else if let Some(h) = height_of(&name, "snapshot-", ".snap") {
            listing.snapshots.insert(h, name);
        } else if name.ends_with(TMP_SUFFIX) {
            listing.tmp_files.push(name);
        } else if [
            SEGMENT_FILE,
            INDEX_FILE,
            JOURNAL_FILE,
            HEADS_FILE,
            COSIGNATURES_FILE,
        ]
        .contains(&name.as_str())
        {
        } else {
            // A stray receipt under another name is a fork candidate: say so when it parses.
            let text = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
            if let Ok((body, _)) = receipt::parse_unverified(&text) {
                let who = if receipt::open(&text, key).is_ok() {
                    "signed by this key"
                } else {
                    "not signed by this key"
                };
                return Err(corrupt(
                    &name,
                    Some(body.height),
                    format!(
                        "fork: a second receipt for height {} ({who}) under a non-canonical name",
                        body.height
                    ),
                ));
            }
            return Err(corrupt(
                &name,
                None,
                "unexpected file in checkpoint directory",
            ));
        }
    }
    Ok(listing)
}

/// Verify the whole directory; the first problem found is returned as the error.
pub fn audit(dir: &Path, opts: AuditOptions<'_>) -> Result<Audit> {
    audit_known(dir, opts, None)
}

/// [`audit`], also requiring the log to hold `head`, a signed tree head note known from outside
/// (a client's receipt, a witness): a shorter log is a rollback, another root a fork.
pub fn audit_known(dir: &Path, opts: AuditOptions<'_>, head: Option<&str>) -> Result<Audit> {
    let listing = list(dir, opts.key)?;
    let n = listing.receipts.keys().next_back().copied().unwrap_or(0);
    for h in 1..=n {
        if !listing.receipts.contains_key(&h) {
            return Err(corrupt(
                &receipt_name(h),
                Some(h),
                format!("receipt missing (deleted?) while receipts up to height {n} exist"),
            ));
        }
    }

    let mut chain: Vec<ChainLink> = Vec::with_capacity(n as usize);
    let mut prev: Digest = [0; 32];
    let mut prev_commit = StoreCommit::default();
    let mut referenced: Vec<(u64, Vec<Digest>)> = Vec::new(); // per height, its block hashes
    for h in 1..=n {
        let rname = receipt_name(h);
        let text = std::fs::read(dir.join(&rname))
            .map_err(|e| CheckpointError::io(dir.join(&rname), e))?;
        let text = String::from_utf8(text)
            .map_err(|_| corrupt(&rname, Some(h), "receipt is not UTF-8"))?;
        let receipt = match receipt::open(&text, opts.key) {
            Ok(r) => r,
            Err(e) => {
                let detail = match e {
                    CheckpointError::Decode(d) => d,
                    other => other.to_string(),
                };
                let what = match receipt::parse_unverified(&text) {
                    Ok(_) => format!("signature check failed: {detail}"),
                    Err(_) => format!("malformed receipt: {detail}"),
                };
                return Err(corrupt(&rname, Some(h), what));
            }
        };
        if receipt.body.height != h {
            return Err(corrupt(
                &rname,
                Some(h),
                format!(
                    "receipt claims height {} (reordered or renamed)",
                    receipt.body.height
                ),
            ));
        }
        if receipt.body.prev != prev {
            return Err(corrupt(
                &rname,
                Some(h),
                format!(
                    "chain link broken: prev {} is not the digest of receipt {} (removed, reordered or forked)",
                    to_hex(&receipt.body.prev),
                    h - 1
                ),
            ));
        }
        let cosignatures = match opts.policy {
            None => 0,
            Some(p) => {
                let k = p
                    .count_cosignatures(&receipt.note)
                    .map_err(|e| corrupt(&rname, Some(h), e.to_string()))?;
                if k < p.quorum {
                    return Err(corrupt(
                        &rname,
                        Some(h),
                        format!(
                            "not quorate: {k} valid witness cosignatures, policy needs {}",
                            p.quorum
                        ),
                    ));
                }
                k
            }
        };

        let sname = snapshot_name(h);
        let sbytes = match std::fs::read(dir.join(&sname)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(
                    &sname,
                    Some(h),
                    "snapshot missing for a committed receipt",
                ));
            }
            Err(e) => return Err(CheckpointError::io(dir.join(&sname), e)),
        };
        if snapshot_digest(&sbytes) != receipt.body.snapshot {
            return Err(corrupt(
                &sname,
                Some(h),
                "snapshot bytes do not match the receipt's snapshot digest",
            ));
        }
        let (snap, commit) =
            snapshot::decode(&sbytes).map_err(|e| corrupt(&sname, Some(h), e.to_string()))?;
        if kv_root(snap.block_lists()) != receipt.body.kv_root {
            return Err(corrupt(
                &sname,
                Some(h),
                "snapshot block lists do not match the receipt's KV root",
            ));
        }
        if commit.index_entries < prev_commit.index_entries
            || commit.segment_len < prev_commit.segment_len
            || commit.journal_len < prev_commit.journal_len
        {
            return Err(corrupt(&sname, Some(h), "commit point goes backwards"));
        }
        referenced.push((
            h,
            snap.sequences
                .iter()
                .flat_map(|s| s.blocks.iter().copied())
                .collect(),
        ));
        prev = receipt.digest;
        prev_commit = commit;
        chain.push(ChainLink {
            receipt,
            commit,
            snapshot_bytes: sbytes.len() as u64,
            sequences: snap.sequences.len(),
            cosignatures,
        });
    }

    // Snapshots without receipts: only the next height may exist (written before a crash).
    let mut torn = Torn {
        tmp_files: listing.tmp_files.clone(),
        ..Torn::default()
    };
    for (&h, name) in listing.snapshots.range(n + 1..) {
        if h == n + 1 {
            torn.orphan_snapshot = Some(name.clone());
        } else {
            return Err(corrupt(
                name,
                Some(h),
                format!(
                    "snapshot without a receipt beyond height {} (receipts deleted: rollback?)",
                    n + 1
                ),
            ));
        }
    }

    // Blocks: committed index entries and segment bytes.
    let commit = prev_commit;
    let entries = blockstore::read_index(dir, commit.index_entries)?;
    blockstore::verify_segment(dir, &entries, commit.segment_len, |_, _| {})?;
    let position: HashMap<Digest, u64> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.hash, i as u64))
        .collect();
    for (link, (h, hashes)) in chain.iter().zip(&referenced) {
        let end = link.commit.index_entries;
        let covered = if end == 0 {
            0
        } else {
            entries[end as usize - 1].offset + u64::from(entries[end as usize - 1].len)
        };
        if covered != link.commit.segment_len {
            return Err(corrupt(
                &snapshot_name(*h),
                Some(*h),
                "commit point does not match the index layout",
            ));
        }
        for hash in hashes {
            if position.get(hash).is_none_or(|&p| p >= end) {
                return Err(corrupt(
                    &snapshot_name(*h),
                    Some(*h),
                    format!(
                        "references block {} not committed at this height",
                        to_hex(hash)
                    ),
                ));
            }
        }
    }
    torn.index_bytes =
        fsutil::len_or_zero(&dir.join(INDEX_FILE))? - commit.index_entries * ENTRY_LEN as u64;
    torn.segment_bytes = fsutil::len_or_zero(&dir.join(SEGMENT_FILE))? - commit.segment_len;

    // Journal: intact records, enough of them, markers agree with the chain.
    let journal = journal::scan(dir)?;
    if journal.valid_len < commit.journal_len {
        return Err(corrupt(
            JOURNAL_FILE,
            Some(n),
            format!(
                "truncated: {} intact bytes, {} committed",
                journal.valid_len, commit.journal_len
            ),
        ));
    }
    for (mh, digest) in journal.markers() {
        if mh == 0 || mh > n {
            return Err(corrupt(
                JOURNAL_FILE,
                Some(mh),
                format!(
                    "journal records checkpoint {mh} but the newest receipt is {n} (receipts rolled back or deleted)"
                ),
            ));
        }
        if chain[mh as usize - 1].receipt.digest != *digest {
            return Err(corrupt(
                &receipt_name(mh),
                Some(mh),
                "fork: receipt differs from the one the journal recorded at this height",
            ));
        }
    }
    torn.journal_bytes = journal.torn_bytes;

    // The verifiable log: heads, consistency, every signed leaf against its record.
    let heads = tlog::scan(dir)?;
    let log = tlog::audit_log(&journal, &heads, opts.key)?;
    torn.heads_bytes = heads.torn_bytes;
    for (k, h) in log.heads.iter().enumerate() {
        let Some(c) = &h.checkpoint else { continue };
        let link = (c.height >= 1 && c.height <= n).then(|| &chain[c.height as usize - 1]);
        let agrees = link.is_some_and(|l| {
            l.receipt.digest == c.receipt
                && l.receipt.body.snapshot == c.snapshot
                && l.receipt.body.kv_root == c.kv_root
        });
        if !agrees {
            return Err(corrupt(
                &receipt_name(c.height),
                Some(c.height),
                format!(
                    "signed head {} names checkpoint {} with other digests (receipts rolled back, replaced or removed)",
                    k + 1,
                    c.height
                ),
            ));
        }
    }
    // Each checkpoint's head is signed before the next checkpoint starts.
    let named = log
        .heads
        .iter()
        .filter_map(|h| h.checkpoint.as_ref().map(|c| c.height))
        .max()
        .unwrap_or(0);
    if n >= 2 && named < n - 1 {
        return Err(corrupt(
            HEADS_FILE,
            Some(n - 1),
            format!(
                "no signed head names checkpoint {} although receipts up to {n} exist (heads removed)",
                n - 1
            ),
        ));
    }
    if let Some(text) = head {
        tlog::check_known_head(&log, text, opts.key)?;
    }
    let warnings = fsutil::exposure(dir)?;

    if let Some(a) = opts.anchor {
        if a.height > n {
            return Err(corrupt(
                &receipt_name(a.height),
                Some(a.height),
                format!(
                    "rollback: anchor is at height {} but the chain ends at {n}",
                    a.height
                ),
            ));
        }
        if a.height > 0 && chain[a.height as usize - 1].receipt.digest != a.digest {
            return Err(corrupt(
                &receipt_name(a.height),
                Some(a.height),
                "fork: receipt differs from the anchored digest",
            ));
        }
    }
    Ok(Audit {
        chain,
        entries,
        journal,
        torn,
        log,
        log_valid_len: heads.valid_len,
        warnings,
    })
}

/// The paths a recovery may touch: everything else in the directory is committed.
pub fn torn_paths(dir: &Path, torn: &Torn) -> Vec<PathBuf> {
    torn.tmp_files
        .iter()
        .chain(torn.orphan_snapshot.iter())
        .map(|f| dir.join(f))
        .collect()
}
