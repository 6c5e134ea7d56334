//! The engine core's step actions: admit waiting requests into the batch (block manager), prefill
//! their prompts, decode one token for every running sequence; the forward pass behind them, and
//! the per-row advance (sampling, stop checks, output events) of what it returns.
//!
//! Design: methods of [`EngineCore`] the scheduler's `admit`, `prefill` and `decode` actions call
//! (through [`super::bind`]); the mixed step (`mixed.rs`) and speculative verification reuse
//! the forward and advance helpers here.

use std::time::Instant;

use super::advance::{Advanced, RowInput, advance_all};
use super::core::{EngineCore, Pass};
use super::error::EngineError;
use super::forward::{ForwardModel, PickedRows, RowPick, pick_on_host};
use super::output::FinishReason;
use super::sequence::Sequence;
use crate::model::batch::SeqChunk;

impl<F: ForwardModel> EngineCore<F> {
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
    /// pass (long prompts run in chunks), and samples each one's next token when it completes:
    /// each pass launched before the one before it is waited for where the core is set so
    /// ([`super::prefill_ahead`]), else one pass after the other.
    pub fn prefill(&mut self) -> Result<(), EngineError> {
        if self.prefill_ahead {
            return self.prefill_launching_ahead();
        }
        loop {
            let plan = self.prefill_plan();
            if plan.is_empty() {
                self.end_unrunnable_prompts();
                return Ok(());
            }
            let picks = self.prompt_picks(&plan);
            self.prefill_pass_in_turn(&plan, &picks);
        }
    }

    /// One prefill pass over `plan` (running index, tokens to run) with `picks`, waited for: the
    /// rows whose prompt it completes are advanced (and retired when they finish); when it
    /// fails, its sequences end with the error.
    pub(crate) fn prefill_pass_in_turn(&mut self, plan: &[(usize, usize)], picks: &[RowPick]) {
        let indices: Vec<usize> = plan.iter().map(|p| p.0).collect();
        let block_size = self.cfg.block_size;
        let Some(picked) = self.forward_rows(&indices, picks, Pass::Pick, |running| {
            prompt_chunks(running, plan, block_size)
        }) else {
            return;
        };
        tracing::trace!(target: "sov::pass", "engine: prefill pass returned");
        let now = Instant::now();
        let inputs = self.row_inputs(&picked, picks);
        let rows = self.run_chunks(plan, inputs);
        self.offer_full_blocks();
        self.advance_and_retire(&rows, now);
        tracing::trace!(target: "sov::pass", "engine: prefill rows advanced");
    }

    /// Moves each planned sequence's `computed` past the chunk it ran (`plan`: running index,
    /// tokens run) and marks it prefilled when that reaches its last token; returns the rows
    /// that ended their pending tokens, with their inputs (running index, row input), the ones
    /// that take a next token.
    pub(crate) fn run_chunks<'a>(
        &mut self,
        plan: &[(usize, usize)],
        inputs: Vec<RowInput<'a>>,
    ) -> Vec<(usize, RowInput<'a>)> {
        let mut rows = Vec::with_capacity(plan.len());
        for (&(i, take), input) in plan.iter().zip(inputs) {
            let s = &mut self.running[i];
            s.computed += take;
            if s.computed == s.tokens.len() {
                s.prefilled = true;
                rows.push((i, input));
            }
        }
        rows
    }

    /// One decode forward over every prefilled running sequence: overlapped with the host work of
    /// the step before when the core is set so ([`super::overlap`]), else in turn
    /// ([`Self::decode_in_turn`]).
    pub fn decode(&mut self) -> Result<(), EngineError> {
        if self.overlap_host {
            self.decode_overlapped()
        } else {
            self.decode_in_turn()
        }
    }

    /// One decode forward over every prefilled running sequence; samples one token each, streams it,
    /// retires finished sequences and frees their blocks in this same step.
    pub fn decode_in_turn(&mut self) -> Result<(), EngineError> {
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
        self.finish_step(&rows, now, t_tokens);
        Ok(())
    }

    /// The end of a forward step, shared by decode and mixed steps: offers the blocks that
    /// filled to the prefix cache, advances `rows` ([`Self::advance_rows`]) and retires the
    /// sequences that finished, counting the host time from `t_tokens` (the forward's end).
    pub(super) fn finish_step(
        &mut self,
        rows: &[(usize, RowInput<'_>)],
        now: Instant,
        t_tokens: Instant,
    ) {
        self.offer_full_blocks();
        let finished = self.advance_rows(rows, now);
        let t_retire = Instant::now();
        self.decode_host.tokens += t_retire - t_tokens;
        self.retire(finished);
        self.decode_host.retire += t_retire.elapsed();
    }

    /// How running sequence `i`'s next token is chosen: by the model where its logits are when
    /// the host sampler would take the `argmax` or the [`super::draw::draw`] of the unchanged row
    /// ([`super::SamplingParams::is_plain_argmax`], [`super::SamplingParams::is_plain_draw`]; the
    /// draw with the bits the sequence's RNG gives next), else by the host sampler from the
    /// downloaded row.
    pub(crate) fn row_pick(&self, i: usize) -> RowPick {
        self.row_pick_after(i, 0)
    }

    /// [`Self::row_pick`] of running sequence `i` once `later` more tokens are committed (each
    /// takes one draw of its RNG): the pick of a step launched before those tokens reach the
    /// host ([`super::ahead`]).
    pub(crate) fn row_pick_after(&self, i: usize, later: usize) -> RowPick {
        let s = &self.running[i];
        let generated = s.output().len() + later;
        if s.constraint.is_some() {
            RowPick::Logits
        } else if s.sampling.is_plain_argmax(generated) {
            RowPick::Argmax
        } else if s.sampling.is_plain_draw(generated) {
            let mut rng = s.rng;
            for _ in 0..later {
                rng.next_uniform();
            }
            RowPick::Draw(s.sampling.draw_spec(rng.peek_bits()))
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

    /// Each row's input to [`super::advance`]: the model's token for an `Argmax` or `Draw` row, the logits
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
                    RowPick::Skip | RowPick::Argmax | RowPick::Draw(_) => &[],
                },
            })
            .collect()
    }

    /// Advances `rows` by one token each ([`Self::advance_rows`]) and retires those that finished.
    pub(super) fn advance_and_retire(&mut self, rows: &[(usize, RowInput<'_>)], now: Instant) {
        let finished = self.advance_rows(rows, now);
        self.retire(finished);
    }

    /// The model's answer to `picks`, or why it cannot be used (a failed pass, or rows missing).
    pub(super) fn check_picked(
        &self,
        result: Result<PickedRows, String>,
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        let picked = result?;
        let want = |p: RowPick| picks.iter().filter(|&&x| x == p).count();
        let vocab = self.model.vocab_size();
        let tokens_ok = picks
            .iter()
            .zip(&picked.tokens)
            .all(|(p, t)| !p.is_token() || t.is_some());
        if picked.tokens.len() != picks.len()
            || !tokens_ok
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
    pub(super) fn deliver(&mut self, i: usize, adv: Advanced) -> Option<FinishReason> {
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
}

/// The chunks of a prompt plan (running index, tokens to run) over `running`: each sequence's
/// next `take` tokens from its `computed` position, with the blocks they reach.
pub(crate) fn prompt_chunks<'s>(
    running: &'s [Sequence],
    plan: &[(usize, usize)],
    block_size: usize,
) -> Vec<SeqChunk<'s>> {
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
}
