//! The checkpoint side path as the engine runs it: [`open`] gives a [`WormHook`] (the engine's
//! `checkpoint` / `restore` actions and the journal of finished requests), a [`JournalAcceptor`]
//! (journals each request in `Engine::submit`, before it is queued) and the [`ResumeBook`] a
//! resumed engine fills in for its front end. Both share one [`Checkpointer`] behind a mutex: the
//! journal is one append-only file.
//!
//! Design: the journal is the list of every request ever accepted, with a `Finished` record for
//! each one delivered. A resume from disk reconciles it against the newest valid checkpoint:
//! finished requests are reported from their record; unfinished ones in the snapshot continue
//! from it (KV copied back in `Blocks` mode); every other accepted request (accepted after the
//! snapshot, or still on its way into the engine when the snapshot was taken) starts again from its
//! prompt with the seed it was given, which reproduces its output exactly. An in-process restore
//! (the `resume` power event) treats the live sequences as the truth: a snapshot sequence is used
//! only where it equals the live one (after a suspend nothing ran), others are recomputed, so a
//! client never receives a token twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};

use ed25519_dalek::SigningKey;

use super::async_blocks::{AsyncBlocks, AsyncTotals, LockQueue};
use super::core_io::{checkpoint_core, fresh_sequence, request_record, restore_core};
use crate::checkpoint::attest::ResponseReceipt;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo};
use crate::checkpoint::journal::{FinishedRecord, JournalRecord, RequestRecord};
use crate::checkpoint::snapshot::{KvLayout, KvMode};
use crate::checkpoint::store::{CheckpointStore, HeadSink, Platform, Restored};
use crate::checkpoint::{Anchor, CheckpointError, Digest, Result};
use crate::engine::core::EngineCore;
use crate::engine::error::EngineError;
use crate::engine::forward::ForwardModel;
use crate::engine::hook::{CheckpointHook, RequestJournal};
use crate::engine::output::{Finished, Output};
use crate::engine::sequence::Sequence;

/// One request a resumed engine reports: still generating, or finished before the interruption.
pub enum ResumedRequest {
    /// Continues in the engine; its remaining output arrives here, and the final event's
    /// `Finished` holds the whole output (tokens generated before the checkpoint included).
    Live {
        /// The request's id.
        id: u64,
        /// The request's output stream.
        rx: Receiver<Output>,
        /// Tokens in the request's prompt.
        prompt_tokens: usize,
        /// The front end's bytes journaled with the request ([`crate::engine::Request::tag`]).
        tag: Vec<u8>,
        /// Tokens generated before the checkpoint it continues from (delivered then; the stream
        /// carries only what follows), empty when it starts again from its prompt.
        output: Vec<u32>,
        /// The text of `output` as it was delivered.
        text: String,
    },
    /// Delivered before the interruption; the journal holds what was delivered.
    Finished {
        /// What was delivered.
        record: FinishedRecord,
        /// The front end's bytes journaled with the request.
        tag: Vec<u8>,
    },
}

/// What a resume from disk found, for the front end.
#[derive(Default)]
pub struct ResumeBook {
    /// Every accepted request by id.
    pub requests: BTreeMap<u64, ResumedRequest>,
    /// Height of the checkpoint resumed from (0: none existed; everything restarted from the journal).
    pub height: u64,
    /// Wall time of the restore (reading and checking the checkpoint, KV copied back).
    pub restore_time: std::time::Duration,
    /// Receipts of finished requests by id (see `checkpoint::attest`): added as each group of
    /// finished requests is journaled and signed, before its final events are sent, and on a
    /// resume for the requests finished before the interruption. The front end takes them; at most
    /// [`MAX_HELD_RECEIPTS`] are held (the lowest ids are dropped first).
    pub receipts: BTreeMap<u64, ResponseReceipt>,
}

/// Most receipts a [`ResumeBook`] holds for the front end to take (about 1 KB each).
pub const MAX_HELD_RECEIPTS: usize = 1 << 16;

impl ResumeBook {
    fn hold_receipts(&mut self, receipts: impl IntoIterator<Item = (u64, ResponseReceipt)>) {
        self.receipts.extend(receipts);
        while self.receipts.len() > MAX_HELD_RECEIPTS {
            self.receipts.pop_first();
        }
    }
}

/// Where and how an engine checkpoints.
pub struct WormConfig {
    /// The checkpoint directory (created when absent).
    pub dir: PathBuf,
    /// Signs the receipts.
    pub key: SigningKey,
    /// `SPEC_DIGEST` of the machine that runs (receipts carry it; a resume under another spec is
    /// refused).
    pub spec_digest: Digest,
    /// Digest of the model weights and config (a resume with other weights is refused).
    pub model_digest: Digest,
    /// The chain head the persisted slots remember (refuses a rolled-back directory).
    pub anchor: Option<Anchor>,
    /// Whether checkpoints store KV blocks or tokens only.
    pub mode: KvMode,
    /// The first restore reads the journal and disk (process start with `--resume`).
    pub resume: bool,
    /// Backend and precision every signed head names (`sov audit` reads them).
    pub platform: Platform,
}

/// The machine state whose `checkpoint` action is the periodic one (both specs name it so): in
/// `Blocks` mode it may be deferred while the previous checkpoint is not durable yet.
pub const PERIODIC_STATE: &str = "checkpoint";

/// The three handles [`open`] returns.
pub struct Worm {
    /// The engine's `checkpoint` / `restore` actions.
    pub hook: WormHook,
    /// Journals accepted requests before the engine admits them.
    pub acceptor: Arc<JournalAcceptor>,
    /// Filled by the first restore: what the resume found.
    pub book: Arc<Mutex<ResumeBook>>,
    /// Torn leftovers of an interrupted checkpoint that opening discarded.
    pub recovered: Vec<String>,
    /// Set when the run's newest head names another backend or precision than this session's
    /// (`CheckpointStore::platform_change`): the resume cannot continue the run exactly.
    pub platform_change: Option<String>,
    /// Height of the newest valid checkpoint at open.
    pub height: u64,
}

impl Worm {
    /// Tell `sink` of every signed head (see [`HeadSink`]), starting with the newest so far.
    pub fn set_head_sink(&self, sink: Box<dyn HeadSink>) -> Result<()> {
        self.hook
            .cp
            .lock()
            .map_err(|_| CheckpointError::Usage("checkpoint store lock poisoned".into()))?
            .store_mut()
            .set_head_sink(sink);
        Ok(())
    }

    /// With witnesses, slot `bft_quorum_height` holds the newest log size cosigned by a quorum
    /// (kept in `height` by the witness client), not the checkpoint count: the `checkpoint`
    /// action then leaves it there (it publishes `height - 1`, which the machine's `+= 1` after
    /// the action brings back).
    pub fn set_quorum_height(&mut self, height: Arc<AtomicU32>) {
        self.hook.quorum = Some(height);
    }
}

/// Opens (creating) the checkpoint directory and builds the engine's handles.
pub fn open(cfg: WormConfig) -> Result<Worm> {
    let mut store = CheckpointStore::open_on(
        &cfg.dir,
        cfg.key,
        cfg.spec_digest,
        cfg.model_digest,
        cfg.anchor,
        cfg.platform,
    )?;
    store.begin_session()?;
    let recovered = store.recovered().to_vec();
    let platform_change = store.platform_change().map(str::to_string);
    let height = store.height();
    let next_id = store
        .journal_scan()?
        .records
        .iter()
        .filter_map(|(_, r)| match r {
            JournalRecord::Accepted(a) => Some(a.request_id),
            _ => None,
        })
        .max()
        .map_or(1, |m| m + 1);
    let cp = Arc::new(Mutex::new(Checkpointer::new(store, cfg.mode)));
    let book = Arc::new(Mutex::new(ResumeBook::default()));
    let queue = LockQueue::default();
    let writer = match cfg.mode {
        KvMode::Blocks => Some(AsyncBlocks::start_queued(cp.clone(), queue.clone())?),
        KvMode::Recompute => None,
    };
    Ok(Worm {
        hook: WormHook {
            cp: cp.clone(),
            book: book.clone(),
            from_disk: cfg.resume,
            quorum: None,
            writer,
            owed: false,
            queue: queue.clone(),
        },
        acceptor: Arc::new(JournalAcceptor { cp, next_id, queue }),
        book,
        recovered,
        platform_change,
        height,
    })
}

fn lock(
    cp: &Mutex<Checkpointer>,
) -> std::result::Result<MutexGuard<'_, Checkpointer>, EngineError> {
    cp.lock()
        .map_err(|_| EngineError::Checkpoint("checkpoint store lock poisoned".into()))
}

fn engine_err(e: CheckpointError) -> EngineError {
    EngineError::Checkpoint(e.to_string())
}

fn kv_of<F: ForwardModel>(model: &mut F) -> Option<&mut dyn KvBlockIo> {
    model.kv_io()
}

/// The layout a `Blocks` checkpoint must match (a model without KV access has none).
fn layout_of<F: ForwardModel>(model: &mut F) -> KvLayout {
    model.kv_io().map_or(
        KvLayout {
            layers: 0,
            kv_heads: 0,
            head_dim: 0,
            block_size: 0,
            dtype: String::new(),
        },
        |io| io.kv_layout(),
    )
}

/// Journals accepted requests from `Engine::submit`.
pub struct JournalAcceptor {
    cp: Arc<Mutex<Checkpointer>>,
    next_id: u64,
    /// Takes the store's lock ahead of the checkpoint writer.
    queue: LockQueue,
}

impl RequestJournal for JournalAcceptor {
    fn accept(&self, seq: &Sequence) -> std::result::Result<(), EngineError> {
        self.accept_all(std::slice::from_ref(seq))
    }

    fn accept_all(&self, seqs: &[Sequence]) -> std::result::Result<(), EngineError> {
        let records: Vec<_> = seqs
            .iter()
            .map(|s| request_record(s, s.text.stops().to_vec()))
            .collect();
        self.queue
            .lock(&self.cp)
            .map_err(engine_err)?
            .accept_all(&records)
            .map_err(engine_err)
    }

    fn next_id(&self) -> u64 {
        self.next_id
    }
}

/// The engine's `checkpoint` / `restore` actions over a WORM store.
pub struct WormHook {
    cp: Arc<Mutex<Checkpointer>>,
    book: Arc<Mutex<ResumeBook>>,
    /// The next restore is a resume from disk (journal reconciliation), not a power event.
    from_disk: bool,
    /// Witness mode: what slot `bft_quorum_height` holds (see [`Worm::set_quorum_height`]).
    quorum: Option<Arc<AtomicU32>>,
    /// `Blocks` mode: the asynchronous checkpoint writer.
    writer: Option<AsyncBlocks>,
    /// The last periodic checkpoint was deferred (an in-process restore takes it first).
    owed: bool,
    /// Takes the store's lock ahead of the checkpoint writer.
    queue: LockQueue,
}

impl WormHook {
    /// Totals of the asynchronous `Blocks`-mode checkpoints written so far (None in `Recompute`
    /// mode, where checkpoints are written in the action).
    pub fn async_totals(&self) -> Option<AsyncTotals> {
        self.writer.as_ref().map(|w| w.totals())
    }

    /// Publishes the receipts of checkpoints the writer finished (all of them when `all`): slots
    /// 7..31 get the newest one's height, digest and signature.
    fn publish<F: ForwardModel>(
        &mut self,
        core: &mut EngineCore<F>,
        all: bool,
    ) -> std::result::Result<(), EngineError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        if let Some(done) = w.poll(all).map_err(engine_err)? {
            let mut raw = core.slots().raw();
            raw[7..32].copy_from_slice(&done.receipt.slot_words());
            core.slots().load_raw(&raw);
        }
        Ok(())
    }
}

impl<F: ForwardModel> CheckpointHook<EngineCore<F>> for WormHook {
    fn checkpoint(&mut self, core: &mut EngineCore<F>) -> std::result::Result<(), EngineError> {
        if self.writer.is_some() && core.model_mut().kv_io().is_some() {
            // Slots 7..31 only ever name a durable receipt (the slot file is the anchor a resume
            // checks): the newest one the writer finished. Before the first one, slot 7 moves to
            // 1 with no digest (the machine's `bft_quorum_height += 1`), which names no receipt
            // and which a resume ignores (`Anchor::from_slots`); nothing waits for the disk.
            self.publish(core, false)?;
            // The machine's periodic checkpoint (taken from its `checkpoint` state) may be
            // deferred while the previous one is not durable; an interrupt's (suspend, low
            // battery, shutdown) is always handed over.
            let periodic = core.machine_state().1 == PERIODIC_STATE;
            if let Some(w) = self.writer.as_mut() {
                let stops = |s: &Sequence| s.text.stops().to_vec();
                self.owed = if periodic {
                    w.try_checkpoint(core, &stops)
                        .map_err(engine_err)?
                        .is_none()
                } else {
                    w.checkpoint(core, &stops).map_err(engine_err)?;
                    false
                };
            }
            let published = core.slots().raw()[7];
            core.slots()
                .set_bft_quorum_height(published.saturating_sub(1));
            if let Some(q) = &self.quorum {
                core.slots()
                    .set_bft_quorum_height(q.load(Ordering::Acquire).wrapping_sub(1));
            }
            return Ok(());
        }
        let mut cp = lock(&self.cp)?;
        let (machine, state) = core.machine_state();
        checkpoint_core(&mut cp, core, machine, state, kv_of::<F>, &|s| {
            s.text.stops().to_vec()
        })
        .map_err(engine_err)?;
        if let Some(q) = &self.quorum {
            core.slots()
                .set_bft_quorum_height(q.load(Ordering::Acquire).wrapping_sub(1));
        }
        Ok(())
    }

    fn restore(&mut self, core: &mut EngineCore<F>) -> std::result::Result<(), EngineError> {
        // In process, a deferred periodic checkpoint (an interrupt taken from the `checkpoint`
        // state looks like one) is taken now: nothing has run since, so it is the live state.
        if !self.from_disk
            && std::mem::take(&mut self.owed)
            && let Some(w) = self.writer.as_mut()
        {
            w.checkpoint(core, &|s| s.text.stops().to_vec())
                .map_err(engine_err)?;
        }
        // The newest checkpoint must be on disk before it is read back.
        self.publish(core, true)?;
        let t0 = std::time::Instant::now();
        let cp = lock(&self.cp)?;
        let layout = layout_of(core.model_mut());
        let restored = cp.latest(&layout).map_err(engine_err)?;
        let scan = cp.store().journal_scan().map_err(engine_err)?;
        let height = cp.store().height();
        let receipts = if self.from_disk {
            cp.store().signed_receipts().map_err(engine_err)?
        } else {
            HashMap::new()
        };
        drop(cp);
        let finished: HashMap<u64, FinishedRecord> =
            scan.finished().map(|f| (f.request_id, f.clone())).collect();
        if std::mem::take(&mut self.from_disk) {
            let mut book = self
                .book
                .lock()
                .map_err(|_| EngineError::Checkpoint("resume book lock poisoned".into()))?;
            book.height = if restored.is_some() { height } else { 0 };
            book.hold_receipts(receipts);
            resume_from_disk(core, restored, scan.accepted(), &finished, &mut book)?;
            book.restore_time = t0.elapsed();
            Ok(())
        } else {
            resume_in_process(core, restored, &finished)
        }
    }

    fn finished(
        &mut self,
        done: &[(&Sequence, &Finished)],
    ) -> std::result::Result<(), EngineError> {
        // (No core here: receipts of finished checkpoints are published by the next action.)
        if done.is_empty() {
            return Ok(());
        }
        let records: Vec<FinishedRecord> = done
            .iter()
            .map(|(seq, fin)| FinishedRecord {
                request_id: seq.id,
                output: fin.output_tokens.clone(),
                text: fin.text.clone(),
                reason: fin.reason.as_openai().to_string(),
                detail: format!("{:?}", fin.reason),
            })
            .collect();
        let ids: Vec<u64> = records.iter().map(|r| r.request_id).collect();
        let t0 = std::time::Instant::now();
        let mut cp = self.queue.lock(&self.cp).map_err(engine_err)?;
        let waited = t0.elapsed();
        let receipts = cp.finish(&records).map_err(engine_err)?;
        drop(cp);
        if waited > std::time::Duration::from_millis(2) {
            tracing::info!(
                "journal of {} finished requests: waited {:.1} ms for the store lock, wrote in {:.1} ms",
                records.len(),
                waited.as_secs_f64() * 1e3,
                (t0.elapsed() - waited).as_secs_f64() * 1e3
            );
        }
        self.book
            .lock()
            .map_err(|_| EngineError::Checkpoint("resume book lock poisoned".into()))?
            .hold_receipts(ids.into_iter().zip(receipts));
        Ok(())
    }
}

/// Process start with `--resume`: the core is empty; every accepted request is accounted for.
fn resume_from_disk<F: ForwardModel>(
    core: &mut EngineCore<F>,
    restored: Option<Restored>,
    accepted: Vec<RequestRecord>,
    finished: &HashMap<u64, FinishedRecord>,
    book: &mut ResumeBook,
) -> std::result::Result<(), EngineError> {
    let mut new_rx: HashMap<u64, Receiver<Output>> = HashMap::new();
    let mut channel = |id: u64| -> Sender<Output> {
        let (tx, rx) = mpsc::channel();
        new_rx.insert(id, rx);
        tx
    };
    let mut prompt_len: HashMap<u64, usize> = HashMap::new();
    let mut tags: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut again = Vec::new();
    for req in accepted {
        if !seen.insert(req.request_id) {
            continue;
        }
        prompt_len.insert(req.request_id, req.prompt.len());
        if let Some(f) = finished.get(&req.request_id) {
            book.requests.insert(
                req.request_id,
                ResumedRequest::Finished {
                    record: f.clone(),
                    tag: req.extra.clone(),
                },
            );
        } else {
            tags.insert(req.request_id, req.extra.clone());
            again.push(req);
        }
    }
    match restored {
        Some(mut r) => {
            r.snapshot
                .sequences
                .retain(|s| !finished.contains_key(&s.request_id));
            let in_snapshot: HashSet<u64> =
                r.snapshot.sequences.iter().map(|s| s.request_id).collect();
            r.pending = again
                .into_iter()
                .filter(|req| !in_snapshot.contains(&req.request_id))
                .collect();
            restore_core(core, &r, kv_of::<F>, &mut channel).map_err(engine_err)?;
        }
        None => {
            for req in &again {
                let seq =
                    fresh_sequence(req, core.codec(), core.grammar(), channel(req.request_id))
                        .map_err(engine_err)?;
                core.enqueue(seq);
            }
        }
    }
    let mut prefixes: HashMap<u64, (Vec<u32>, String)> = core
        .sequences()
        .map(|s| (s.id, (s.output().to_vec(), s.text.emitted().to_string())))
        .collect();
    for (id, rx) in new_rx {
        let prompt_tokens = prompt_len.get(&id).copied().unwrap_or(0);
        let (output, text) = prefixes.remove(&id).unwrap_or_default();
        let tag = tags.remove(&id).unwrap_or_default();
        book.requests.insert(
            id,
            ResumedRequest::Live {
                id,
                rx,
                prompt_tokens,
                tag,
                output,
                text,
            },
        );
    }
    Ok(())
}

/// The `resume` power event in a running process: live sequences are the truth.
fn resume_in_process<F: ForwardModel>(
    core: &mut EngineCore<F>,
    restored: Option<Restored>,
    finished: &HashMap<u64, FinishedRecord>,
) -> std::result::Result<(), EngineError> {
    let Some(mut r) = restored else {
        return Ok(()); // nothing checkpointed yet: keep serving what is live
    };
    let live: Vec<Sequence> = core.take_sequences();
    let live_len: HashMap<u64, usize> = live.iter().map(|s| (s.id, s.tokens.len())).collect();
    r.snapshot.sequences.retain(|s| {
        !finished.contains_key(&s.request_id)
            && live_len.get(&s.request_id) == Some(&(s.prompt.len() + s.output.len()))
    });
    r.pending.clear();
    let from_snapshot: HashSet<u64> = r.snapshot.sequences.iter().map(|s| s.request_id).collect();
    let senders: HashMap<u64, Sender<Output>> = live.iter().map(|s| (s.id, s.tx.clone())).collect();
    // The live slots stay: an operator may have changed a control (speculative_draft_len) since
    // the snapshot, and the chain head in them is already the newest receipt.
    let live_slots = core.slots().raw();
    restore_core(core, &r, kv_of::<F>, &mut |id| {
        senders
            .get(&id)
            .cloned()
            .unwrap_or_else(|| mpsc::channel().0)
    })
    .map_err(engine_err)?;
    core.slots().load_raw(&live_slots);
    for s in live {
        if from_snapshot.contains(&s.id) {
            continue;
        }
        // Ahead of the snapshot (or not in it): keep its tokens, recompute its KV.
        core.requeue_for_recompute(s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(dir: &Path, model: u8, resume: bool) -> WormConfig {
        WormConfig {
            dir: dir.to_path_buf(),
            key: SigningKey::from_bytes(&[7; 32]),
            spec_digest: [1; 32],
            model_digest: [model; 32],
            anchor: None,
            mode: KvMode::Recompute,
            resume,
            platform: Platform::default(),
        }
    }

    /// An engine over the fake model checkpointing (recompute mode) into `dir`.
    fn engine(dir: &Path, resume: bool) -> (crate::engine::Engine, Arc<Mutex<ResumeBook>>) {
        use crate::engine::codec::ByteCodec;
        use crate::engine::fake::FakeModel;
        use crate::engine::handle::{Durability, Engine, EngineConfig};
        use crate::scheduler::seed::Scheduler;
        let worm = open(config(dir, 2, resume)).unwrap();
        let mut model = FakeModel::new(300, 64, 16);
        model.delay = std::time::Duration::from_millis(2);
        let engine = Engine::start_durable::<Scheduler, _>(
            model,
            Arc::new(ByteCodec),
            EngineConfig {
                num_blocks: 64,
                ..EngineConfig::default()
            },
            Some(Durability {
                hook: Box::new(worm.hook),
                journal: Some(worm.acceptor),
                resume,
            }),
        )
        .unwrap();
        (engine, worm.book)
    }

    #[test]
    fn tags_and_aborts_come_back_on_resume() {
        use crate::engine::{FinishReason, Prompt, Request, SamplingParams};
        let dir = tempfile::tempdir().unwrap();
        let request = |tag: &[u8], max_tokens| Request {
            sampling: SamplingParams::greedy(),
            tag: tag.to_vec(),
            ..Request::new(Prompt::Tokens(vec![5, 6, 7]), max_tokens)
        };
        let (short, long, aborted) = {
            let (engine, _) = engine(dir.path(), false);
            let mut s = engine
                .submit_many(vec![
                    request(b"short", 3),
                    request(b"long", 5_000),
                    request(b"aborted", 5_000),
                ])
                .unwrap();
            let (aborted, long, short) = (s.pop().unwrap(), s.pop().unwrap(), s.pop().unwrap());
            let done = |rx: &Receiver<Output>| loop {
                if let Some(f) = rx.recv().unwrap().finished {
                    break f;
                }
            };
            assert_eq!(done(&short.rx).reason, FinishReason::Length);
            engine.abort(aborted.id).unwrap();
            assert_eq!(done(&aborted.rx).reason, FinishReason::Abort);
            (short.id, long.id, aborted.id)
            // Dropped here, unfinished: as a crash would leave it (nothing checkpointed).
        };
        let (_engine, book) = engine(dir.path(), true);
        let book = book.lock().unwrap();
        let tag_of = |id| match book.requests.get(&id) {
            Some(ResumedRequest::Finished { record, tag }) => (record.reason.clone(), tag.clone()),
            Some(ResumedRequest::Live { tag, id: live, .. }) => {
                assert_eq!(*live, id);
                ("live".into(), tag.clone())
            }
            None => panic!("request {id} lost"),
        };
        assert_eq!(tag_of(short), ("length".into(), b"short".to_vec()));
        assert_eq!(tag_of(aborted), ("abort".into(), b"aborted".to_vec()));
        assert_eq!(tag_of(long), ("live".into(), b"long".to_vec()));
    }

    #[test]
    fn every_finished_request_gets_a_receipt_that_verifies_offline() {
        use crate::checkpoint::attest;
        use crate::engine::{Prompt, Request, SamplingParams};
        let dir = tempfile::tempdir().unwrap();
        let (first, book) = engine(dir.path(), false);
        let subs = first
            .submit_many(
                (3..6)
                    .map(|n| Request {
                        sampling: SamplingParams::greedy(),
                        ..Request::new(Prompt::Tokens(vec![5, 6, n]), n as usize)
                    })
                    .collect(),
            )
            .unwrap();
        let key = SigningKey::from_bytes(&[7; 32]).verifying_key();
        for s in subs {
            let f = loop {
                if let Some(f) = s.rx.recv().unwrap().finished {
                    break f;
                }
            };
            // Signed before the final event was sent.
            let r = book
                .lock()
                .unwrap()
                .receipts
                .remove(&s.id)
                .expect("receipt");
            let v = attest::verify(&r, &key, &f.output_tokens, &f.text).unwrap();
            assert_eq!(v.request_id, s.id);
            let mut edited = f.output_tokens.clone();
            edited.push(1);
            assert!(attest::verify(&r, &key, &edited, &f.text).is_err());
        }
        drop(first);
        // A resume hands the receipts back.
        let (_engine, book) = engine(dir.path(), true);
        assert_eq!(book.lock().unwrap().receipts.len(), 3);
    }

    #[test]
    fn a_run_is_only_continued_by_the_model_that_started_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(open(config(dir.path(), 2, false)).is_ok());
        // No checkpoint exists yet: only the journal's session record can tell.
        let err = open(config(dir.path(), 3, true))
            .err()
            .expect("other model refused");
        assert!(err.to_string().contains("started with model"), "{err}");
        assert!(open(config(dir.path(), 2, true)).is_ok());
    }
}
