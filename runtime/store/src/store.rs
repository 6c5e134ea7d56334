//! The checkpoint store the engine writes through: one directory, one signing key, one chain.
//!
//! Write order per checkpoint (nothing earlier is ever rewritten):
//! 1. new KV blocks appended to `blocks.seg`, fsync; their entries appended to `blocks.idx`, fsync;
//! 2. `snapshot-N.snap` written to a temp name, fsync, renamed, directory fsync (the payload);
//! 3. `receipt-N.note` (signed) the same way — the checkpoint exists from this moment;
//! 4. a checkpoint marker appended to `journal.log`, fsync;
//! 5. a signed tree head over the whole journal appended to `heads.log`, fsync.
//!
//! Every journal append (accepted, finished, markers, sessions) adds leaves to the verifiable log
//! ([`super::tlog`]); a head is signed at every checkpoint and at every group commit of finished
//! requests (one Ed25519 signature each), after the records are durable and before the engine
//! delivers the answers, and each finished request gets a [`ResponseReceipt`].
//!
//! Opening audits the whole directory (see [`super::audit`]) and refuses anything tampered with;
//! a torn write (crash during 1–4) leaves only uncommitted leftovers, which opening discards.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use super::attest::{Leaf, ResponseReceipt};
use super::audit::{self, Anchor, Audit, AuditOptions, receipt_name, snapshot_name};
use super::blockstore::{BlockStore, ENTRY_LEN, INDEX_FILE, SEGMENT_FILE};
use super::digest::{Digest, block_hash, kv_root, snapshot_digest, to_hex};
use super::error::{CheckpointError, Result};
use super::fsutil;
use super::head::{self, HeadCheckpoint, TreeHead, origin_for};
use super::journal::{self, FinishedRecord, JOURNAL_FILE, Journal, JournalRecord, RequestRecord};
use super::merkle::{Hash, Tree, leaf_hash};
use super::note;
use super::receipt::{self, ReceiptBody};
use super::snapshot::{self, KvMode, Snapshot, StoreCommit};
use super::tlog::{HEADS_FILE, HeadRecord, HeadsLog, HeadsScan};

/// What the engine mirrors after a checkpoint: slot 7 the height, 8..15 the digest, 16..31 the
/// signature (see [`ReceiptInfo::slot_words`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptInfo {
    /// Receipt height (1 for the first checkpoint).
    pub height: u64,
    /// BLAKE3 digest of the receipt body.
    pub digest: Digest,
    /// The engine's Ed25519 signature over the body.
    pub signature: [u8; 64],
    /// Wall time in the receipt, unix milliseconds.
    pub time_ms: u64,
    /// Blocks newly stored by this checkpoint.
    pub new_blocks: u64,
    /// Bytes written by this checkpoint (blocks, index, snapshot, receipt, journal marker).
    pub bytes_written: u64,
    /// The receipt file.
    pub receipt_path: PathBuf,
}

impl ReceiptInfo {
    /// Words for slots 7..=31.
    pub fn slot_words(&self) -> [u32; 25] {
        receipt::slot_words(self.height, &self.digest, &self.signature)
    }

    /// Write them into a 32-slot array.
    pub fn mirror_into(&self, slots: &mut [u32; 32]) {
        slots[7..32].copy_from_slice(&self.slot_words());
    }
}

/// A checkpoint read back for resuming.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The receipt of the checkpoint.
    pub receipt: ReceiptInfo,
    /// The engine state it captured.
    pub snapshot: Snapshot,
    /// Where the append-only files stood at that checkpoint.
    pub commit: StoreCommit,
    /// Bytes of every block the snapshot references, by hash (each re-hashed on read).
    pub blocks: HashMap<Digest, Vec<u8>>,
    /// Requests journaled after the snapshot was taken, to re-admit in order.
    pub pending: Vec<RequestRecord>,
}

/// The chain head the store continues from.
#[derive(Debug, Clone)]
struct Head {
    height: u64,
    digest: Digest,
}

/// An open checkpoint directory.
pub struct CheckpointStore {
    dir: PathBuf,
    key: SigningKey,
    spec_digest: Digest,
    model_digest: Digest,
    blocks: BlockStore,
    journal: Journal,
    head: Option<Head>,
    recovered: Vec<String>,
    warnings: Vec<String>,
    /// Set at open when the newest head names another platform than this session's.
    platform_change: Option<String>,
    poisoned: bool,
    log: LogState,
}

/// Where and how the engine computes, for the heads' `sov-backend` / `sov-precision` /
/// `sov-sampler` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Platform {
    /// Compute backend name (e.g. `cpu`, `cuda`).
    pub backend: Option<String>,
    /// Numeric precision name (e.g. `f32`, `bf16`).
    pub precision: Option<String>,
    /// The rule sampled tokens are drawn by (e.g. `draw-1`); None in heads from before it was
    /// named.
    pub sampler: Option<String>,
}

/// The platform the newest head of a run's `heads.log` names: all `None` when there is no head
/// yet, or the newest is from before heads named their platform. Not verified here
/// ([`crate::audit`] checks the signatures); an unreadable newest head is an error.
pub fn newest_platform(heads: &HeadsScan) -> Result<Platform> {
    match heads.records.last() {
        Some((_, newest)) => note_platform(&newest.note),
        None => Ok(Platform::default()),
    }
}

/// The platform a signed head note names.
fn note_platform(note_text: &str) -> Result<Platform> {
    let head = TreeHead::parse(&note::parse(note_text)?.body)?;
    Ok(Platform {
        backend: head.backend,
        precision: head.precision,
        sampler: head.sampler,
    })
}

/// The platform a signed head note names (None: the note does not parse).
fn head_platform(note_text: &str) -> Option<Platform> {
    note_platform(note_text).ok()
}

/// What changed between the platform a run's heads name and `now`'s (None: nothing, or heads
/// of a run from before the platform lines).
fn platform_change(before: &Platform, now: &Platform) -> Option<String> {
    if before == now || (before.backend.is_none() && before.precision.is_none()) {
        return None;
    }
    let name = |p: &Platform| {
        format!(
            "{}/{}",
            p.backend.as_deref().unwrap_or("?"),
            p.precision.as_deref().unwrap_or("?")
        )
    };
    let rule = |p: &Platform| {
        p.sampler
            .clone()
            .unwrap_or_else(|| "an unnamed rule".into())
    };
    let mut said = Vec::new();
    if (&before.backend, &before.precision) != (&now.backend, &now.precision) {
        said.push(format!(
            "the run's newest head says it ran on {}, it continues on {}",
            name(before),
            name(now)
        ));
    }
    if before.sampler != now.sampler {
        said.push(format!(
            "its sampled tokens were drawn by {}, they continue by {}",
            rule(before),
            rule(now)
        ));
    }
    Some(said.join("; "))
}

/// Told of every signed head, on the thread that signed it (so: quick, never blocking): the head
/// note, its tree size, and the leaf hashes it added since the previous head. A witness client
/// keeps its own tree from these to build consistency proofs off the engine's path.
pub trait HeadSink: Send {
    /// A head was signed and is durable in `heads.log`.
    fn signed(&mut self, note: &str, size: u64, new_leaves: &[Hash]);
}

/// The verifiable log as the store continues it.
struct LogState {
    heads: HeadsLog,
    tree: Tree,
    /// Leaves covered by the newest signed head.
    signed: u64,
    newest_note: Option<String>,
    checkpoint: Option<HeadCheckpoint>,
    platform: Platform,
    sink: Option<Box<dyn HeadSink>>,
    /// Leaf index and body of each unfinished request's `Accepted` record (receipts prove it).
    accepted: HashMap<u64, (u64, Vec<u8>)>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl CheckpointStore {
    /// Open (creating if absent) `dir`, audit it and discard a torn tail. See [`Self::open_with`].
    pub fn open(
        dir: &Path,
        key: SigningKey,
        spec_digest: Digest,
        model_digest: Digest,
    ) -> Result<Self> {
        Self::open_with(dir, key, spec_digest, model_digest, None)
    }

    /// Like [`Self::open`], also checking the chain against an `anchor` (e.g.
    /// [`Anchor::from_slots`] on the persisted slots) so a rolled-back directory is refused.
    pub fn open_with(
        dir: &Path,
        key: SigningKey,
        spec_digest: Digest,
        model_digest: Digest,
        anchor: Option<Anchor>,
    ) -> Result<Self> {
        Self::open_on(
            dir,
            key,
            spec_digest,
            model_digest,
            anchor,
            Platform::default(),
        )
    }

    /// Like [`Self::open_with`], naming the backend and precision every head signed from the
    /// start carries (including a head signed at open over a crash's unsigned tail).
    pub fn open_on(
        dir: &Path,
        key: SigningKey,
        spec_digest: Digest,
        model_digest: Digest,
        anchor: Option<Anchor>,
        platform: Platform,
    ) -> Result<Self> {
        fsutil::create_private_dir(dir)?;
        let vk = key.verifying_key();
        let audit = audit::audit(
            dir,
            AuditOptions {
                key: &vk,
                policy: None,
                anchor,
            },
        )?;
        let recovered = audit.torn.describe();
        let warnings = audit.warnings.clone();
        let platform_change = audit
            .log
            .newest_note
            .as_deref()
            .and_then(|n| platform_change(&head_platform(n)?, &platform));
        Self::discard_torn(dir, &audit)?;
        let head = audit.head().map(|l| Head {
            height: l.receipt.body.height,
            digest: l.receipt.digest,
        });
        let log = LogState {
            heads: HeadsLog::new(dir),
            tree: audit.log.tree.clone(),
            signed: audit.log.signed,
            newest_note: audit.log.newest_note.clone(),
            checkpoint: audit.head().map(|l| HeadCheckpoint {
                height: l.receipt.body.height,
                receipt: l.receipt.digest,
                snapshot: l.receipt.body.snapshot,
                kv_root: l.receipt.body.kv_root,
            }),
            platform,
            sink: None,
            accepted: unfinished_requests(&audit.journal)?,
        };
        let mut store = Self {
            log,
            warnings,
            dir: dir.to_path_buf(),
            key,
            spec_digest,
            model_digest,
            blocks: BlockStore::new(dir, &audit.entries),
            journal: Journal::new(dir, audit.journal.valid_len),
            head,
            recovered,
            platform_change,
            poisoned: false,
        };
        if audit.log.tail_awaits_head {
            // A crash came between those records and their head: sign it now, so nothing else is
            // journaled after them unsigned.
            store.sign_head()?;
        }
        Ok(store)
    }

    /// Remove what an interrupted checkpoint left behind: only bytes past the newest commit and
    /// files no receipt covers.
    fn discard_torn(dir: &Path, audit: &Audit) -> Result<()> {
        if audit.torn.is_clean() {
            return Ok(());
        }
        for path in audit::torn_paths(dir, &audit.torn) {
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
        }
        fsutil::truncate_tail(
            &dir.join(INDEX_FILE),
            audit.entries.len() as u64 * ENTRY_LEN as u64,
        )?;
        fsutil::truncate_tail(&dir.join(SEGMENT_FILE), audit.segment_len())?;
        fsutil::truncate_tail(&dir.join(JOURNAL_FILE), audit.journal.valid_len)?;
        fsutil::truncate_tail(&dir.join(HEADS_FILE), audit.log_valid_len)?;
        fsutil::sync_dir(dir)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Descriptions of torn leftovers discarded at open (empty after a clean shutdown).
    pub fn recovered(&self) -> &[String] {
        &self.recovered
    }

    /// At open, when the run's newest head names another backend or precision than the one this
    /// session signs with: what each says. A run continued so is not the run an uninterrupted one
    /// would have been (its arithmetic rounds otherwise from here), and `sov audit` replays every
    /// request on the newest head's platform.
    pub fn platform_change(&self) -> Option<&str> {
        self.platform_change.as_deref()
    }

    /// Privacy warnings found at open: the directory or files in it that group or others may read.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Height of the newest checkpoint (0 when none).
    pub fn height(&self) -> u64 {
        self.head.as_ref().map_or(0, |h| h.height)
    }

    /// Whether a block is already stored (the engine then need not pass its bytes).
    pub fn contains_block(&self, hash: &Digest) -> bool {
        self.blocks.contains(hash)
    }

    /// Journal an accepted request durably (fsync) before the engine admits it.
    pub fn accept(&mut self, request: &RequestRecord) -> Result<()> {
        self.accept_all(std::slice::from_ref(request))
    }

    /// Journal several accepted requests with one fsync.
    pub fn accept_all(&mut self, requests: &[RequestRecord]) -> Result<()> {
        let records: Vec<JournalRecord> = requests
            .iter()
            .map(|r| JournalRecord::Accepted(r.clone()))
            .collect();
        self.append_records(&records).map(|_| ())
    }

    /// Append records to the journal (one write, one fsync) and their leaves to the log; returns
    /// the first one's leaf index and the records' body bytes.
    /// (Refused after a failed write: see [`Self::check_poisoned`].)
    fn append_records(&mut self, records: &[JournalRecord]) -> Result<(u64, Vec<Vec<u8>>)> {
        self.check_poisoned()?;
        self.append_unchecked(records)
    }

    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned {
            return Err(CheckpointError::Usage(
                "a previous journal or checkpoint write failed; reopen the store".into(),
            ));
        }
        Ok(())
    }

    fn append_unchecked(&mut self, records: &[JournalRecord]) -> Result<(u64, Vec<Vec<u8>>)> {
        let bodies = records
            .iter()
            .map(journal::encode_body)
            .collect::<Result<Vec<_>>>()?;
        self.journal.append_bodies(&bodies)?;
        let first = self.log.tree.size();
        for (i, (r, b)) in records.iter().zip(&bodies).enumerate() {
            self.log.tree.push(leaf_hash(b));
            if let JournalRecord::Accepted(a) = r {
                self.log
                    .accepted
                    .insert(a.request_id, (first + i as u64, b.clone()));
            }
        }
        Ok((first, bodies))
    }

    /// Leaf index and body of request `id`'s `Accepted` record (scans the journal when the
    /// request was finished before, e.g. finished again after a resume).
    fn request_leaf(&self, id: u64) -> Result<(u64, Vec<u8>)> {
        if let Some(found) = self.log.accepted.get(&id) {
            return Ok(found.clone());
        }
        let scan = journal::scan(&self.dir)?;
        for (i, (_, r)) in scan.records.iter().enumerate() {
            if matches!(r, JournalRecord::Accepted(a) if a.request_id == id) {
                return Ok((i as u64, journal::encode_body(r)?));
            }
        }
        Err(CheckpointError::Usage(format!(
            "request {id} has no Accepted record in the journal"
        )))
    }

    /// Sign a head over every leaf so far and append it to `heads.log` (fsync); returns its note.
    fn sign_head(&mut self) -> Result<String> {
        let log = &mut self.log;
        let size = log.tree.size();
        let first = log
            .tree
            .leaves()
            .first()
            .ok_or_else(|| CheckpointError::Usage("no records to sign a head over".into()))?;
        let root = log
            .tree
            .root(size)
            .map_err(|e| CheckpointError::Usage(e.to_string()))?;
        let body = TreeHead {
            origin: origin_for(first),
            size,
            root,
            spec: self.spec_digest,
            model: self.model_digest,
            checkpoint: log.checkpoint.clone(),
            backend: log.platform.backend.clone(),
            precision: log.platform.precision.clone(),
            sampler: log.platform.sampler.clone(),
        };
        let note = head::sign(&body, &self.key)?;
        log.heads.append(&HeadRecord {
            note: note.clone(),
            leaves: log.tree.leaves()[log.signed as usize..].to_vec(),
        })?;
        if let Some(sink) = log.sink.as_mut() {
            sink.signed(&note, size, &log.tree.leaves()[log.signed as usize..]);
        }
        log.signed = size;
        log.newest_note = Some(note.clone());
        Ok(note)
    }

    /// Tell `sink` of every head signed from now on; it is first told of the newest head so far
    /// (with every leaf it covers), if any.
    pub fn set_head_sink(&mut self, mut sink: Box<dyn HeadSink>) {
        let log = &self.log;
        if let Some(note) = &log.newest_note {
            sink.signed(note, log.signed, &log.tree.leaves()[..log.signed as usize]);
        }
        self.log.sink = Some(sink);
    }

    /// Names the backend and precision the heads signed from now on carry.
    pub fn set_platform(&mut self, platform: Platform) {
        self.log.platform = platform;
    }

    /// Leaves in the log (every journal record).
    pub fn log_size(&self) -> u64 {
        self.log.tree.size()
    }

    /// Leaves covered by the newest signed head; records at or past this index were journaled but
    /// are not attested yet (after a crash: never delivered).
    pub fn signed_size(&self) -> u64 {
        self.log.signed
    }

    /// The newest signed head note, if any.
    pub fn newest_head(&self) -> Option<&str> {
        self.log.newest_note.as_deref()
    }

    /// Receipts of every request's newest signed `Finished` record against the newest head, by
    /// request id (one journal scan; for a resume reporting requests finished before it).
    pub fn signed_receipts(&self) -> Result<HashMap<u64, ResponseReceipt>> {
        let Some(note) = self.log.newest_note.as_deref() else {
            return Ok(HashMap::new());
        };
        let scan = journal::scan(&self.dir)?;
        let mut newest: HashMap<u64, usize> = HashMap::new();
        let mut accepted: HashMap<u64, usize> = HashMap::new();
        for (i, (_, r)) in scan
            .records
            .iter()
            .enumerate()
            .take(self.log.signed as usize)
        {
            match r {
                JournalRecord::Finished(f) => {
                    newest.insert(f.request_id, i);
                }
                JournalRecord::Accepted(a) => {
                    accepted.entry(a.request_id).or_insert(i);
                }
                _ => {}
            }
        }
        let mut out = HashMap::with_capacity(newest.len());
        for (id, i) in newest {
            let Some(&a) = accepted.get(&id) else {
                continue; // the audit refuses a Finished record without its Accepted one
            };
            out.insert(id, self.receipt_at(&scan, i, a, note)?);
        }
        Ok(out)
    }

    fn receipt_at(
        &self,
        scan: &journal::JournalScan,
        index: usize,
        request: usize,
        note: &str,
    ) -> Result<ResponseReceipt> {
        let body = journal::encode_body(&scan.records[index].1)?;
        let req = journal::encode_body(&scan.records[request].1)?;
        for (i, b) in [(index, &body), (request, &req)] {
            if self.log.tree.leaves().get(i) != Some(&leaf_hash(b)) {
                return Err(CheckpointError::corrupt(
                    JOURNAL_FILE,
                    None,
                    format!("record {i} changed since the store was opened"),
                ));
            }
        }
        ResponseReceipt::build(
            &self.log.tree,
            Leaf {
                index: index as u64,
                body: &body,
            },
            Leaf {
                index: request as u64,
                body: &req,
            },
            note,
            self.log.signed,
        )
    }

    /// The receipt of request `request_id`'s newest signed `Finished` record, against the newest
    /// head (for reporting a request finished before an interruption); None when it has none.
    pub fn receipt_for(&self, request_id: u64) -> Result<Option<ResponseReceipt>> {
        let Some(note) = self.log.newest_note.as_deref() else {
            return Ok(None);
        };
        let scan = journal::scan(&self.dir)?;
        let found = scan
            .records
            .iter()
            .enumerate()
            .take(self.log.signed as usize)
            .rev()
            .find(
                |(_, (_, r))| matches!(r, JournalRecord::Finished(f) if f.request_id == request_id),
            );
        let Some((index, _)) = found else {
            return Ok(None);
        };
        let accepted = scan.records.iter().position(
            |(_, r)| matches!(r, JournalRecord::Accepted(a) if a.request_id == request_id),
        );
        match accepted {
            Some(a) => self.receipt_at(&scan, index, a, note).map(Some),
            None => Ok(None),
        }
    }

    /// Records this engine process in the journal (model and spec digests), after checking them
    /// against the previous process's record: a run is only continued by the same model and spec.
    pub fn begin_session(&mut self) -> Result<()> {
        let scan = journal::scan(&self.dir)?;
        let previous = scan.records.iter().rev().find_map(|(_, r)| match r {
            JournalRecord::Session { model, spec, .. } => Some((*model, *spec)),
            _ => None,
        });
        if let Some((model, spec)) = previous {
            if model != self.model_digest {
                return Err(CheckpointError::Usage(format!(
                    "this run was started with model {}, this engine runs {}",
                    to_hex(&model),
                    to_hex(&self.model_digest)
                )));
            }
            if spec != self.spec_digest {
                return Err(CheckpointError::Usage(format!(
                    "this run was started with spec {}, this engine runs {}",
                    to_hex(&spec),
                    to_hex(&self.spec_digest)
                )));
            }
        }
        self.append_records(&[JournalRecord::Session {
            model: self.model_digest,
            spec: self.spec_digest,
            started_ms: now_ms(),
        }])
        .map(|_| ())
    }

    /// Journal finished requests durably (one fsync) and sign a head over them (one signature,
    /// one fsync) before their last outputs are delivered. See [`Self::finish`].
    pub fn finished(&mut self, records: &[FinishedRecord]) -> Result<()> {
        self.finish(records).map(|_| ())
    }

    /// [`Self::finished`], returning each request's receipt (in `records` order).
    pub fn finish(&mut self, records: &[FinishedRecord]) -> Result<Vec<ResponseReceipt>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let requests = records
            .iter()
            .map(|r| self.request_leaf(r.request_id))
            .collect::<Result<Vec<_>>>()?;
        let records: Vec<JournalRecord> = records
            .iter()
            .map(|r| JournalRecord::Finished(r.clone()))
            .collect();
        let (first, bodies) = self.append_records(&records)?;
        // Nothing else may be journaled until these records have their head (see tlog's tail rule).
        self.poisoned = true;
        let note = self.sign_head()?;
        self.poisoned = false;
        let size = self.log.signed;
        let out = bodies
            .iter()
            .zip(&requests)
            .enumerate()
            .map(|(i, (b, (ri, rb)))| {
                ResponseReceipt::build(
                    &self.log.tree,
                    Leaf {
                        index: first + i as u64,
                        body: b,
                    },
                    Leaf {
                        index: *ri,
                        body: rb,
                    },
                    &note,
                    size,
                )
            })
            .collect();
        for r in &records {
            if let JournalRecord::Finished(f) = r {
                self.log.accepted.remove(&f.request_id);
            }
        }
        out
    }

    /// The whole journal as it stands (accepted, finished and checkpoint records).
    pub fn journal_scan(&self) -> Result<journal::JournalScan> {
        journal::scan(&self.dir)
    }

    /// Write a checkpoint: store the blocks among `new_blocks` not stored yet, then the snapshot and
    /// its signed receipt. Every block hash the snapshot names must be stored or supplied.
    /// After an I/O error the store refuses further writes; reopen it (that recovers).
    pub fn write(&mut self, snapshot: &Snapshot, new_blocks: &[&[u8]]) -> Result<ReceiptInfo> {
        let hashed: Vec<(Digest, &[u8])> = new_blocks.iter().map(|b| (block_hash(b), *b)).collect();
        self.write_hashed(snapshot, &hashed)
    }

    /// Store KV blocks ahead of the snapshot that will name them (deduplicated; segment then index
    /// fsynced). Each hash must be [`block_hash`] of exactly its bytes. Until a snapshot written
    /// by [`Self::write_hashed`] commits them they are torn leftovers that the next open discards,
    /// so an asynchronous checkpoint can make its payload durable piece by piece, with bounded
    /// memory, before the receipt that names it. Returns (new blocks, bytes appended).
    pub fn append_blocks(&mut self, blocks: &[(Digest, &[u8])]) -> Result<(u64, u64)> {
        if self.poisoned {
            return Err(CheckpointError::Usage(
                "a previous checkpoint write failed; reopen the store".into(),
            ));
        }
        self.poisoned = true;
        let out = self.blocks.append(blocks)?;
        self.poisoned = false;
        Ok(out)
    }

    /// [`Self::write`] for blocks whose hashes the caller already computed with [`block_hash`] over
    /// exactly these bytes (the driver does, once per block); saves hashing them twice.
    pub fn write_hashed(
        &mut self,
        snapshot: &Snapshot,
        new_blocks: &[(Digest, &[u8])],
    ) -> Result<ReceiptInfo> {
        if self.poisoned {
            return Err(CheckpointError::Usage(
                "a previous checkpoint write failed; reopen the store".into(),
            ));
        }
        if snapshot.kv_mode == KvMode::Recompute
            && snapshot
                .sequences
                .iter()
                .any(|s| !s.blocks.is_empty() || !s.tail.is_empty())
        {
            return Err(CheckpointError::Usage(
                "recompute-mode snapshots carry tokens only (no blocks or tails)".into(),
            ));
        }
        self.poisoned = true;
        let (new, block_bytes) = self.blocks.append(new_blocks)?;
        for seq in &snapshot.sequences {
            for h in &seq.blocks {
                if !self.blocks.contains(h) {
                    self.poisoned = false; // nothing committed yet; appended blocks are harmless
                    return Err(CheckpointError::Usage(format!(
                        "request {}: block {} is neither stored nor supplied",
                        seq.request_id,
                        to_hex(h)
                    )));
                }
            }
        }
        let height = self.height() + 1;
        let commit = StoreCommit {
            index_entries: self.blocks.entries(),
            segment_len: self.blocks.segment_len(),
            journal_len: self.journal.len(),
        };
        let bytes = snapshot::encode(snapshot, &commit)?;
        fsutil::write_once(&self.dir, &snapshot_name(height), &bytes)?;
        let body = ReceiptBody {
            height,
            prev: self.head.as_ref().map_or([0; 32], |h| h.digest),
            spec: self.spec_digest,
            model: self.model_digest,
            snapshot: snapshot_digest(&bytes),
            kv_root: kv_root(snapshot.block_lists()),
            time_ms: now_ms(),
        };
        let text = receipt::sign(&body, &self.key)?;
        fsutil::write_once(&self.dir, &receipt_name(height), text.as_bytes())?;
        let signed = receipt::open(&text, &self.key.verifying_key())?;
        let marker_at = self.journal.len();
        self.append_unchecked(&[JournalRecord::Checkpoint {
            height,
            receipt: signed.digest,
        }])?;
        self.head = Some(Head {
            height,
            digest: signed.digest,
        });
        self.log.checkpoint = Some(HeadCheckpoint {
            height,
            receipt: signed.digest,
            snapshot: body.snapshot,
            kv_root: body.kv_root,
        });
        self.sign_head()?;
        self.poisoned = false;
        Ok(ReceiptInfo {
            height,
            digest: signed.digest,
            signature: signed.signature,
            time_ms: body.time_ms,
            new_blocks: new,
            bytes_written: block_bytes
                + bytes.len() as u64
                + text.len() as u64
                + (self.journal.len() - marker_at),
            receipt_path: self.dir.join(receipt_name(height)),
        })
    }

    /// The newest checkpoint, verified (receipt, snapshot digest, block hashes), with the requests
    /// journaled after it; None when no checkpoint exists (see [`Self::pending_without_checkpoint`]).
    /// Refuses a checkpoint made by another spec or model.
    pub fn latest_valid(&self) -> Result<Option<Restored>> {
        let Some(head) = &self.head else {
            return Ok(None);
        };
        let rname = receipt_name(head.height);
        let rpath = self.dir.join(&rname);
        let text = std::fs::read_to_string(&rpath).map_err(|e| CheckpointError::io(&rpath, e))?;
        let signed = receipt::open(&text, &self.key.verifying_key())
            .map_err(|e| CheckpointError::corrupt(&rname, Some(head.height), e.to_string()))?;
        if signed.digest != head.digest {
            return Err(CheckpointError::corrupt(
                &rname,
                Some(head.height),
                "receipt changed since the store was opened",
            ));
        }
        if signed.body.model != self.model_digest {
            return Err(CheckpointError::Usage(format!(
                "checkpoint {} was made with model {}, this engine runs {}",
                head.height,
                to_hex(&signed.body.model),
                to_hex(&self.model_digest)
            )));
        }
        if signed.body.spec != self.spec_digest {
            return Err(CheckpointError::Usage(format!(
                "checkpoint {} was made by spec {}, this engine runs {}",
                head.height,
                to_hex(&signed.body.spec),
                to_hex(&self.spec_digest)
            )));
        }
        let sname = snapshot_name(head.height);
        let spath = self.dir.join(&sname);
        let bytes = std::fs::read(&spath).map_err(|e| CheckpointError::io(&spath, e))?;
        if snapshot_digest(&bytes) != signed.body.snapshot {
            return Err(CheckpointError::corrupt(
                &sname,
                Some(head.height),
                "snapshot does not match its receipt",
            ));
        }
        let (snapshot, commit) = snapshot::decode(&bytes)
            .map_err(|e| CheckpointError::corrupt(&sname, Some(head.height), e.to_string()))?;
        let mut blocks = HashMap::new();
        for h in snapshot.sequences.iter().flat_map(|s| s.blocks.iter()) {
            if !blocks.contains_key(h) {
                blocks.insert(*h, self.blocks.read(h)?);
            }
        }
        let pending = journal::scan(&self.dir)?.accepted_since(commit.journal_len);
        Ok(Some(Restored {
            receipt: ReceiptInfo {
                height: head.height,
                digest: signed.digest,
                signature: signed.signature,
                time_ms: signed.body.time_ms,
                new_blocks: 0,
                bytes_written: 0,
                receipt_path: rpath,
            },
            snapshot,
            commit,
            blocks,
            pending,
        }))
    }

    /// Requests journaled when no checkpoint exists yet (a crash before the first checkpoint).
    pub fn pending_without_checkpoint(&self) -> Result<Vec<RequestRecord>> {
        if self.head.is_some() {
            return Ok(Vec::new());
        }
        Ok(journal::scan(&self.dir)?.accepted_since(0))
    }
}

/// Leaf index and body of the `Accepted` record of every request the journal has not finished.
fn unfinished_requests(scan: &journal::JournalScan) -> Result<HashMap<u64, (u64, Vec<u8>)>> {
    let mut out = HashMap::new();
    for (i, (_, r)) in scan.records.iter().enumerate() {
        match r {
            JournalRecord::Accepted(a) => {
                out.insert(a.request_id, (i as u64, journal::encode_body(r)?));
            }
            JournalRecord::Finished(f) => {
                out.remove(&f.request_id);
            }
            _ => {}
        }
    }
    Ok(out)
}
