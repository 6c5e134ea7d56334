//! The `mixed_step` action: one forward pass carrying the decode token of every prefilled running
//! sequence plus a budget of pending prompt tokens (chunked prefill mixed with decode), so an
//! arriving prompt no longer stalls the running streams for its whole prefill.
//!
//! Design: Sarathi-style chunked prefill on the engine's varlen batch ([`SeqChunk`]s of any
//! length in one [`ForwardModel::forward_pick`]): decode rows are one-token chunks, prompt chunks
//! take up to `max_prefill_tokens` tokens in admission order. Every row is the row the unmixed
//! actions would run for that sequence (same tokens, positions and blocks), so on a batch-invariant
//! model the outputs equal unmixed scheduling. The machine decides when to mix (the
//! `mix_prefill` predicate in specs/runtime.toml); this file only does the step.

use std::time::Instant;

use super::core::{EngineCore, Pass};
use super::error::EngineError;
use super::forward::ForwardModel;
use crate::model::batch::SeqChunk;

impl<F: ForwardModel> EngineCore<F> {
    /// Whether prompts run inside decode steps ([`Self::mixed_step`]) rather than in prefill
    /// passes of their own (the `mix_prefill` predicate).
    pub fn mix_prefill(&self) -> bool {
        self.mix_prefill
    }

    /// Turns mixing prompts into decode steps on or off (on by default).
    pub fn set_mix_prefill(&mut self, on: bool) {
        self.mix_prefill = on;
    }

    /// The rows of the next mixed step, in running order: (running index, tokens to run). Each
    /// prefilled sequence runs its one pending token; unprefilled ones share the prompt budget,
    /// oldest first (the last to get a share may get only part of what it has left).
    fn mixed_plan(&self) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_prefill_tokens.max(1);
        self.running
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                if s.prefilled {
                    return Some((i, 1));
                }
                let take = s.tokens.len().saturating_sub(s.computed).min(budget);
                budget -= take;
                (take > 0).then_some((i, take))
            })
            .collect()
    }

    /// One forward pass over the decode rows of the prefilled running sequences and up to
    /// `max_prefill_tokens` pending prompt tokens; every sequence whose row ends its pending
    /// tokens (each decode row, a prompt's last chunk) gets its next token, streamed; finished
    /// sequences retire and free their blocks in this same step.
    pub fn mixed_step(&mut self) -> Result<(), EngineError> {
        let t_start = Instant::now();
        // As decode: should the machine not have relieved KV pressure, preempt here.
        self.preempt_until_growable("preempt(mixed fallback)");
        if !self.grow_prefilled(|s| s.tokens.len()) {
            return Err(EngineError::KvExhausted);
        }
        let plan = self.mixed_plan();
        if plan.is_empty() {
            return Ok(());
        }
        let picks = self.prompt_picks(&plan);
        let indices: Vec<usize> = plan.iter().map(|p| p.0).collect();
        let block_size = self.cfg.block_size;
        let t_fwd = Instant::now();
        self.decode_host.schedule += t_fwd - t_start;
        self.decode_steps += 1;
        let picked = self.forward_rows(&indices, &picks, Pass::Pick, |running| {
            plan.iter()
                .map(|&(i, take)| {
                    let s = &running[i];
                    // The table each unmixed action passes: decode the whole, prefill what
                    // the chunk reaches.
                    let table = if s.prefilled {
                        &s.block_table[..]
                    } else {
                        &s.block_table[..(s.computed + take).div_ceil(block_size)]
                    };
                    SeqChunk {
                        tokens: &s.tokens[s.computed..s.computed + take],
                        start_pos: s.computed,
                        block_table: table,
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
        let rows = self.run_chunks(&plan, inputs);
        self.finish_step(&rows, now, t_tokens);
        Ok(())
    }
}
