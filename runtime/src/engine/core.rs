//! The engine's state and the work behind every scheduler action and predicate: waiting queue,
//! running batch, block manager, model, sampler, output streams.
//!
//! Design: plain host data driven from outside. The generated scheduler decides which action runs
//! next (see [`super::bind`], which implements the generated `Actions` and `Guards` traits by
//! calling the methods here); nothing in this file decides *when* something happens. Every method
//! that allocates checks before it commits, and every finished sequence frees its blocks in the
//! step that finished it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::advance::{Advanced, RowInput, advance, advance_all};
use super::blocks::BlockManager;
use super::codec::TextCodec;
use super::constraint::GrammarSupport;
pub use super::core_config::CoreConfig;
use super::error::EngineError;
use super::forward::{ForwardModel, PickedRows, RowPick, pick_on_host};
use super::hook::CheckpointHook;
use super::host_times::DecodeHostTimes;
use super::kv_policy::KvCounters;
use super::outbox::Outbox;
use super::output::{FinishReason, Finished, Output};
use super::sequence::Sequence;
use super::swap::SwapPool;
use crate::model::batch::SeqChunk;
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
        }
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

    /// Nothing waiting, running or swapped out.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.swap.is_empty()
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
    fn growth_reserve(&self) -> usize {
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
    fn decode_growth(&self) -> usize {
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

    /// Moves waiting sequences into the running batch while [`Self::can_admit`] holds, allocating
    /// blocks for all their tokens (a preempted sequence brings its generated tokens back too);
    /// the longest cached prefix of full blocks is shared rather than prefilled.
    pub fn admit(&mut self) -> Result<(), EngineError> {
        while self.can_admit() {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            let n = seq.tokens.len();
            self.take_prefix(&mut seq);
            if let Err(e) = self.blocks.grow(&mut seq.block_table, n) {
                // can_admit checked the same numbers; keep the request rather than lose it.
                self.drop_kv(&mut seq);
                self.waiting.push_front(seq);
                tracing::error!("admit: {e}");
                break;
            }
            self.newest_seq_id = seq.id;
            self.running.push(seq);
        }
        Ok(())
    }

    /// The row picks of a prompt plan `(running index, tokens to run)`: only a chunk that
    /// finishes its prompt needs a token.
    pub(crate) fn prompt_picks(&self, plan: &[(usize, usize)]) -> Vec<RowPick> {
        plan.iter()
            .map(|&(i, take)| {
                let s = &self.running[i];
                if s.computed + take == s.tokens.len() {
                    self.row_pick(i)
                } else {
                    RowPick::Skip
                }
            })
            .collect()
    }

    /// Runs every unprefilled sequence's pending tokens, at most `max_prefill_tokens` per forward
    /// pass (long prompts run in chunks), and samples each one's next token when it completes.
    pub fn prefill(&mut self) -> Result<(), EngineError> {
        while self.has_unprefilled() {
            let mut budget = self.cfg.max_prefill_tokens.max(1);
            // (running index, tokens to run this pass)
            let mut plan: Vec<(usize, usize)> = Vec::new();
            for (i, s) in self
                .running
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.prefilled)
            {
                if budget == 0 {
                    break;
                }
                let take = (s.tokens.len() - s.computed).min(budget);
                budget -= take;
                plan.push((i, take));
            }
            let picks = self.prompt_picks(&plan);
            let indices: Vec<usize> = plan.iter().map(|p| p.0).collect();
            let block_size = self.cfg.block_size;
            let Some(picked) = self.forward_rows(&indices, &picks, Pass::Pick, |running| {
                plan.iter()
                    .map(|&(i, take)| {
                        let s = &running[i];
                        SeqChunk {
                            tokens: &s.tokens[s.computed..s.computed + take],
                            start_pos: s.computed,
                            block_table: &s.block_table[..(s.computed + take).div_ceil(block_size)],
                        }
                    })
                    .collect()
            }) else {
                continue;
            };
            let now = Instant::now();
            let inputs = self.row_inputs(&picked, &picks);
            // Sequences whose prompt completed, with their row: (running index, row input).
            let mut rows: Vec<(usize, RowInput<'_>)> = Vec::new();
            for (&(i, take), input) in plan.iter().zip(inputs) {
                let s = &mut self.running[i];
                s.computed += take;
                if s.computed == s.tokens.len() {
                    s.prefilled = true;
                    rows.push((i, input));
                }
            }
            self.offer_full_blocks();
            self.advance_and_retire(&rows, now);
        }
        Ok(())
    }

    /// One decode forward over every prefilled running sequence; samples one token each, streams it,
    /// retires finished sequences and frees their blocks in this same step.
    pub fn decode(&mut self) -> Result<(), EngineError> {
        let t_start = Instant::now();
        // The machine preempts before decoding when the cache is short; should it not have, preempt
        // here rather than fail the step.
        let idx = self.preempt_until_growable("preempt(decode fallback)");
        if idx.is_empty() {
            return Ok(());
        }
        if !self.grow_prefilled(|s| s.tokens.len()) {
            return Err(EngineError::KvExhausted);
        }
        let picks: Vec<RowPick> = idx.iter().map(|&i| self.row_pick(i)).collect();
        let t_fwd = Instant::now();
        self.decode_host.schedule += t_fwd - t_start;
        self.decode_steps += 1;
        let picked = self.forward_rows(&idx, &picks, Pass::Pick, |running| {
            idx.iter()
                .map(|&i| {
                    let s = &running[i];
                    SeqChunk {
                        tokens: &s.tokens[s.computed..s.computed + 1],
                        start_pos: s.computed,
                        block_table: &s.block_table,
                    }
                })
                .collect()
        });
        let t_tokens = Instant::now();
        self.decode_host.steps += 1;
        let Some(picked) = picked else {
            return Ok(());
        };
        let now = Instant::now();
        let inputs = self.row_inputs(&picked, &picks);
        let mut rows: Vec<(usize, RowInput<'_>)> = Vec::with_capacity(idx.len());
        for (&i, input) in idx.iter().zip(inputs) {
            self.running[i].computed += 1;
            rows.push((i, input));
        }
        self.offer_full_blocks();
        let finished = self.advance_rows(&rows, now);
        let t_retire = Instant::now();
        self.decode_host.tokens += t_retire - t_tokens;
        self.retire(finished);
        self.decode_host.retire += t_retire.elapsed();
        Ok(())
    }

    /// How running sequence `i`'s next token is chosen: by the model where its logits are when
    /// it is their plain argmax ([`super::SamplingParams::is_plain_argmax`]: the host sampler would
    /// take `argmax` of the unchanged row), else by the host sampler from the downloaded row.
    pub(crate) fn row_pick(&self, i: usize) -> RowPick {
        let s = &self.running[i];
        if s.constraint.is_none() && s.sampling.is_plain_argmax(s.output().len()) {
            RowPick::Argmax
        } else {
            RowPick::Logits
        }
    }

    /// One forward pass: the chunks `chunks` builds from the running batch, answered as `pass`
    /// says, timed into `forward_time` and checked against `picks`. When the pass fails, running
    /// sequences `seqs` (those the chunks belong to) end with the error and None is returned.
    pub(crate) fn forward_rows(
        &mut self,
        seqs: &[usize],
        picks: &[RowPick],
        pass: Pass,
        chunks: impl for<'s> FnOnce(&'s [Sequence]) -> Vec<SeqChunk<'s>>,
    ) -> Option<PickedRows> {
        let chunks = chunks(&self.running);
        let t_fwd = Instant::now();
        let result = match pass {
            Pass::Pick => self.model.forward_pick(&chunks, picks),
            Pass::Logits => {
                let vocab = self.model.vocab_size();
                self.model
                    .forward(&chunks)
                    .and_then(|logits| pick_on_host(vocab, logits, picks))
            }
        };
        self.forward_time += t_fwd.elapsed();
        drop(chunks);
        match self.check_picked(result, picks) {
            Ok(picked) => Some(picked),
            Err(e) => {
                self.fail(seqs, &e);
                None
            }
        }
    }

    /// Each row's input to [`super::advance`]: the model's token for an `Argmax` row, the logits
    /// row for a `Logits` row (in `picked.logits` order), nothing for a `Skip` row.
    pub(crate) fn row_inputs<'a>(
        &self,
        picked: &'a PickedRows,
        picks: &[RowPick],
    ) -> Vec<RowInput<'a>> {
        let mut host_rows = picked.logits.chunks_exact(self.model.vocab_size().max(1));
        picks
            .iter()
            .zip(&picked.tokens)
            .map(|(pick, &token)| RowInput {
                token,
                logits: match pick {
                    RowPick::Logits => host_rows.next().unwrap_or_default(),
                    RowPick::Skip | RowPick::Argmax => &[],
                },
            })
            .collect()
    }

    /// Advances `rows` by one token each ([`Self::advance_rows`]) and retires those that finished.
    fn advance_and_retire(&mut self, rows: &[(usize, RowInput<'_>)], now: Instant) {
        let finished = self.advance_rows(rows, now);
        self.retire(finished);
    }

    /// The model's answer to `picks`, or why it cannot be used (a failed pass, or rows missing).
    fn check_picked(
        &self,
        result: Result<PickedRows, String>,
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        let picked = result?;
        let want = |p: RowPick| picks.iter().filter(|&&x| x == p).count();
        let vocab = self.model.vocab_size();
        let argmax_ok = picks
            .iter()
            .zip(&picked.tokens)
            .all(|(p, t)| *p != RowPick::Argmax || t.is_some());
        if picked.tokens.len() != picks.len()
            || !argmax_ok
            || vocab == 0
            || picked.logits.len() != want(RowPick::Logits) * vocab
        {
            return Err(format!(
                "model answered {} of {} rows with {} logits",
                picked.tokens.len(),
                picks.len(),
                picked.logits.len()
            ));
        }
        Ok(picked)
    }

    /// Advances running sequences `rows` (ascending running indices, each with its row of the
    /// forward pass) by one token each, on the thread pool when that pays (see
    /// [`super::advance`]), queues their events and returns those that finished.
    pub(crate) fn advance_rows(
        &mut self,
        rows: &[(usize, RowInput<'_>)],
        now: Instant,
    ) -> Vec<(usize, FinishReason)> {
        let mut wanted = rows.iter().map(|r| r.0).peekable();
        let seqs: Vec<&mut Sequence> = self
            .running
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| wanted.next_if_eq(i).is_some())
            .map(|(_, s)| s)
            .collect();
        let inputs: Vec<RowInput<'_>> = rows.iter().map(|r| r.1).collect();
        let advanced = advance_all(seqs, &inputs, &self.cfg, self.codec.as_ref(), now);
        let mut finished = Vec::new();
        for (&(i, _), adv) in rows.iter().zip(advanced) {
            if let Some(reason) = self.deliver(i, adv) {
                finished.push((i, reason));
            }
        }
        finished
    }

    /// Queues running sequence `i`'s event and says whether it finished: for its own reason, or
    /// because its receiver went away (found by an earlier delivery).
    fn deliver(&mut self, i: usize, adv: Advanced) -> Option<FinishReason> {
        let s = &self.running[i];
        let gone = self.outbox.is_gone(s.id);
        if let Some(event) = adv.event {
            self.totals.generation_tokens += event.tokens.len() as u64;
            self.outbox.push(&s.tx, event);
        }
        match (adv.reason, gone) {
            (Some(r), _) => Some(r),
            // Nobody listens any more: the client went away.
            (None, true) => Some(FinishReason::Abort),
            (None, false) => None,
        }
    }

    /// Preempts the newest sequences (keeping at least one) while a running sequence cannot get
    /// its next block, noting `note` in the trace each time; returns the indices of the prefilled
    /// running sequences, the rows of the coming forward pass.
    pub(crate) fn preempt_until_growable(&mut self, note: &'static str) -> Vec<usize> {
        while self.kv_exhausted() && self.running.len() > 1 {
            self.preempt_newest();
            self.notes.push(note);
        }
        (0..self.running.len())
            .filter(|&i| self.running[i].prefilled)
            .collect()
    }

    /// Grows the block table of every prefilled running sequence to hold `len(seq)` tokens, all
    /// or nothing (the block manager checks before it commits); false when the cache is short.
    pub(crate) fn grow_prefilled(&mut self, len: impl Fn(&Sequence) -> usize) -> bool {
        let mut tables: Vec<(&mut Vec<u32>, usize)> = self
            .running
            .iter_mut()
            .filter(|s| s.prefilled)
            .map(|s| {
                let n = len(s);
                (&mut s.block_table, n)
            })
            .collect();
        self.blocks.grow_all(&mut tables).is_ok()
    }

    /// Preempts the newest running sequence by recomputation.
    pub fn preempt(&mut self) -> Result<(), EngineError> {
        self.preempt_newest();
        Ok(())
    }

    /// Drops the newest running sequence's KV (keeping its tokens, sampler and text state) and
    /// requeues it at the front of the waiting queue; it is recomputed when readmitted.
    pub(crate) fn preempt_newest(&mut self) {
        if let Some(mut seq) = self.running.pop() {
            self.drop_kv(&mut seq);
            seq.preemptions += 1;
            self.totals.preemptions += 1;
            self.kv_counts.recomputed += 1;
            self.hash_prefix(&mut seq);
            self.waiting.push_front(seq);
        }
    }

    /// Frees `seq`'s blocks and forgets its KV (its tokens stay): it is prefilled again.
    pub(crate) fn drop_kv(&mut self, seq: &mut Sequence) {
        self.blocks.release(&mut seq.block_table);
        seq.computed = 0;
        seq.prefilled = false;
        seq.prefix.registered = 0;
    }

    /// Samples the next token of running sequence `i` from its logits row, queues its event, and
    /// says whether the sequence finished.
    pub(crate) fn append_sampled(
        &mut self,
        i: usize,
        logits: &[f32],
        now: Instant,
    ) -> Option<FinishReason> {
        let row = RowInput {
            token: None,
            logits,
        };
        let adv = advance(
            &mut self.running[i],
            row,
            &self.cfg,
            self.codec.as_ref(),
            now,
        );
        self.deliver(i, adv)
    }

    /// Removes finished sequences (running indices), frees their blocks, queues their final events
    /// and hands this step's events over for delivery.
    pub(crate) fn retire(&mut self, mut finished: Vec<(usize, FinishReason)>) {
        // Dropped receivers found by the previous delivery are known before the leaving requests
        // are forgotten.
        self.outbox.settle();
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        let leaving = finished
            .into_iter()
            .map(|(i, reason)| (self.running.remove(i), reason))
            .collect();
        self.finish_all(leaving);
    }

    /// Ends request `id` with [`FinishReason::Abort`] wherever it is (running or waiting): its
    /// blocks are freed, it is journaled as delivered, its stream gets the final event. Unknown
    /// (finished) ids are ignored.
    pub fn abort(&mut self, id: u64) {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.retire(vec![(i, FinishReason::Abort)]);
        } else if let Some(s) = self
            .waiting
            .iter()
            .position(|s| s.id == id)
            .and_then(|i| self.waiting.remove(i))
            .or_else(|| self.swap.remove(id))
        {
            self.outbox.settle();
            self.finish_all(vec![(s, FinishReason::Abort)]);
        }
    }

    /// Frees the blocks of sequences that left the engine, journals them and queues their final
    /// events, then hands this step's events over for delivery.
    fn finish_all(&mut self, mut leaving: Vec<(Sequence, FinishReason)>) {
        for (s, _) in &mut leaving {
            self.blocks.release(&mut s.block_table);
            self.outbox.forget(s.id);
        }
        // The slots show the freed blocks before any client hears that its request finished.
        self.publish();
        let done: Vec<(Sequence, String, Finished)> = leaving
            .into_iter()
            .map(|(mut s, reason)| {
                let tail = if matches!(reason, FinishReason::Stop) {
                    String::new()
                } else {
                    s.text
                        .finish(self.codec.as_ref())
                        .map(|d| d.text)
                        .unwrap_or_default()
                };
                let fin = s.finished(reason);
                (s, tail, fin)
            })
            .collect();
        // Journaled (one durable write for the step) before any client hears of it: a resumed
        // engine reports them as delivered.
        if let Some(hook) = self.checkpoint_hook.as_mut() {
            let batch: Vec<(&Sequence, &Finished)> = done.iter().map(|(s, _, f)| (s, f)).collect();
            if let Err(e) = hook.finished(&batch) {
                tracing::error!("journaling {} finished requests: {e}", batch.len());
            }
        }
        for (s, tail, done) in done {
            self.outbox.push(
                &s.tx,
                Output {
                    request_id: s.id,
                    tokens: Vec::new(),
                    text: tail,
                    logprobs: Vec::new(),
                    time: Instant::now(),
                    finished: Some(done),
                },
            );
        }
        self.outbox.hand_off();
    }

    /// Ends running sequences `indices` with an error (a failed forward pass); others keep running.
    pub(crate) fn fail(&mut self, indices: &[usize], error: &str) {
        tracing::error!(
            "forward pass failed for {} sequences: {error}",
            indices.len()
        );
        let reason = FinishReason::Error(format!("model forward failed: {error}"));
        self.retire(indices.iter().map(|&i| (i, reason.clone())).collect());
    }
}
