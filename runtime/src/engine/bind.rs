//! The generated scheduler's `Actions` and `Guards` traits, implemented once for [`EngineCore`]:
//! each method calls the core's work and then republishes the runtime-written slots
//! (pending_request_count, batch_size, kv_blocks_used, current_seq_id), so guards of the next step
//! and any outside reader of the slot file see the truth.
//!
//! Every action but `admit` and `decode` first runs the text and events an overlapped decode step
//! left pending ([`super::overlap`]), so it sees the sequences as an in-turn step leaves them;
//! `preempt` and `swap_out` then do nothing when that work retired enough sequences (stop strings
//! found late) for the next step's blocks, as the in-turn path would not have preempted.
//!
//! Side paths: `checkpoint` and `restore` run the installed [`super::hook::CheckpointHook`] (the
//! WORM store) and are counted no-ops without one; `swap_out` and `swap_in` move a sequence's
//! KV to and from the host swap pool ([`super::swap`]), `swap_out` falling back to preemption by
//! recomputation when the pool is full.

use super::core::EngineCore;
use super::error::EngineError;
use super::forward::ForwardModel;
use crate::scheduler::{Actions, Guards};

impl<F: ForwardModel> Actions for EngineCore<F> {
    type Error = EngineError;

    fn admit(&mut self) -> Result<(), EngineError> {
        let r = EngineCore::admit(self);
        self.publish();
        r
    }

    fn prefill(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        let r = EngineCore::prefill(self);
        self.publish();
        r
    }

    fn mixed_step(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        let r = EngineCore::mixed_step(self);
        self.publish();
        r
    }

    fn decode(&mut self) -> Result<(), EngineError> {
        let r = EngineCore::decode(self);
        self.publish();
        r
    }

    fn draft(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        let r = EngineCore::draft(self);
        self.publish();
        r
    }

    fn verify(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        let r = EngineCore::verify(self);
        self.publish();
        r
    }

    fn preempt(&mut self) -> Result<(), EngineError> {
        if self.flush_freed_enough() {
            self.notes
                .push("preempt(not needed: the pending work freed blocks)");
            self.publish();
            return Ok(());
        }
        let r = EngineCore::preempt(self);
        self.publish();
        r
    }

    fn swap_out(&mut self) -> Result<(), EngineError> {
        if self.flush_freed_enough() {
            self.notes
                .push("swap_out(not needed: the pending work freed blocks)");
            self.publish();
            return Ok(());
        }
        let r = EngineCore::swap_out(self);
        self.publish();
        r
    }

    fn swap_in(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        let r = EngineCore::swap_in(self);
        self.publish();
        r
    }

    fn checkpoint(&mut self) -> Result<(), EngineError> {
        self.flush_pending();
        self.checkpoints += 1;
        match self.checkpoint_hook.take() {
            Some(mut hook) => {
                let t0 = std::time::Instant::now();
                let r = hook.checkpoint(self);
                self.checkpoint_time += t0.elapsed();
                self.checkpoint_hook = Some(hook);
                self.publish();
                r
            }
            None => Ok(()),
        }
    }

    fn restore(&mut self) -> Result<(), EngineError> {
        self.restores += 1;
        // The sequences are replaced: their earlier events go out first.
        self.flush_pending();
        self.outbox.settle();
        match self.checkpoint_hook.take() {
            Some(mut hook) => {
                let r = hook.restore(self);
                self.checkpoint_hook = Some(hook);
                self.publish();
                r
            }
            None => Ok(()),
        }
    }
}

impl<F: ForwardModel> Guards for EngineCore<F> {
    fn can_admit(&self) -> bool {
        EngineCore::can_admit(self)
    }

    fn has_unprefilled(&self) -> bool {
        EngineCore::has_unprefilled(self)
    }

    fn has_running(&self) -> bool {
        EngineCore::has_running(self)
    }

    fn mix_prefill(&self) -> bool {
        EngineCore::mix_prefill(self)
    }

    fn all_finished(&self) -> bool {
        EngineCore::all_finished(self)
    }

    fn kv_exhausted(&self) -> bool {
        EngineCore::kv_exhausted(self)
    }

    fn has_swapped(&self) -> bool {
        EngineCore::has_swapped(self)
    }

    fn can_swap_in(&self) -> bool {
        EngineCore::can_swap_in(self)
    }
}
