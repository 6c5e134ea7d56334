//! The engine core's ways out of the batch: preemption by recomputation when KV runs short,
//! retirement of finished sequences (their blocks freed in the step that finished them, their
//! final events sent, the checkpoint hook told), aborts, and failures.
//!
//! Design: methods of [`EngineCore`] the step actions and the scheduler's `preempt` action call.

use std::time::Instant;

use super::advance::{RowInput, advance};
use super::core::EngineCore;
use super::error::EngineError;
use super::forward::ForwardModel;
use super::output::{FinishReason, Finished, Output};
use super::sequence::Sequence;

impl<F: ForwardModel> EngineCore<F> {
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
        self.flush_pending();
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
    pub(super) fn finish_all(&mut self, mut leaving: Vec<(Sequence, FinishReason)>) {
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
