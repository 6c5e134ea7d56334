//! The engine's state and the work behind every scheduler action and predicate: waiting queue,
//! running batch, block manager, model, sampler, output streams.
//!
//! The actions that run a step (admit, prefill, decode) are in [`super::step`], those that take
//! sequences out of the batch (preempt, retire, abort) in [`super::retire`].
//!
//! Design: plain host data driven from outside. The generated scheduler decides which action runs
//! next (see [`super::bind`], which implements the generated `Actions` and `Guards` traits by
//! calling the methods here); nothing in this file decides *when* something happens. Every method
//! that allocates checks before it commits, and every finished sequence frees its blocks in the
//! step that finished it.

use std::collections::VecDeque;
use std::sync::Arc;

use super::blocks::BlockManager;
use super::codec::TextCodec;
use super::constraint::GrammarSupport;
pub use super::core_config::CoreConfig;
use super::forward::ForwardModel;
use super::hook::CheckpointHook;
use super::host_times::DecodeHostTimes;
use super::kv_policy::KvCounters;
use super::outbox::Outbox;
use super::sequence::Sequence;
use super::swap::SwapPool;
use crate::scheduler::Slots;

/// How a forward pass answers ([`EngineCore::forward_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// [`ForwardModel::forward_pick`]: the model may choose argmax tokens where the logits are.
    Pick,
    /// [`ForwardModel::forward`], every row's logits to the host (speculative verification, whose
    /// chunks of one sequence must each see the KV of the chunks before them).
    Logits,
}

/// Counters the runtime publishes in its slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Requests waiting in the queue, not yet admitted (slot `pending_request_count`).
    pub pending_request_count: u32,
    /// Sequences in the running batch (slot `batch_size`).
    pub batch_size: u32,
    /// KV cache blocks currently allocated (slot `kv_blocks_used`).
    pub kv_blocks_used: u32,
    /// Id of the newest sequence admitted, truncated to 32 bits (slot `current_seq_id`).
    pub current_seq_id: u32,
}

/// The engine state the scheduler's actions operate on.
pub struct EngineCore<F: ForwardModel> {
    pub(crate) cfg: CoreConfig,
    pub(crate) model: F,
    pub(crate) codec: Arc<dyn TextCodec>,
    pub(crate) blocks: BlockManager,
    pub(crate) waiting: VecDeque<Sequence>,
    /// Admission order: the newest sequence is last.
    pub(crate) running: Vec<Sequence>,
    pub(crate) newest_seq_id: u64,
    /// Decode (or verify) forward passes run so far.
    pub(crate) decode_steps: u64,
    /// Notes for the trace beyond the machine's own action list (fallbacks, substitutions),
    /// since the last [`EngineCore::take_notes`].
    pub(crate) notes: Vec<&'static str>,
    /// The live control surface (shared with the engine handle and the slot file).
    pub(crate) slots: Slots,
    /// Checkpoint and restore actions run (no-ops until the checkpoint store is bound).
    pub(crate) checkpoints: u64,
    pub(crate) restores: u64,
    /// Wall time spent inside the checkpoint action.
    pub(crate) checkpoint_time: std::time::Duration,
    /// Speculative decoding: tokens proposed and accepted so far.
    pub(crate) spec_proposed: u64,
    pub(crate) spec_accepted: u64,
    /// Wall time spent inside the model's forward passes.
    pub(crate) forward_time: std::time::Duration,
    /// Host time of decode steps outside the forward pass, by phase.
    pub(crate) decode_host: DecodeHostTimes,
    /// The machine driving this core and its state at the current step (set by the engine loop).
    pub(crate) machine_name: &'static str,
    pub(crate) machine_state: &'static str,
    /// Work behind the checkpoint and restore actions, when installed.
    pub(crate) checkpoint_hook: Option<Box<dyn CheckpointHook<Self>>>,
    /// Output events on their way to the request streams.
    pub(crate) outbox: Outbox,
    /// Totals since start: prompt tokens queued, tokens generated, preemptions.
    pub(crate) totals: TokenTotals,
    /// Structured output, to rebuild restored requests' matchers (None: no grammar support).
    pub(crate) grammar: Option<Arc<GrammarSupport>>,
    /// Sequences swapped out to host memory, oldest first.
    pub(crate) swap: SwapPool,
    /// What the prefix cache, swapping and recomputation did so far.
    pub(crate) kv_counts: KvCounters,
    /// Prompts run inside decode steps (see [`super::mixed`]), else in prefill passes.
    pub(crate) mix_prefill: bool,
    /// Decode steps overlap their host work with the next forward pass (see [`super::overlap`]).
    pub(crate) overlap_host: bool,
    /// The text and events of the last overlapped decode step, not yet made.
    pub(crate) pending: Option<super::pending::PendingStep>,
    /// Overlapped decode steps launch the next step before their tokens come back, where the
    /// model can (see [`super::ahead`]).
    pub(crate) decode_ahead: bool,
    /// The decode step launched ahead and still in flight.
    pub(crate) ahead: Option<super::pending::AheadStep>,
    /// Prefill passes launch the next pass before their tokens come back, where the model can
    /// (see [`super::prefill_ahead`]).
    pub(crate) prefill_ahead: bool,
    /// Prefill passes launched while the pass before them was still in flight.
    pub(crate) prefill_passes_ahead: u64,
}

/// Running totals the engine reports in its stats (and a server in its metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenTotals {
    /// Prompt tokens of the requests queued.
    pub prompt_tokens: u64,
    /// Tokens generated and delivered.
    pub generation_tokens: u64,
    /// Sequences preempted (their KV dropped, recomputed later).
    pub preemptions: u64,
}

impl<F: ForwardModel> EngineCore<F> {
    /// An idle core over `model` with an empty KV cache of `cfg.num_blocks` blocks, publishing to
    /// `slots`.
    pub fn new(model: F, codec: Arc<dyn TextCodec>, cfg: CoreConfig, slots: Slots) -> Self {
        let blocks = BlockManager::new(cfg.num_blocks, cfg.block_size)
            .with_prefix_cache(cfg.kv.prefix_cache);
        let swap = SwapPool::new(cfg.kv.swap_blocks);
        Self {
            cfg,
            model,
            codec,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            newest_seq_id: 0,
            decode_steps: 0,
            notes: Vec::new(),
            slots,
            checkpoints: 0,
            restores: 0,
            checkpoint_time: std::time::Duration::ZERO,
            spec_proposed: 0,
            spec_accepted: 0,
            forward_time: std::time::Duration::ZERO,
            decode_host: DecodeHostTimes::default(),
            machine_name: "",
            machine_state: "",
            checkpoint_hook: None,
            outbox: Outbox::inline(),
            totals: TokenTotals::default(),
            grammar: None,
            swap,
            kv_counts: KvCounters::default(),
            mix_prefill: true,
            overlap_host: false,
            pending: None,
            decode_ahead: false,
            prefill_ahead: false,
            prefill_passes_ahead: 0,
            ahead: None,
        }
    }

    /// Overlaps each decode step's host work with the next forward pass from now on (or stops,
    /// after running what is pending); see [`super::overlap`].
    pub fn set_overlap_host(&mut self, on: bool) {
        if !on {
            self.flush_pending();
        }
        self.overlap_host = on;
    }

    /// Launches each overlapped decode step's successor before its tokens come back, where the
    /// model can, from now on (or stops, after collecting the step in flight); see
    /// [`super::ahead`]. Only overlapped steps ([`Self::set_overlap_host`]) launch ahead.
    pub fn set_decode_ahead(&mut self, on: bool) {
        if !on {
            self.flush_pending();
        }
        self.decode_ahead = on;
    }

    /// Launches each prefill pass before the one before it is waited for, where the model can,
    /// from now on (or stops); see [`super::prefill_ahead`]. No pass is in flight between
    /// actions, so this takes effect at the next prefill.
    pub fn set_prefill_ahead(&mut self, on: bool) {
        self.prefill_ahead = on;
    }

    /// Prefill passes launched so far while the pass before them was still in flight.
    pub fn prefill_passes_ahead(&self) -> u64 {
        self.prefill_passes_ahead
    }

    /// Delivers output events on a thread of their own from now on, so that waking the clients
    /// overlaps the next forward pass (see [`super::outbox`]); the engine thread does this.
    pub fn deliver_on_own_thread(&mut self) {
        self.outbox = Outbox::with_courier();
    }

    /// Gives the core structured-output support (restored requests rebuild their matchers).
    pub fn set_grammar(&mut self, grammar: Option<Arc<GrammarSupport>>) {
        self.grammar = grammar;
    }

    /// The core's structured-output support, if any.
    pub fn grammar(&self) -> Option<&GrammarSupport> {
        self.grammar.as_deref()
    }

    /// The settings the core was built with.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Queues an accepted sequence.
    pub fn enqueue(&mut self, mut seq: Sequence) {
        self.totals.prompt_tokens += seq.prompt_len as u64;
        self.hash_prefix(&mut seq);
        self.waiting.push_back(seq);
    }

    /// Prompt tokens queued, tokens generated and preemptions so far.
    pub fn totals(&self) -> TokenTotals {
        self.totals
    }

    /// What the prefix cache, swapping and recomputation did so far.
    pub fn kv_counters(&self) -> KvCounters {
        self.kv_counts
    }

    /// Nothing waiting, running or swapped out, no work pending and no decode step in flight.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty()
            && self.running.is_empty()
            && self.swap.is_empty()
            && self.pending.is_none()
            && self.ahead.is_none()
    }

    /// The current values of the slot counters.
    pub fn counters(&self) -> Counters {
        Counters {
            pending_request_count: self.waiting.len() as u32,
            batch_size: self.running.len() as u32,
            kv_blocks_used: self.blocks.used() as u32,
            current_seq_id: self.newest_seq_id as u32,
        }
    }

    /// Trace notes since the previous call.
    pub fn take_notes(&mut self) -> Vec<&'static str> {
        std::mem::take(&mut self.notes)
    }

    /// Writes the runtime-owned counters into the slots.
    pub fn publish(&self) {
        let c = self.counters();
        self.slots
            .set_pending_request_count(c.pending_request_count);
        self.slots.set_batch_size(c.batch_size);
        self.slots.set_kv_blocks_used(c.kv_blocks_used);
        self.slots.set_current_seq_id(c.current_seq_id);
    }

    /// Checkpoint and restore actions run so far.
    pub fn checkpoint_counts(&self) -> (u64, u64) {
        (self.checkpoints, self.restores)
    }

    /// Wall time spent in checkpoint actions so far.
    pub fn checkpoint_time(&self) -> std::time::Duration {
        self.checkpoint_time
    }

    /// Installs the work behind the checkpoint and restore actions.
    pub fn set_checkpoint_hook(&mut self, hook: Box<dyn CheckpointHook<Self>>) {
        self.checkpoint_hook = Some(hook);
    }

    /// Records which machine drives the core and its state (the engine loop calls this per step).
    pub fn set_machine_state(&mut self, machine: &'static str, state: &'static str) {
        self.machine_name = machine;
        self.machine_state = state;
    }

    /// The machine's name and current state as last recorded.
    pub fn machine_state(&self) -> (&'static str, &'static str) {
        (self.machine_name, self.machine_state)
    }

    /// Wall time spent in model forward passes so far.
    pub fn forward_time(&self) -> std::time::Duration {
        self.forward_time
    }

    /// Decode (and verify) forward passes so far.
    pub fn decode_steps(&self) -> u64 {
        self.decode_steps
    }

    /// Host time of decode steps outside the forward pass so far.
    pub fn decode_host_times(&self) -> DecodeHostTimes {
        self.decode_host
    }

    // ----- predicates -----

    /// Free blocks kept back for the running batch's growth: one per running sequence, so a
    /// newly admitted sequence does not force a preemption at the very next decode step.
    pub(super) fn growth_reserve(&self) -> usize {
        self.running.len()
    }

    /// A request is waiting, nothing is swapped out (swapped sequences come back first), the
    /// batch has room, and the cache can hold its tokens (less those found in the prefix cache,
    /// plus the running batch's growth reserve). A request whose next prefix block is being
    /// prefilled for a sequence admitted before it waits for that prefill, to share its blocks.
    pub fn can_admit(&self) -> bool {
        match self.waiting.front() {
            Some(seq) => {
                let hit = self.prefix_hit(seq);
                let needed = self.blocks.blocks_for(seq.tokens.len() + 1) - hit.len()
                    + self.blocks.idle_among(&hit);
                self.swap.is_empty()
                    && self.running.len() < self.cfg.max_batch
                    && needed + self.growth_reserve() <= self.blocks.free_count()
                    && !self.prefix_in_flight(seq, hit.len())
            }
            None => false,
        }
    }

    /// Whether a running sequence has not finished its prefill.
    pub fn has_unprefilled(&self) -> bool {
        self.running.iter().any(|s| !s.prefilled)
    }

    /// Whether any sequence is in the running batch.
    pub fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// Whether no sequence is waiting or running (the same as [`Self::is_idle`]).
    pub fn all_finished(&self) -> bool {
        self.is_idle()
    }

    /// New blocks the next decode step needs (one token per prefilled sequence).
    pub(super) fn decode_growth(&self) -> usize {
        self.running
            .iter()
            .filter(|s| s.prefilled)
            .map(|s| {
                self.blocks
                    .extra_blocks(s.block_table.len(), s.tokens.len())
            })
            .sum()
    }

    /// Whether the next decode step needs more new blocks than the cache has free.
    pub fn kv_exhausted(&self) -> bool {
        self.decode_growth() > self.blocks.free_count()
    }

    // ----- actions -----
}
