//! [`Engine`]: the thread that owns the model and runs the generated scheduler, and the handle
//! callers use to submit requests and read the control surface.
//!
//! Design: one engine thread, channels in and out (the data path in `engine/mod.rs`). The thread loops:
//! take new requests from the channel, publish the runtime slots, `machine.step()`. When a step
//! does nothing (`Transition::is_noop`: idle, or suspended) it blocks on the channel for a short
//! while, so it also notices slot writes (power_state, speculative_draft_len) from outside.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::codec::TextCodec;
use super::constraint::GrammarSupport;
use super::core::{CoreConfig, EngineCore};
use super::error::EngineError;
use super::forward::ForwardModel;
use super::hook::{CheckpointHook, RequestJournal};
use super::host_times::DecodeHostTimes;
use super::intake::{IntakeLimits, bind_grammar, build_sequence};
use super::kv_policy::{KvCounters, KvPolicy};
use super::output::Output;
use super::prefix_cache::CacheSalt;
use super::request::Request;
use super::sequence::Sequence;
use crate::scheduler::{Cause, Machine, PowerState, Slots};

/// How long an idle engine waits for a request before looking at the slots again.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// Engine settings that do not come from the machine spec.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// KV blocks the model's cache was built with.
    pub num_blocks: usize,
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most prompt tokens per prefill forward pass (with `mixed_prefill`: per mixed step).
    pub max_prefill_tokens: usize,
    /// Run prompts in chunks inside decode steps (the machine's `mix_prefill` predicate) rather
    /// than in prefill passes that stall the running streams.
    pub mixed_prefill: bool,
    /// Run each decode step's host work (text, stop strings, events) while the next forward pass
    /// computes ([`super::overlap`]): pays where the pass runs on an accelerator; on the host's
    /// own cores it only delays retirement by a step.
    pub overlap_host: bool,
    /// With `overlap_host`, launch each decode step's successor before its tokens come back,
    /// where the model can ([`super::ahead`]): the GPU no longer waits for the host between
    /// decode steps.
    pub decode_ahead: bool,
    /// Launch each prefill pass before the one before it is waited for, where the model can
    /// ([`super::prefill_ahead`]): the GPU no longer waits for the host between prefill passes.
    pub prefill_ahead: bool,
    /// The model's context length (`max_position_embeddings`).
    pub context_len: usize,
    /// End-of-sequence token ids.
    pub eos_ids: Vec<u32>,
    /// Record every transition (see [`Engine::trace`]).
    pub trace: bool,
    /// The live control surface the engine publishes to and obeys, e.g. mapped from a slot file
    /// by the application so another process can steer it (None: fresh slots in heap memory).
    pub slots: Option<Slots>,
    /// Structured output ([`super::Request::grammar`]): the model's vocabulary as a grammar
    /// matcher needs it (None: requests with a grammar are refused).
    pub grammar: Option<Arc<GrammarSupport>>,
    /// Set (by a signal handler) to stop serving: the engine raises `power_state = suspend`, runs
    /// one more step (the machine's suspend interrupt checkpoints) and exits its loop.
    pub shutdown: Option<Arc<AtomicBool>>,
    /// Prefix caching and the host swap pool (the engine adds the machine and block size to the
    /// cache salt).
    pub kv: KvPolicy,
}

/// The checkpoint side of an engine (see [`super::hook`]).
pub struct Durability<F: ForwardModel> {
    /// Runs the `checkpoint` and `restore` actions and journals finished requests.
    pub hook: Box<dyn CheckpointHook<EngineCore<F>>>,
    /// Journals accepted requests in `submit`.
    pub journal: Option<Arc<dyn RequestJournal>>,
    /// Restore before serving: the machine starts in its `resume` state and runs its first step
    /// (the spec's restore) before [`Engine::start_durable`] returns.
    pub resume: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_blocks: 1024,
            max_batch: 256,
            max_prefill_tokens: 2048,
            mixed_prefill: true,
            overlap_host: false,
            decode_ahead: false,
            prefill_ahead: false,
            context_len: 2048,
            eos_ids: Vec::new(),
            trace: false,
            slots: None,
            grammar: None,
            shutdown: None,
            kv: KvPolicy::default(),
        }
    }
}

/// One recorded scheduler step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// Index of the step since the engine started.
    pub step: u64,
    /// State name before the step.
    pub from: &'static str,
    /// State name after the step.
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

/// Statistics the engine thread returns when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Machine steps taken (including ones that did nothing).
    pub steps: u64,
    /// Decode steps (forward passes generating one token per running sequence, or a verify pass).
    pub decode_steps: u64,
    /// Checkpoint actions run.
    pub checkpoints: u64,
    /// Restore actions run.
    pub restores: u64,
    /// Wall time spent writing checkpoints (part of `busy_time`).
    pub checkpoint_time: Duration,
    /// Speculative draft tokens proposed for verification.
    pub spec_proposed: u64,
    /// Of `spec_proposed`, the draft tokens the model accepted.
    pub spec_accepted: u64,
    /// Wall time inside model forward passes, and in the whole loop (steps, idle waits excluded).
    pub forward_time: Duration,
    /// Wall time of the steps that did something (idle waits excluded).
    pub busy_time: Duration,
    /// Host time of decode steps outside the forward pass, by phase (part of `busy_time`).
    pub decode_host: DecodeHostTimes,
    /// Prefill passes launched before the pass ahead of them came back
    /// ([`EngineConfig::prefill_ahead`]).
    pub prefill_passes_ahead: u64,
    /// Prompt tokens of the requests queued so far.
    pub prompt_tokens: u64,
    /// Tokens generated and delivered so far.
    pub generation_tokens: u64,
    /// Preemptions so far: sequences that left the batch for lack of KV blocks (swapped out or
    /// dropped for recomputation; [`EngineStats::kv`] says which).
    pub preemptions: u64,
    /// Swaps, recomputations and prefix-cache hits so far.
    pub kv: KvCounters,
}

/// What the handle sends the engine thread.
enum Inbound {
    /// Accepted requests (already journaled), queued together between two steps, so requests
    /// submitted in one call start in the same step whatever the engine thread is doing.
    Admit(Vec<Sequence>),
    /// End this request now ([`Engine::abort`]).
    Abort(u64),
}

/// An accepted request: the id the engine gave it and its output stream (the last event has
/// `finished` set).
#[derive(Debug)]
pub struct Submitted {
    /// The request's id (unique within the run; journaled).
    pub id: u64,
    /// The request's output events.
    pub rx: Receiver<Output>,
}

/// A running engine.
pub struct Engine {
    tx: Option<Sender<Inbound>>,
    codec: Arc<dyn TextCodec>,
    limits: IntakeLimits,
    next_id: AtomicU64,
    slots: Slots,
    trace: Arc<Mutex<Vec<TraceEntry>>>,
    abort: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
    journal: Option<Arc<dyn RequestJournal>>,
    grammar: Option<Arc<GrammarSupport>>,
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
        hook: Option<Box<dyn CheckpointHook<EngineCore<F>>>>,
    ) -> Result<Self, EngineError> {
        let durability = hook.map(|hook| Durability {
            hook,
            journal: None,
            resume: false,
        });
        Self::start_durable::<M, F>(model, codec, config, durability)
    }

    /// Starts an engine with checkpoints, a request journal and optionally a resume from disk.
    /// With `resume`, the restore runs here (errors are returned) before the thread starts.
    pub fn start_durable<M: Machine + 'static, F: ForwardModel + 'static>(
        model: F,
        codec: Arc<dyn TextCodec>,
        config: EngineConfig,
        durability: Option<Durability<F>>,
    ) -> Result<Self, EngineError> {
        let constant =
            |name: &str, default: i64| M::constant(name).unwrap_or(default).max(1) as usize;
        let block_size = constant("block_size", 16);
        let max_tokens_cap = constant("max_tokens", i64::from(u32::MAX));
        let context_len = config.context_len.min(config.num_blocks * block_size);
        let slots = config.slots.clone().unwrap_or_default();
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
            kv: KvPolicy {
                salt: CacheSalt::of(&[
                    &config.kv.salt.0,
                    M::NAME.as_bytes(),
                    &(block_size as u64).to_le_bytes(),
                ]),
                ..config.kv.clone()
            },
        };
        let (tx, rx) = mpsc::channel::<Inbound>();
        let trace = Arc::new(Mutex::new(Vec::new()));
        let mut core = EngineCore::new(model, codec.clone(), core_cfg, slots.clone());
        core.set_grammar(config.grammar.clone());
        core.set_mix_prefill(config.mixed_prefill);
        core.set_overlap_host(config.overlap_host);
        core.set_decode_ahead(config.decode_ahead);
        core.set_prefill_ahead(config.prefill_ahead);
        core.deliver_on_own_thread();
        let mut machine = M::new();
        let mut journal = None;
        if let Some(d) = durability {
            core.set_checkpoint_hook(d.hook);
            journal = d.journal;
            if d.resume {
                resume_first::<M, F>(&mut machine, &mut core, &slots)?;
            }
        }
        let next_id = journal.as_ref().map_or(1, |j| j.next_id());
        let interrupted = Arc::new(AtomicBool::new(false));
        let thread_interrupted = interrupted.clone();
        let shutdown = config.shutdown.clone();
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
                    machine,
                    core,
                    rx,
                    thread_slots,
                    thread_trace,
                    Stop {
                        abort: thread_abort,
                        shutdown,
                        interrupted: thread_interrupted,
                    },
                    thread_stats,
                )
            })
            .map_err(|e| EngineError::Scheduler(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            tx: Some(tx),
            codec,
            limits,
            next_id: AtomicU64::new(next_id),
            slots,
            trace,
            abort,
            interrupted,
            journal,
            grammar: config.grammar.clone(),
            stats,
            thread: Some(thread),
        })
    }

    /// Validates, journals and queues `request`; its outputs arrive on the returned stream. A bad
    /// request is refused here and disturbs nothing else.
    pub fn submit(&self, request: Request) -> Result<Submitted, EngineError> {
        let mut all = self.submit_many(vec![request])?;
        all.pop().ok_or(EngineError::EngineStopped)
    }

    /// Submits several requests together: all are validated first (one bad request refuses them
    /// all), journaled with one durable write, then handed to the engine thread in one message,
    /// so they enter its queue together, between two steps.
    pub fn submit_many(&self, requests: Vec<Request>) -> Result<Vec<Submitted>, EngineError> {
        let mut seqs = Vec::with_capacity(requests.len());
        let mut submitted = Vec::with_capacity(requests.len());
        for mut request in requests {
            let (out_tx, rx) = mpsc::channel();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let grammar = request.grammar.take();
            let mut seq = build_sequence(id, request, self.codec.as_ref(), &self.limits, out_tx)?;
            if let Some(g) = grammar {
                bind_grammar(&mut seq, g, self.grammar.as_deref())?;
            }
            seqs.push(seq);
            submitted.push(Submitted { id, rx });
        }
        let tx = self.tx.as_ref().ok_or(EngineError::EngineStopped)?;
        if let Some(journal) = &self.journal {
            journal.accept_all(&seqs)?;
        }
        tx.send(Inbound::Admit(seqs))
            .map_err(|_| EngineError::EngineStopped)?;
        Ok(submitted)
    }

    /// Ends request `id` at the engine's next step: it finishes with [`FinishReason::Abort`]
    /// (journaled as delivered, reason `abort`), its KV blocks are freed and its stream gets the
    /// final event. Unknown and already finished ids are ignored.
    ///
    /// [`FinishReason::Abort`]: super::FinishReason::Abort
    pub fn abort(&self, id: u64) -> Result<(), EngineError> {
        let tx = self.tx.as_ref().ok_or(EngineError::EngineStopped)?;
        tx.send(Inbound::Abort(id))
            .map_err(|_| EngineError::EngineStopped)
    }

    /// Whether the engine stopped because `shutdown` was raised (after its last checkpoint).
    pub fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// The live control surface.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Limits requests are checked against.
    pub fn limits(&self) -> IntakeLimits {
        self.limits
    }

    /// The tokenizer requests are encoded with and outputs decoded with.
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

/// Puts `machine` in its `resume` state and runs one step there (the spec's restore), so a resume
/// that fails is reported to the caller of `start`.
fn resume_first<M: Machine, F: ForwardModel>(
    machine: &mut M,
    core: &mut EngineCore<F>,
    slots: &Slots,
) -> Result<(), EngineError> {
    machine.set_state_by_name("resume").map_err(|_| {
        EngineError::Scheduler(format!(
            "machine `{}` has no `resume` state, so it cannot resume from a checkpoint",
            M::NAME
        ))
    })?;
    core.publish();
    core.set_machine_state(M::NAME, machine.state_name());
    let restores = core.checkpoint_counts().1;
    machine.step(core, slots)?;
    if core.checkpoint_counts().1 == restores {
        return Err(EngineError::Scheduler(format!(
            "machine `{}`: the `resume` state did not run `restore`",
            M::NAME
        )));
    }
    Ok(())
}

/// Applies one message from the handle to the core (between steps).
fn take<F: ForwardModel>(core: &mut EngineCore<F>, msg: Inbound) {
    match msg {
        Inbound::Admit(seqs) => seqs.into_iter().for_each(|seq| core.enqueue(seq)),
        Inbound::Abort(id) => core.abort(id),
    }
}

/// How the engine loop is told to stop, and how it says it stopped on request.
struct Stop {
    /// Drop of the handle: leave at once.
    abort: Arc<AtomicBool>,
    /// Checkpoint (through the machine's suspend interrupt), then leave.
    shutdown: Option<Arc<AtomicBool>>,
    /// Set when the loop left because of `shutdown`.
    interrupted: Arc<AtomicBool>,
}

fn run_loop<M: Machine, F: ForwardModel>(
    mut machine: M,
    mut core: EngineCore<F>,
    rx: Receiver<Inbound>,
    slots: Slots,
    trace: Option<Arc<Mutex<Vec<TraceEntry>>>>,
    stop: Stop,
    live: Arc<Mutex<EngineStats>>,
) -> Result<EngineStats, EngineError> {
    let mut stats = EngineStats::default();
    let mut wait = true;
    let mut open = true;
    let mut stopping = false;
    while !stop.abort.load(Ordering::Relaxed) {
        if !stopping
            && stop
                .shutdown
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
        {
            // The machine's suspend interrupt checkpoints on the next step; then the loop leaves.
            stopping = true;
            slots.set_power_state(PowerState::Suspend);
            wait = false;
        }
        if wait {
            if open {
                match rx.recv_timeout(IDLE_POLL) {
                    Ok(msg) => take(&mut core, msg),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else {
                std::thread::sleep(IDLE_POLL);
            }
        }
        while open {
            match rx.try_recv() {
                Ok(msg) => take(&mut core, msg),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && core.is_idle() && !stopping {
            break;
        }
        core.publish();
        let from = machine.state_name();
        core.set_machine_state(M::NAME, from);
        let t_step = Instant::now();
        match machine.step(&mut core, &slots) {
            Ok(t) => {
                // An engine with nothing to do, or one that took a power event (suspend, resume,
                // low battery), has delivered everything.
                if t.is_noop() || matches!(t.cause, Cause::Interrupt(_)) {
                    core.flush_pending();
                    core.outbox.settle();
                }
                stats.steps += 1;
                wait = t.is_noop();
                if !wait {
                    stats.busy_time += t_step.elapsed();
                    stats.forward_time = core.forward_time();
                    stats.decode_steps = core.decode_steps();
                    stats.decode_host = core.decode_host_times();
                    stats.prefill_passes_ahead = core.prefill_passes_ahead();
                    (stats.checkpoints, stats.restores) = core.checkpoint_counts();
                    stats.checkpoint_time = core.checkpoint_time();
                    (stats.spec_proposed, stats.spec_accepted) = core.speculation_counts();
                    let totals = core.totals();
                    stats.prompt_tokens = totals.prompt_tokens;
                    stats.generation_tokens = totals.generation_tokens;
                    stats.preemptions = totals.preemptions;
                    stats.kv = core.kv_counters();
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
        if stopping {
            stop.interrupted.store(true, Ordering::Relaxed);
            break;
        }
    }
    core.flush_pending();
    core.publish();
    let (checkpoints, restores) = core.checkpoint_counts();
    let (spec_proposed, spec_accepted) = core.speculation_counts();
    let totals = core.totals();
    Ok(EngineStats {
        prompt_tokens: totals.prompt_tokens,
        generation_tokens: totals.generation_tokens,
        preemptions: totals.preemptions,
        kv: core.kv_counters(),
        decode_steps: core.decode_steps(),
        checkpoints,
        restores,
        checkpoint_time: core.checkpoint_time(),
        spec_proposed,
        spec_accepted,
        forward_time: core.forward_time(),
        decode_host: core.decode_host_times(),
        prefill_passes_ahead: core.prefill_passes_ahead(),
        ..stats
    })
}
