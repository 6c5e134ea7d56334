//! Speculative decoding without a draft model: prompt-lookup (n-gram) drafting and exact-match
//! verification, bound to the scheduler's `draft` and `verify` actions.
//!
//! Design: `draft` proposes up to `speculative_draft_len` (a live slot) tokens per sequence by
//! finding the latest earlier occurrence of the sequence's last n tokens (n = 3, 2, 1) and copying
//! what followed it (vLLM's `ngram` method, Saxena's prompt lookup decoding). `verify` runs, in one
//! forward pass, the pending token plus every drafted token of each sequence as consecutive
//! one-token chunks (the model writes all new K/V of a layer before attending, so chunk j sees
//! chunks < j), then samples each position with the sequence's own RNG exactly as plain decoding
//! would and keeps drafted tokens while they equal the sampled ones. Output is therefore identical
//! to non-speculative decoding for greedy and seeded sampling alike; only the number of forward
//! passes changes. Unaccepted positions' blocks are released in the same step.

use std::time::Instant;

use super::core::{EngineCore, Pass};
use super::error::EngineError;
use super::forward::{ForwardModel, RowPick};
use crate::model::batch::SeqChunk;

/// Longest draft accepted from the slot, whatever is written there.
pub const MAX_DRAFT_LEN: usize = 16;
/// Longest n-gram matched.
const MAX_NGRAM: usize = 3;

/// Up to `k` tokens that followed the latest earlier occurrence of the last n tokens of `tokens`.
pub fn propose_ngram(tokens: &[u32], k: usize) -> Vec<u32> {
    let len = tokens.len();
    for n in (1..=MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let pattern = &tokens[len - n..];
        if let Some(start) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == pattern) {
            let from = start + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

impl<F: ForwardModel> EngineCore<F> {
    /// Proposes drafts for every prefilled running sequence, within its context, its max_tokens and
    /// the free KV blocks.
    pub fn draft(&mut self) -> Result<(), EngineError> {
        let k = (self.slots.speculative_draft_len() as usize).min(MAX_DRAFT_LEN);
        // Blocks plain decoding needs first; drafts only use what is left.
        let mut free = self.blocks.free_count().saturating_sub(
            self.running
                .iter()
                .filter(|s| s.prefilled)
                .map(|s| {
                    self.blocks
                        .extra_blocks(s.block_table.len(), s.tokens.len())
                })
                .sum(),
        );
        let context_len = self.cfg.context_len;
        for s in self.running.iter_mut() {
            s.draft.clear();
            if !s.prefilled || k == 0 {
                continue;
            }
            let n = s.tokens.len();
            let room = k
                .min(context_len.saturating_sub(n))
                .min(s.max_tokens.saturating_sub(s.output().len() + 1));
            let mut proposal = propose_ngram(&s.tokens, room);
            let base = self.blocks.blocks_for(n).max(s.block_table.len());
            while !proposal.is_empty()
                && self
                    .blocks
                    .blocks_for(n + proposal.len())
                    .saturating_sub(base)
                    > free
            {
                proposal.pop();
            }
            free -= self
                .blocks
                .blocks_for(n + proposal.len())
                .saturating_sub(base);
            s.draft = proposal;
        }
        Ok(())
    }

    /// Verifies the drafts in one forward pass (plain decoding for sequences without a draft).
    pub fn verify(&mut self) -> Result<(), EngineError> {
        let idx = self.preempt_until_growable("preempt(verify fallback)");
        if idx.is_empty() {
            return Ok(());
        }
        if !self.grow_prefilled(|s| s.tokens.len() + s.draft.len()) {
            // Drafts no longer fit (the batch changed since `draft`): verify plain tokens.
            for s in self.running.iter_mut() {
                s.draft.clear();
            }
            if !self.grow_prefilled(|s| s.tokens.len()) {
                return Err(EngineError::KvExhausted);
            }
        }
        // Rows: per sequence, its pending token then each drafted token. [sum(1 + draft_len)]
        let mut first_row = Vec::with_capacity(idx.len());
        let mut rows = 0;
        for &i in &idx {
            first_row.push(rows);
            rows += 1 + self.running[i].draft.len();
        }
        self.decode_steps += 1;
        let picks = vec![RowPick::Logits; rows];
        let Some(picked) = self.forward_rows(&idx, &picks, Pass::Logits, |running| {
            let mut chunks: Vec<SeqChunk<'_>> = Vec::with_capacity(rows);
            for &i in &idx {
                let s = &running[i];
                let pending = s.tokens.len() - 1;
                chunks.push(SeqChunk {
                    tokens: &s.tokens[pending..],
                    start_pos: pending,
                    block_table: &s.block_table,
                });
                for (j, t) in s.draft.iter().enumerate() {
                    chunks.push(SeqChunk {
                        tokens: std::slice::from_ref(t),
                        start_pos: pending + 1 + j,
                        block_table: &s.block_table,
                    });
                }
            }
            chunks
        }) else {
            return Ok(());
        };
        let logits = picked.logits;
        let now = Instant::now();
        let vocab = self.model.vocab_size();
        let mut finished = Vec::new();
        for (&i, &row0) in idx.iter().zip(&first_row) {
            let draft = std::mem::take(&mut self.running[i].draft);
            self.spec_proposed += draft.len() as u64;
            for j in 0..=draft.len() {
                self.running[i].computed += 1;
                let row = &logits[(row0 + j) * vocab..(row0 + j + 1) * vocab];
                if let Some(reason) = self.append_sampled(i, row, now) {
                    finished.push((i, reason));
                    break;
                }
                let s = &self.running[i];
                if j == draft.len() || s.tokens.last() != Some(&draft[j]) {
                    break;
                }
                self.spec_accepted += 1;
            }
            let s = &mut self.running[i];
            let n = s.tokens.len();
            self.blocks.shrink(&mut s.block_table, n);
        }
        self.offer_full_blocks();
        self.retire(finished);
        Ok(())
    }

    /// Speculative tokens proposed and accepted so far.
    pub fn speculation_counts(&self) -> (u64, u64) {
        (self.spec_proposed, self.spec_accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_match() {
        // ... 1 2 3 [7 8 9] ... 1 2 3 -> propose 7 8
        assert_eq!(
            propose_ngram(&[1, 2, 3, 7, 8, 9, 5, 1, 2, 3], 2),
            vec![7, 8]
        );
        // Falls back to shorter n-grams; prefers the latest occurrence.
        assert_eq!(propose_ngram(&[4, 1, 5, 4, 2, 6, 4], 3), vec![2, 6, 4]);
        assert_eq!(propose_ngram(&[1, 2, 3], 4), Vec::<u32>::new());
        assert_eq!(propose_ngram(&[5, 5], 3), vec![5]);
    }
}
