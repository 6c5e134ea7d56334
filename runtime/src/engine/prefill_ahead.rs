//! Prefill passes launched ahead: pass N + 1 is enqueued on the model's device before pass N's
//! tokens reach the host, so the GPU does not wait for the host between two prefill passes
//! (`EngineConfig::prefill_ahead`).
//!
//! Design: a prefill pass's inputs are prompt tokens the host already has, never the tokens of
//! the pass before, so unlike a decode step ([`super::ahead`]) nothing has to be fed from the
//! device: the engine plans and launches pass N + 1 ([`ForwardModel::launch_pass`]), then waits
//! for pass N ([`ForwardModel::wait_pass`]) and advances its finished prompts (sampling, stop
//! checks, events, retirement) while N + 1 computes. A sequence's `computed` moves when its
//! chunk is launched (the model's one stream writes its KV before any later pass reads it), so
//! the next plan takes its next chunk; `prefilled` is set when its last chunk's token lands, so
//! a sequence whose last chunk is in flight is planned no more. The pass in flight names its
//! sequences by id, since retiring the rows of the pass before shifts running indices. A pass
//! the model cannot launch ahead (a row the host samples: its logits must come back) first
//! lands the one in flight, then runs in turn. Tokens, events and finish reasons are those of
//! the in-turn path ([`EngineCore::prefill`]'s loop; `ahead_tests`).

use std::time::Instant;

use super::advance::RowInput;
use super::core::EngineCore;
use super::error::EngineError;
use super::forward::{ForwardModel, RowPick};
use super::step::prompt_chunks;

/// A prefill pass launched and not yet waited for.
pub(crate) struct PassInFlight {
    /// `[rows]` the sequence id of each row, in running order.
    ids: Vec<u64>,
    /// `[rows]` what the pass was asked of each row.
    picks: Vec<RowPick>,
}

impl<F: ForwardModel> EngineCore<F> {
    /// The rows of the next prefill pass, in running order: (running index, tokens to run) for
    /// each unprefilled sequence with tokens not yet launched, oldest first, up to
    /// `max_prefill_tokens` in all (the last may get only part of what it has left).
    pub(crate) fn prefill_plan(&self) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_prefill_tokens.max(1);
        let mut plan = Vec::new();
        for (i, s) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let left = s.tokens.len().saturating_sub(s.computed);
            if s.prefilled || left == 0 {
                continue;
            }
            let take = left.min(budget);
            budget -= take;
            plan.push((i, take));
        }
        plan
    }

    /// Ends the unprefilled sequences no pass can run (no token left to compute, so no row to
    /// take their next token from) with an error, rather than leave the machine prefilling
    /// forever. Admission always leaves a prompt's last token to compute, so this is a guard.
    pub(crate) fn end_unrunnable_prompts(&mut self) {
        let stuck: Vec<usize> = (self.running.iter().enumerate())
            .filter(|(_, s)| !s.prefilled && s.computed >= s.tokens.len())
            .map(|(i, _)| i)
            .collect();
        if !stuck.is_empty() {
            self.fail(&stuck, "no prompt token left to run");
        }
    }

    /// [`Self::prefill`] with each pass launched before the one before it is waited for (module
    /// doc); passes whose picks the model cannot launch ahead run in turn.
    pub(crate) fn prefill_launching_ahead(&mut self) -> Result<(), EngineError> {
        let mut in_flight: Option<PassInFlight> = None;
        loop {
            let plan = self.prefill_plan();
            if plan.is_empty() {
                if let Some(pass) = in_flight.take() {
                    self.land_pass(pass);
                    continue;
                }
                self.end_unrunnable_prompts();
                return Ok(());
            }
            let picks = self.prompt_picks(&plan);
            if !self.model.launches_pass(&picks) {
                if let Some(pass) = in_flight.take() {
                    // Running indices may shift when the pass lands: plan again after it.
                    self.land_pass(pass);
                    continue;
                }
                self.prefill_pass_in_turn(&plan, &picks);
                continue;
            }
            let launched = self.launch_prefill(&plan, picks);
            if let Some(pass) = in_flight.take() {
                self.prefill_passes_ahead += u64::from(launched.is_some());
                self.land_pass(pass);
            }
            in_flight = launched;
        }
    }

    /// Launches the prefill pass of `plan` (running index, tokens) with `picks` and moves each
    /// row's `computed` past its chunk; when the launch fails, its sequences end with the error
    /// and None is returned.
    fn launch_prefill(
        &mut self,
        plan: &[(usize, usize)],
        picks: Vec<RowPick>,
    ) -> Option<PassInFlight> {
        let chunks = prompt_chunks(&self.running, plan, self.cfg.block_size);
        let t_fwd = Instant::now();
        let launched = self.model.launch_pass(&chunks, &picks);
        self.forward_time += t_fwd.elapsed();
        drop(chunks);
        tracing::trace!(target: "sov::pass", "engine: prefill pass launched");
        let indices: Vec<usize> = plan.iter().map(|p| p.0).collect();
        if let Err(e) = launched {
            self.fail(&indices, &e);
            return None;
        }
        for &(i, take) in plan {
            self.running[i].computed += take;
        }
        Some(PassInFlight {
            ids: indices.iter().map(|&i| self.running[i].id).collect(),
            picks,
        })
    }

    /// Waits for `pass` and advances the rows whose prompt it completed; when it failed, its
    /// sequences still running end with the error.
    fn land_pass(&mut self, pass: PassInFlight) {
        let t_wait = Instant::now();
        let result = self.model.wait_pass();
        self.forward_time += t_wait.elapsed();
        tracing::trace!(target: "sov::pass", "engine: prefill pass returned");
        let rows = self.rows_of(&pass.ids);
        let picked = match self.check_picked(result, &pass.picks) {
            Ok(picked) => picked,
            Err(e) => {
                let live: Vec<usize> = rows.into_iter().flatten().collect();
                self.fail(&live, &e);
                return;
            }
        };
        let now = Instant::now();
        let inputs = self.row_inputs(&picked, &pass.picks);
        // Sequences whose prompt completed, with their row: (running index, row input).
        let mut done: Vec<(usize, RowInput<'_>)> = Vec::new();
        for ((row, pick), input) in rows.into_iter().zip(&pass.picks).zip(inputs) {
            let Some(i) = row else { continue };
            let s = &mut self.running[i];
            if *pick != RowPick::Skip && s.computed == s.tokens.len() {
                s.prefilled = true;
                done.push((i, input));
            }
        }
        self.offer_full_blocks();
        self.advance_and_retire(&done, now);
        tracing::trace!(target: "sov::pass", "engine: prefill rows advanced");
    }
}
