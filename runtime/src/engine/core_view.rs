//! What the checkpoint side path may see of an [`EngineCore`] and do to it: a borrowed view of its
//! state to snapshot, and the few moves a restore makes (empty the core, admit a sequence whose KV
//! was copied back, queue one for recomputation, set the step counter).
//!
//! Design: the adapter in [`super::checkpointing`] goes through these methods, never through the
//! core's fields, so the block manager's invariants (every running sequence owns exactly the
//! blocks its table names; a released table is empty) stay inside the core.

use std::collections::VecDeque;

use super::codec::TextCodec;
use super::core::EngineCore;
use super::forward::ForwardModel;
use super::sequence::Sequence;
use crate::scheduler::Slots;

/// The core's state as a checkpoint reads it, with the model borrowed mutably beside it (a
/// `Blocks` checkpoint reads KV through the model while the sequences are borrowed).
pub struct CoreParts<'a, F> {
    /// The model (its KV access).
    pub model: &'a mut F,
    /// Running sequences, admission order (the newest last).
    pub running: &'a [Sequence],
    /// Sequences swapped out to host memory, oldest first (they come back before the waiting).
    pub swapped: Vec<&'a Sequence>,
    /// Waiting sequences, queue order.
    pub waiting: &'a VecDeque<Sequence>,
    /// The live control surface.
    pub slots: &'a Slots,
    /// Decode (or verify) forward passes run so far.
    pub decode_steps: u64,
}

/// A running sequence's block table could not be grown to hold its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

impl<F: ForwardModel> EngineCore<F> {
    /// The core's state borrowed for a snapshot.
    pub fn parts(&mut self) -> CoreParts<'_, F> {
        CoreParts {
            model: &mut self.model,
            running: &self.running,
            swapped: self.swap.sequences().collect(),
            waiting: &self.waiting,
            slots: &self.slots,
            decode_steps: self.decode_steps,
        }
    }

    /// The model the core drives.
    pub fn model_mut(&mut self) -> &mut F {
        &mut self.model
    }

    /// The codec that turns the core's tokens into text.
    /// Every sequence in the core, running, swapped out, then waiting.
    pub fn sequences(&self) -> impl Iterator<Item = &Sequence> {
        self.running
            .iter()
            .chain(self.swap.sequences())
            .chain(self.waiting.iter())
    }

    /// The core's tokenizer.
    pub fn codec(&self) -> &dyn TextCodec {
        self.codec.as_ref()
    }

    /// The live control surface.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Empties the core: every running sequence's blocks are freed and the swap pool emptied;
    /// returns the running sequences (admission order), the swapped ones (oldest first), then the
    /// waiting ones (queue order), their block tables empty.
    pub fn take_sequences(&mut self) -> Vec<Sequence> {
        let mut all: Vec<Sequence> = Vec::with_capacity(self.running.len() + self.waiting.len());
        for mut s in std::mem::take(&mut self.running) {
            self.drop_kv(&mut s);
            all.push(s);
        }
        all.extend(self.swap.take_all());
        all.extend(self.waiting.drain(..));
        all
    }

    /// Admits `seq` straight into the running batch with blocks for all its tokens, then lets
    /// `write_kv` fill those blocks (it gets the model and the new block table and returns how many
    /// of the sequence's tokens now have KV: `seq.computed`). On `NoRoom` nothing changed.
    pub fn admit_with_kv<E>(
        &mut self,
        mut seq: Sequence,
        write_kv: impl FnOnce(&mut F, &[u32]) -> Result<usize, E>,
    ) -> Result<Result<(), E>, NoRoom> {
        let n = seq.tokens.len();
        if self.blocks.grow(&mut seq.block_table, n).is_err() {
            return Err(NoRoom);
        }
        match write_kv(&mut self.model, &seq.block_table) {
            Ok(computed) => {
                seq.computed = computed;
                self.newest_seq_id = seq.id;
                self.running.push(seq);
                Ok(Ok(()))
            }
            Err(e) => {
                self.blocks.release(&mut seq.block_table);
                Ok(Err(e))
            }
        }
    }

    /// Queues `seq` for (re)computation from its first token: whatever KV it had is dropped.
    pub fn requeue_for_recompute(&mut self, mut seq: Sequence) {
        self.drop_kv(&mut seq);
        self.hash_prefix(&mut seq);
        self.waiting.push_back(seq);
    }

    /// Sets the decode step counter (a restore continues the checkpoint's count).
    pub fn set_decode_steps(&mut self, steps: u64) {
        self.decode_steps = steps;
    }
}
