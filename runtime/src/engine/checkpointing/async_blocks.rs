//! Asynchronous `Blocks`-mode checkpoints (issue 17 item 3): the checkpoint action only captures
//! the engine's state and starts copying the KV blocks it needs; hashing and writing happen on a
//! writer thread, and the receipt is published in the slots when its payload is durable.
//!
//! Design: on the engine thread, [`AsyncBlocks::checkpoint`] copies every sequence's tokens and
//! sampling state (a [`SequenceSnapshot`] without KV), picks the blocks to read (full blocks not
//! read since they filled, keyed by (request, KV generation, logical block) as the store's
//! [`Checkpointer`] does, plus each running sequence's partial tail block) and hands them to the
//! model's [`KvBlockIo::read_blocks`] in pieces of at most [`STAGE_BYTES`]: on a GPU one gather
//! kernel per piece on the compute stream into device staging memory, so the next decode step may
//! overwrite the blocks at once, and nothing on the engine thread waits for the host. The writer
//! thread copies each piece to pinned memory and waits for it, hashes its blocks (BLAKE3, the
//! store's `block_hash`, on several threads) and appends the new ones to the block store (fsynced,
//! in runs of at most [`APPEND_BYTES`] so the store's lock, which the journal of finished requests
//! also takes, is never held for a whole checkpoint's blocks, and giving way on that lock to the
//! engine threads waiting for it, [`LockQueue`]), then writes the snapshot and its
//! signed receipt ([`crate::checkpoint::CheckpointStore::write_hashed`]): the WORM store's order,
//! payload durable before the manifest and head that name it, is kept, and the on-disk format is
//! unchanged (the same bytes and hashes a synchronous checkpoint writes).
//!
//! The disk sets the pace, never the decoding: [`AsyncBlocks::try_checkpoint`] (the periodic
//! checkpoint) is deferred while the previous checkpoint is not durable yet, and coalesced into
//! the next one, which stages every full block filled since the last staged one (the set of staged
//! keys changes only when a checkpoint is handed over) and the tails of that moment. So at most one
//! checkpoint is in flight, its staged bytes at most the KV cache's, and checkpoints come as often
//! as the disk absorbs them; deferrals are counted ([`AsyncTotals::deferred`]) and logged.
//! [`AsyncBlocks::checkpoint`] always hands its checkpoint over (suspend, low battery, shutdown).
//! The writer handles checkpoints in order; its hash cache follows the engine's set of read blocks
//! exactly.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::core_io::live;
use super::kv_tail::{E4M3_GROUPED, tail_rows};
use crate::checkpoint::digest::block_hash;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo, StagedBlocks};
use crate::checkpoint::snapshot::{FinishState, KvLayout, KvMode, SequenceSnapshot, Snapshot};
use crate::checkpoint::store::ReceiptInfo;
use crate::checkpoint::{CheckpointError, Digest, Result};
use crate::engine::core::EngineCore;
use crate::engine::core_view::CoreParts;
use crate::engine::forward::ForwardModel;
use crate::engine::sequence::Sequence;

/// Most KV bytes one staged read covers (one GPU staging buffer's size). Small, so the pinned
/// buffers the writer copies into are small: allocating pinned memory stalls the device's other
/// work for about 0.46 ms per MB on an H200 (497 ms for 1 GiB; an allocation happens once per
/// process and buffer).
pub const STAGE_BYTES: usize = 64 << 20;

/// Staged pieces that may wait for the writer before the action waits for it. Not the memory
/// bound (that is one checkpoint in flight, and the backend's staging pools): large enough that a
/// checkpoint of a whole KV cache queues without waiting.
pub const PIECES_QUEUED: usize = 4096;

/// Most block bytes one append to the block store writes (and holds the store's lock for).
pub const APPEND_BYTES: usize = 64 << 20;

/// (request id, KV generation, logical block).
type Key = (u64, u32, usize);

/// The engine's side of the checkpoint store's lock: threads that journal requests count
/// themselves while they wait for it, and the writer, which takes it once per run of appended
/// blocks, lets them go first (`std::sync::Mutex` is not fair: a writer re-locking in a loop
/// could keep a finishing request waiting for a whole checkpoint's blocks).
#[derive(Clone, Default)]
pub struct LockQueue(Arc<AtomicUsize>);

impl LockQueue {
    /// Locks `cp` as the engine (ahead of the writer's next run).
    pub fn lock<'a>(
        &self,
        cp: &'a Mutex<Checkpointer>,
    ) -> Result<std::sync::MutexGuard<'a, Checkpointer>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let guard = lock(cp);
        self.0.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// The writer's lock: waits (at most a second) while an engine thread waits for it.
    fn lock_after_engine<'a>(
        &self,
        cp: &'a Mutex<Checkpointer>,
    ) -> Result<std::sync::MutexGuard<'a, Checkpointer>> {
        let t0 = Instant::now();
        while self.0.load(Ordering::SeqCst) > 0 && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_micros(50));
        }
        lock(cp)
    }
}

/// Where the hash of a sequence's full block comes from.
enum BlockRef {
    /// Hashed by an earlier checkpoint.
    Known(Key),
    /// Read by this checkpoint at this staged index.
    Staged(usize, Key),
}

/// One sequence of a checkpoint in flight.
struct SeqJob {
    /// Everything but `blocks`, `tail` and `tail_tokens`.
    snap: SequenceSnapshot,
    full: Vec<BlockRef>,
    /// (staged index, tokens) of the partial tail block.
    tail: Option<(usize, usize)>,
}

/// One staged read: blocks `first .. first + count` of the checkpoint's staged list.
struct Piece {
    first: usize,
    count: usize,
    bytes: Box<dyn StagedBlocks>,
}

/// A checkpoint handed to the writer; its pieces follow it on the same channel, then `End`.
struct Job {
    /// The snapshot without sequences.
    snapshot: Snapshot,
    seqs: Vec<SeqJob>,
    /// Staged blocks in all.
    staged: usize,
    /// Bytes of one whole block.
    block_bytes: usize,
}

/// What the writer receives, in order: a job, its pieces, `End`.
enum Msg {
    Job(Box<Job>),
    Piece(Piece),
    End,
}

/// A checkpoint the writer finished.
#[derive(Debug, Clone)]
pub struct Written {
    /// The committed receipt.
    pub receipt: ReceiptInfo,
    /// KV bytes read for it (whole blocks).
    pub bytes_read: u64,
    /// Bytes it appended to the store (blocks, snapshot, receipt, journal).
    pub bytes_written: u64,
    /// Writer time spent on it (waiting for copies, hashing, writing).
    pub busy: Duration,
}

/// Totals over every checkpoint written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AsyncTotals {
    /// Checkpoints written.
    pub checkpoints: u64,
    /// KV bytes read.
    pub bytes_read: u64,
    /// Bytes appended to the store.
    pub bytes_written: u64,
    /// Writer busy time.
    pub busy: Duration,
    /// Periodic checkpoints deferred because the previous one was not durable yet.
    pub deferred: u64,
}

/// The engine-thread side of asynchronous checkpoints.
pub struct AsyncBlocks {
    cp: Arc<Mutex<Checkpointer>>,
    jobs: Option<SyncSender<Msg>>,
    done: Receiver<Result<Written>>,
    worker: Option<JoinHandle<()>>,
    /// Keys of full blocks staged by a checkpoint (their hashes are, or will be, the writer's).
    known: HashSet<Key>,
    in_flight: usize,
    /// Height the next checkpoint will have.
    next_height: Option<u64>,
    totals: AsyncTotals,
    /// Most KV bytes per staged read ([`STAGE_BYTES`]).
    piece_bytes: usize,
    /// The engine's side of the store's lock.
    queue: LockQueue,
}

fn lock(cp: &Mutex<Checkpointer>) -> Result<std::sync::MutexGuard<'_, Checkpointer>> {
    cp.lock()
        .map_err(|_| CheckpointError::Usage("checkpoint store lock poisoned".into()))
}

fn usage(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Usage(format!("asynchronous checkpoint: {e}"))
}

impl AsyncBlocks {
    /// Starts the writer thread over `cp` (which must be in `Blocks` mode).
    pub fn start(cp: Arc<Mutex<Checkpointer>>) -> Result<Self> {
        Self::start_queued(cp, LockQueue::default())
    }

    /// [`Self::start`], the writer giving way on `cp`'s lock to the engine threads that take it
    /// through `queue`.
    pub fn start_queued(cp: Arc<Mutex<Checkpointer>>, queue: LockQueue) -> Result<Self> {
        let (jobs, rx) = mpsc::sync_channel::<Msg>(PIECES_QUEUED);
        let (done_tx, done) = mpsc::channel();
        let writer_cp = cp.clone();
        let writer_queue = queue.clone();
        let worker = std::thread::Builder::new()
            .name("sov-ckpt-writer".into())
            .spawn(move || writer_loop(&writer_cp, &writer_queue, &rx, &done_tx))
            .map_err(usage)?;
        Ok(Self {
            cp,
            jobs: Some(jobs),
            done,
            worker: Some(worker),
            known: HashSet::new(),
            in_flight: 0,
            next_height: None,
            totals: AsyncTotals::default(),
            piece_bytes: STAGE_BYTES,
            queue,
        })
    }

    /// Reads at most `bytes` of KV per staged read (at least one block) instead of [`STAGE_BYTES`].
    pub fn with_piece_bytes(mut self, bytes: usize) -> Self {
        self.piece_bytes = bytes;
        self
    }

    /// Checkpoints written so far (those still in flight not counted).
    pub fn totals(&self) -> AsyncTotals {
        self.totals
    }

    /// Checkpoints handed to the writer and not yet reported back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The periodic checkpoint action: [`Self::checkpoint`], unless the previous checkpoint is not
    /// durable yet; then it is deferred (None), and the next one stages every block this one would
    /// have. Collects finished checkpoints first (without waiting).
    pub fn try_checkpoint<F: ForwardModel>(
        &mut self,
        core: &mut EngineCore<F>,
        stops: &dyn Fn(&Sequence) -> Vec<String>,
    ) -> Result<Option<u64>> {
        if self.in_flight > 0 {
            self.totals.deferred += 1;
            tracing::debug!(
                "checkpoint deferred at step {}: the previous one is not durable yet ({} deferred so far)",
                core.decode_steps(),
                self.totals.deferred
            );
            return Ok(None);
        }
        self.checkpoint(core, stops).map(Some)
    }

    /// The checkpoint action: captures `core` and starts reading its new KV blocks, then hands it
    /// to the writer. Returns the height the checkpoint will have once written.
    pub fn checkpoint<F: ForwardModel>(
        &mut self,
        core: &mut EngineCore<F>,
        stops: &dyn Fn(&Sequence) -> Vec<String>,
    ) -> Result<u64> {
        let t_action = Instant::now();
        let height = match self.next_height {
            Some(h) => h,
            None => self.queue.lock(&self.cp)?.store().height() + 1,
        };
        let (machine, state) = core.machine_state();
        let CoreParts {
            model,
            running,
            swapped,
            waiting,
            slots,
            decode_steps,
        } = core.parts();
        let io = model.kv_io().ok_or_else(|| {
            CheckpointError::Usage("Blocks mode needs KV access to the model".into())
        })?;
        let layout = io.kv_layout();
        let bs = layout.block_size as usize;
        if bs == 0 {
            return Err(CheckpointError::Usage("KV layout has block_size 0".into()));
        }
        let block_bytes = block_bytes_of(&layout)?;
        let mut staged: Vec<u32> = Vec::new();
        let mut by_physical: HashMap<u32, usize> = HashMap::new();
        let mut stage = |physical: u32| {
            *by_physical.entry(physical).or_insert_with(|| {
                staged.push(physical);
                staged.len() - 1
            })
        };
        let mut live_keys = HashSet::new();
        let mut seqs = Vec::new();
        for s in running {
            let l = live(s, FinishState::Running, stops(s));
            let (full, rest) = (l.kv_tokens / bs, l.kv_tokens % bs);
            if l.block_table.len() < full + usize::from(rest > 0) {
                return Err(CheckpointError::Usage(format!(
                    "request {}: block table shorter than its {} KV tokens",
                    l.request_id, l.kv_tokens
                )));
            }
            let mut refs = Vec::with_capacity(full);
            for (i, &physical) in l.block_table[..full].iter().enumerate() {
                let key = (l.request_id, l.generation, i);
                live_keys.insert(key);
                refs.push(if self.known.contains(&key) {
                    BlockRef::Known(key)
                } else {
                    BlockRef::Staged(stage(physical), key)
                });
            }
            let tail = (rest > 0).then(|| (stage(l.block_table[full]), rest));
            seqs.push(SeqJob {
                snap: bare(&l),
                full: refs,
                tail,
            });
        }
        // Swapped-out sequences are stored as waiting, without KV (as `checkpoint_core` does).
        for s in swapped.into_iter().chain(waiting.iter()) {
            seqs.push(SeqJob {
                snap: bare(&live(s, FinishState::Waiting, stops(s))),
                full: Vec::new(),
                tail: None,
            });
        }
        let snapshot = Snapshot {
            machine: machine.to_string(),
            state: state.to_string(),
            slots: slots.raw(),
            step: decode_steps,
            kv_mode: KvMode::Blocks,
            kv_layout: layout,
            sequences: Vec::new(),
            engine_extra: Vec::new(),
        };
        let job = Job {
            snapshot,
            seqs,
            staged: staged.len(),
            block_bytes,
        };
        let tx = self
            .jobs
            .as_ref()
            .ok_or_else(|| usage("the writer has stopped"))?;
        let stopped = |_| usage("the writer has stopped");
        tx.send(Msg::Job(Box::new(job))).map_err(stopped)?;
        self.in_flight += 1;
        self.next_height = Some(height + 1);
        self.known.retain(|k| live_keys.contains(k));
        self.known.extend(live_keys);
        let t_reads = Instant::now();
        let sent = send_pieces(io, &staged, block_bytes, self.piece_bytes, tx);
        // The job ends even when a read failed (the writer then reports it incomplete).
        tx.send(Msg::End).map_err(stopped)?;
        let (read, queued) = sent?;
        tracing::info!(
            "checkpoint {height}: {} blocks staged ({} MB); action {:.1} ms (capture {:.1}, reads {:.1}, queue waits {:.1})",
            staged.len(),
            staged.len() * block_bytes / 1_000_000,
            t_action.elapsed().as_secs_f64() * 1e3,
            (t_reads - t_action).as_secs_f64() * 1e3,
            read.as_secs_f64() * 1e3,
            queued.as_secs_f64() * 1e3,
        );
        Ok(height)
    }

    /// Collects the checkpoints the writer finished (waiting for all of them when `all`); returns
    /// the newest, or the first error.
    pub fn poll(&mut self, all: bool) -> Result<Option<Written>> {
        let mut newest = None;
        while self.in_flight > 0 {
            let r = if all {
                self.done
                    .recv()
                    .map_err(|_| usage("the writer has stopped"))?
            } else {
                match self.done.try_recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            self.in_flight -= 1;
            let w = match r {
                Ok(w) => w,
                Err(e) => {
                    // Its blocks' hashes are lost: read them again next time.
                    self.known.clear();
                    self.next_height = None;
                    return Err(e);
                }
            };
            self.totals.checkpoints += 1;
            self.totals.bytes_read += w.bytes_read;
            tracing::debug!("checkpoint {} collected", w.receipt.height);
            self.totals.bytes_written += w.bytes_written;
            self.totals.busy += w.busy;
            newest = Some(w);
        }
        Ok(newest)
    }
}

impl Drop for AsyncBlocks {
    /// Lets the writer finish every checkpoint handed to it (a clean shutdown's last checkpoint
    /// is durable when the engine is gone).
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let _ = self.poll(false);
        if self.totals.checkpoints > 0 {
            tracing::info!(
                "asynchronous checkpoints: {} written, {} deferred, {} KV bytes read, {} bytes written, writer busy {:.3} s",
                self.totals.checkpoints,
                self.totals.deferred,
                self.totals.bytes_read,
                self.totals.bytes_written,
                self.totals.busy.as_secs_f64()
            );
        }
    }
}

/// Bytes of one whole block in `layout`: `[layers, 2, block_size, row]`, a row `KVH * D`
/// elements, or for an e4m3 cache (`f8e4m3g16`) the bytes a slot owns: `KVH * D` codes and the
/// heads' padded f32 scales (`sov_kernels::kv_e4m3_row_bytes`).
pub(super) fn block_bytes_of(layout: &KvLayout) -> Result<usize> {
    let (kv_heads, head_dim) = (layout.kv_heads as usize, layout.head_dim as usize);
    let row = match layout.dtype.as_str() {
        "f32" | "u32" | "i32" => 4 * kv_heads * head_dim,
        "f16" | "bf16" => 2 * kv_heads * head_dim,
        E4M3_GROUPED => sov_kernels::kv_e4m3_row_bytes(kv_heads, head_dim),
        other => return Err(usage(format!("KV dtype {other}"))),
    };
    Ok(layout.layers as usize * 2 * layout.block_size as usize * row)
}

/// A live sequence's snapshot without its KV.
fn bare(l: &crate::checkpoint::driver::LiveSequence<'_>) -> SequenceSnapshot {
    let p = l.prompt_len.min(l.tokens.len());
    SequenceSnapshot {
        request_id: l.request_id,
        prompt: l.tokens[..p].to_vec(),
        output: l.tokens[p..].to_vec(),
        sampling: l.sampling.clone(),
        rng_state: l.rng_state.clone(),
        finish: l.finish.clone(),
        blocks: Vec::new(),
        tail: Vec::new(),
        tail_tokens: 0,
    }
}

/// Starts the reads of `staged` in pieces of at most `piece_bytes` and queues them for the
/// writer (waiting while [`PIECES_QUEUED`] pieces are queued).
fn send_pieces(
    io: &mut dyn KvBlockIo,
    staged: &[u32],
    block_bytes: usize,
    piece_bytes: usize,
    tx: &SyncSender<Msg>,
) -> Result<(Duration, Duration)> {
    let per = (piece_bytes / block_bytes.max(1)).max(1);
    let (mut read, mut queued) = (Duration::ZERO, Duration::ZERO);
    for (i, chunk) in staged.chunks(per).enumerate() {
        let t0 = Instant::now();
        let bytes = io.read_blocks(chunk).map_err(usage)?;
        let t1 = Instant::now();
        tx.send(Msg::Piece(Piece {
            first: i * per,
            count: chunk.len(),
            bytes,
        }))
        .map_err(|_| usage("the writer has stopped"))?;
        read += t1 - t0;
        queued += t1.elapsed();
    }
    Ok((read, queued))
}

/// Hashes the blocks at `idx` (offsets into `bytes` in blocks) on up to 8 threads.
fn hash_blocks(bytes: &[u8], block_bytes: usize, idx: &[usize]) -> Vec<Digest> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(idx.len().max(1));
    if threads <= 1 {
        return idx
            .iter()
            .map(|&i| block_hash(&bytes[i * block_bytes..(i + 1) * block_bytes]))
            .collect();
    }
    let per = idx.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = idx
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&i| block_hash(&bytes[i * block_bytes..(i + 1) * block_bytes]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// The writer thread: one job at a time, in order.
fn writer_loop(
    cp: &Mutex<Checkpointer>,
    queue: &LockQueue,
    rx: &Receiver<Msg>,
    done: &Sender<Result<Written>>,
) {
    let mut hashes = HashMap::new();
    while let Ok(msg) = rx.recv() {
        let Msg::Job(job) = msg else {
            continue; // (write_job takes every piece of its job, up to its End)
        };
        let r = write_job(cp, queue, &mut hashes, *job, rx);
        if done.send(r).is_err() {
            break;
        }
    }
}

/// The writer's work for one checkpoint: its pieces arrive on `rx` until `End`.
fn write_job(
    cp: &Mutex<Checkpointer>,
    queue: &LockQueue,
    hashes: &mut HashMap<Key, Digest>,
    job: Job,
    rx: &Receiver<Msg>,
) -> Result<Written> {
    let t_start = Instant::now();
    let Job {
        mut snapshot,
        seqs,
        staged,
        block_bytes,
    } = job;
    let mut is_full = vec![false; staged];
    let mut tail_tokens: HashMap<usize, usize> = HashMap::new();
    for s in &seqs {
        for r in &s.full {
            if let BlockRef::Staged(i, _) = r {
                is_full[*i] = true;
            }
        }
        if let Some((i, t)) = s.tail {
            tail_tokens.insert(i, t);
        }
    }
    let mut staged_hash: Vec<Option<Digest>> = vec![None; staged];
    let mut tails: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut bytes_read = 0u64;
    let mut bytes_written = 0u64;
    let mut seen = 0usize;
    let mut failed = None;
    // Writer phases (copy waits, hashing, store lock waits, block appends with their fsyncs).
    let (mut t_copy, mut t_hash, mut t_lock, mut t_append) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    loop {
        let mut piece = match rx.recv() {
            Ok(Msg::Piece(p)) => p,
            Ok(Msg::End) => break,
            Ok(Msg::Job(_)) | Err(_) => return Err(usage("a checkpoint's pieces were cut short")),
        };
        if failed.is_some() {
            continue; // drop the rest of a failed checkpoint's pieces, up to its End
        }
        let mut take = || -> Result<()> {
            let t0 = Instant::now();
            let bytes = piece.bytes.wait().map_err(usage)?;
            t_copy += t0.elapsed();
            if bytes.len() != piece.count * block_bytes || piece.first + piece.count > staged {
                return Err(usage(format!(
                    "a staged read gave {} bytes for {} blocks of {block_bytes}",
                    bytes.len(),
                    piece.count
                )));
            }
            bytes_read += bytes.len() as u64;
            seen += piece.count;
            let local: Vec<usize> = (0..piece.count)
                .filter(|&j| is_full[piece.first + j])
                .collect();
            let t0 = Instant::now();
            let digests = hash_blocks(bytes, block_bytes, &local);
            t_hash += t0.elapsed();
            for j in 0..piece.count {
                if let Some(&t) = tail_tokens.get(&(piece.first + j)) {
                    let block = &bytes[j * block_bytes..(j + 1) * block_bytes];
                    tails.insert(piece.first + j, tail_rows(&snapshot.kv_layout, block, t));
                }
            }
            for (&j, d) in local.iter().zip(&digests) {
                staged_hash[piece.first + j] = Some(*d);
            }
            // In runs of at most APPEND_BYTES, the store's lock taken for each run only.
            let per_run = (APPEND_BYTES / block_bytes.max(1)).max(1);
            for run in local.chunks(per_run).zip(digests.chunks(per_run)) {
                let t0 = Instant::now();
                let mut guard = queue.lock_after_engine(cp)?;
                let t1 = Instant::now();
                t_lock += t1 - t0;
                let new: Vec<(Digest, &[u8])> = run
                    .0
                    .iter()
                    .zip(run.1)
                    .filter(|(_, d)| !guard.store().contains_block(d))
                    .map(|(&j, d)| (*d, &bytes[j * block_bytes..(j + 1) * block_bytes]))
                    .collect();
                bytes_written += guard.store_mut().append_blocks(&new)?.1;
                t_append += t1.elapsed();
            }
            Ok(())
        };
        if let Err(e) = take() {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if seen != staged {
        return Err(usage(format!("{seen} of {staged} staged blocks arrived")));
    }
    let mut live_keys = HashSet::new();
    for s in seqs {
        let mut snap = s.snap;
        for r in s.full {
            let (key, hash) = match r {
                BlockRef::Known(k) => (k, hashes.get(&k).copied()),
                BlockRef::Staged(i, k) => (k, staged_hash[i]),
            };
            let hash = hash
                .ok_or_else(|| usage(format!("request {}: block {} has no hash", key.0, key.2)))?;
            hashes.insert(key, hash);
            live_keys.insert(key);
            snap.blocks.push(hash);
        }
        if let Some((i, t)) = s.tail {
            snap.tail = tails.remove(&i).unwrap_or_default();
            snap.tail_tokens = t as u32;
        }
        snapshot.sequences.push(snap);
    }
    hashes.retain(|k, _| live_keys.contains(k));
    let t0 = Instant::now();
    let receipt = queue
        .lock_after_engine(cp)?
        .store_mut()
        .write_hashed(&snapshot, &[])?;
    bytes_written += receipt.bytes_written;
    tracing::info!(
        "checkpoint {} durable: {} MB read, {} MB written in {:.1} ms (copy waits {:.1}, hashing {:.1}, store lock waits {:.1}, block appends {:.1}, snapshot + receipt {:.1})",
        receipt.height,
        bytes_read / 1_000_000,
        bytes_written / 1_000_000,
        t_start.elapsed().as_secs_f64() * 1e3,
        t_copy.as_secs_f64() * 1e3,
        t_hash.as_secs_f64() * 1e3,
        t_lock.as_secs_f64() * 1e3,
        t_append.as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64() * 1e3,
    );
    Ok(Written {
        receipt,
        bytes_read,
        bytes_written,
        busy: t_start.elapsed(),
    })
}
