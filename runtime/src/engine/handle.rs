//! [`Engine`]: the thread that owns the model and runs the generated scheduler, and the handle
//! callers use to submit requests and read the control surface.
//!
//! Design: one engine thread, channels in and out (design.md's data path). The thread loops:
//! take new requests from the channel, publish the runtime slots, `machine.step()`. When a step
//! does nothing (`Transition::is_noop`: idle, or suspended) it blocks on the channel for a short
//! while, so it also notices slot writes (power_state, speculative_draft_len) from outside.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::codec::TextCodec;
use super::core::{CoreConfig, EngineCore};
use super::error::EngineError;
use super::forward::ForwardModel;
use super::hook::CheckpointHook;
use super::intake::{IntakeLimits, build_sequence};
use super::output::Output;
use super::request::Request;
use super::sequence::Sequence;
use super::slot_file::SlotFile;
use crate::scheduler::{Cause, Machine, SlotMemory, Slots};

/// How long an idle engine waits for a request before looking at the slots again.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// Engine settings that do not come from the machine spec.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV blocks the model's cache was built with.
    pub num_blocks: usize,
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most prompt tokens per prefill forward pass.
    pub max_prefill_tokens: usize,
    /// The model's context length (`max_position_embeddings`).
    pub context_len: usize,
    /// End-of-sequence token ids.
    pub eos_ids: Vec<u32>,
    /// Record every transition (see [`Engine::trace`]).
    pub trace: bool,
    /// Map the slots from `<dir>/slots` (the live control surface) instead of heap memory.
    pub run_dir: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_blocks: 1024,
            max_batch: 256,
            max_prefill_tokens: 2048,
            context_len: 2048,
            eos_ids: Vec::new(),
            trace: false,
            run_dir: None,
        }
    }
}

/// One recorded scheduler step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// Index of the step since the engine started.
    pub step: u64,
    pub from: &'static str,
    pub to: &'static str,
    /// `interrupt:NAME`, `rule:N` or `stay`.
    pub cause: String,
    /// Actions the machine ran, in order.
    pub actions: Vec<&'static str>,
    /// Slot updates the machine applied, as written in the spec.
    pub updates: Vec<&'static str>,
    /// Runtime notes (fallbacks, substitutions), e.g. `swap_out = preempt by recomputation`.
    pub notes: Vec<&'static str>,
}

struct SlotFileMemory(SlotFile);

impl SlotMemory for SlotFileMemory {
    fn cells(&self) -> &[std::sync::atomic::AtomicU32; 32] {
        self.0.cells()
    }
}

/// Opens the slots of a running engine from its slot file.
pub fn open_slots(path: &Path) -> Result<Slots, EngineError> {
    Ok(Slots::from_memory(Arc::new(SlotFileMemory(
        SlotFile::open(path)?,
    ))))
}

/// Statistics the engine thread returns when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    pub decode_steps: u64,
    pub checkpoints: u64,
    pub restores: u64,
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Wall time inside model forward passes, and in the whole loop (steps, idle waits excluded).
    pub forward_time: Duration,
    pub busy_time: Duration,
}

/// A running engine.
pub struct Engine {
    tx: Option<Sender<Sequence>>,
    codec: Arc<dyn TextCodec>,
    limits: IntakeLimits,
    next_id: AtomicU64,
    slots: Slots,
    slot_path: Option<PathBuf>,
    trace: Arc<Mutex<Vec<TraceEntry>>>,
    abort: Arc<AtomicBool>,
    stats: Arc<Mutex<EngineStats>>,
    thread: Option<JoinHandle<Result<EngineStats, EngineError>>>,
}

impl Engine {
    /// Starts the engine thread running machine `M` over `model`. The block size and the
    /// max_tokens cap come from the machine's constants.
    pub fn start<M: Machine + 'static, F: ForwardModel + 'static>(
        model: F,
        codec: Arc<dyn TextCodec>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_with_hook::<M, F>(model, codec, config, None)
    }

    /// As [`Engine::start`], with the work behind the checkpoint and restore actions.
    pub fn start_with_hook<M: Machine + 'static, F: ForwardModel + 'static>(
        model: F,
        codec: Arc<dyn TextCodec>,
        config: EngineConfig,
        hook: Option<Box<dyn CheckpointHook<F>>>,
    ) -> Result<Self, EngineError> {
        let constant =
            |name: &str, default: i64| M::constant(name).unwrap_or(default).max(1) as usize;
        let block_size = constant("block_size", 16);
        let max_tokens_cap = constant("max_tokens", i64::from(u32::MAX));
        let context_len = config.context_len.min(config.num_blocks * block_size);
        let (slots, slot_path) = match &config.run_dir {
            Some(dir) => {
                let path = super::run_dir::slot_path(dir);
                let file = SlotFile::create(&path)?;
                (
                    Slots::from_memory(Arc::new(SlotFileMemory(file))),
                    Some(path),
                )
            }
            None => (Slots::new(), None),
        };
        let limits = IntakeLimits {
            context_len,
            vocab_size: model.vocab_size(),
            num_blocks: config.num_blocks,
            block_size,
            max_tokens_cap,
        };
        let core_cfg = CoreConfig {
            num_blocks: config.num_blocks,
            block_size,
            max_batch: config.max_batch.max(1),
            max_prefill_tokens: config.max_prefill_tokens.max(1),
            context_len,
            max_tokens_cap,
            eos_ids: config.eos_ids.clone(),
        };
        let (tx, rx) = mpsc::channel::<Sequence>();
        let trace = Arc::new(Mutex::new(Vec::new()));
        let mut core = EngineCore::new(model, codec.clone(), core_cfg, slots.clone());
        if let Some(hook) = hook {
            core.set_checkpoint_hook(hook);
        }
        let thread_trace = config.trace.then(|| trace.clone());
        let thread_slots = slots.clone();
        let abort = Arc::new(AtomicBool::new(false));
        let thread_abort = abort.clone();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("sov-engine".into())
            .spawn(move || {
                run_loop::<M, F>(
                    core,
                    rx,
                    thread_slots,
                    thread_trace,
                    thread_abort,
                    thread_stats,
                )
            })
            .map_err(|e| EngineError::Scheduler(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            tx: Some(tx),
            codec,
            limits,
            next_id: AtomicU64::new(1),
            slots,
            slot_path,
            trace,
            abort,
            stats,
            thread: Some(thread),
        })
    }

    /// Validates and queues `request`; its outputs arrive on the returned channel, the last one
    /// with `finished` set. A bad request is refused here and disturbs nothing else.
    pub fn submit(&self, request: Request) -> Result<Receiver<Output>, EngineError> {
        let (out_tx, out_rx) = mpsc::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seq = build_sequence(id, request, self.codec.as_ref(), &self.limits, out_tx)?;
        let tx = self.tx.as_ref().ok_or(EngineError::EngineStopped)?;
        tx.send(seq).map_err(|_| EngineError::EngineStopped)?;
        Ok(out_rx)
    }

    /// The live control surface.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// The slot file, when the engine runs with a run directory.
    pub fn slot_path(&self) -> Option<&Path> {
        self.slot_path.as_deref()
    }

    /// Limits requests are checked against.
    pub fn limits(&self) -> IntakeLimits {
        self.limits
    }

    pub fn codec(&self) -> &Arc<dyn TextCodec> {
        &self.codec
    }

    /// Counters of the engine thread, as of its latest step.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// The transitions recorded so far (empty unless [`EngineConfig::trace`]).
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.trace.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Stops accepting requests, lets running ones finish, joins the thread.
    pub fn shutdown(mut self) -> Result<EngineStats, EngineError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<EngineStats, EngineError> {
        self.tx.take();
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| EngineError::Scheduler("the engine thread panicked".into()))?,
            None => Ok(EngineStats::default()),
        }
    }
}

impl Drop for Engine {
    /// Dropping without [`Engine::shutdown`] stops the thread at its next step; unfinished
    /// requests end (their channels close).
    fn drop(&mut self) {
        self.abort.store(true, Ordering::Relaxed);
        let _ = self.stop();
    }
}

fn run_loop<M: Machine, F: ForwardModel>(
    mut core: EngineCore<F>,
    rx: Receiver<Sequence>,
    slots: Slots,
    trace: Option<Arc<Mutex<Vec<TraceEntry>>>>,
    abort: Arc<AtomicBool>,
    live: Arc<Mutex<EngineStats>>,
) -> Result<EngineStats, EngineError> {
    let mut machine = M::new();
    let mut stats = EngineStats::default();
    let mut wait = true;
    let mut open = true;
    while !abort.load(Ordering::Relaxed) {
        if wait {
            if open {
                match rx.recv_timeout(IDLE_POLL) {
                    Ok(seq) => core.enqueue(seq),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else {
                std::thread::sleep(IDLE_POLL);
            }
        }
        while open {
            match rx.try_recv() {
                Ok(seq) => core.enqueue(seq),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && core.is_idle() {
            break;
        }
        core.publish();
        let from = machine.state_name();
        core.set_machine_state(M::NAME, from);
        let t_step = Instant::now();
        match machine.step(&mut core, &slots) {
            Ok(t) => {
                stats.steps += 1;
                wait = t.is_noop();
                if !wait {
                    stats.busy_time += t_step.elapsed();
                    stats.forward_time = core.forward_time();
                    stats.decode_steps = core.decode_steps();
                    (stats.checkpoints, stats.restores) = core.checkpoint_counts();
                    (stats.spec_proposed, stats.spec_accepted) = core.speculation_counts();
                    if let Ok(mut shared) = live.lock() {
                        *shared = stats;
                    }
                }
                if let Some(trace) = &trace
                    && !t.is_noop()
                {
                    let entry = TraceEntry {
                        step: stats.steps,
                        from,
                        to: machine.state_name(),
                        cause: match t.cause {
                            Cause::Interrupt(name) => format!("interrupt:{name}"),
                            Cause::Rule(i) => format!("rule:{i}"),
                            Cause::Stay => "stay".into(),
                        },
                        actions: t.actions.iter().map(|a| a.name()).collect(),
                        updates: t.updates.clone(),
                        notes: core.take_notes(),
                    };
                    if let Ok(mut v) = trace.lock() {
                        v.push(entry);
                    }
                }
            }
            Err(e) => {
                // An action failed as a whole (not one request): log it, back off, keep serving.
                tracing::error!("scheduler step failed in state {from}: {e}");
                wait = true;
            }
        }
    }
    core.publish();
    let (checkpoints, restores) = core.checkpoint_counts();
    let (spec_proposed, spec_accepted) = core.speculation_counts();
    Ok(EngineStats {
        decode_steps: core.decode_steps(),
        checkpoints,
        restores,
        spec_proposed,
        spec_accepted,
        forward_time: core.forward_time(),
        ..stats
    })
}
