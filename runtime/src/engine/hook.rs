//! The extension points for the checkpoint side path:
//! - [`CheckpointHook`]: the scheduler's `checkpoint` and `restore` actions call it when one is
//!   installed (the WORM store of `crate::checkpoint`), and are counted no-ops otherwise; the core
//!   also tells it when a request finishes, so the outcome is journaled with what was delivered.
//!   The hook gets the whole core (`C`, the engine's `EngineCore<F>`), including the machine's
//!   name and current state, which the engine loop records before every step; being generic over
//!   it, this file names nothing of the core that holds the hook.
//! - [`RequestJournal`]: called by [`super::Engine::submit`] on the caller's thread, so a request is
//!   durably recorded before `submit` returns (and before the engine thread can see it).

use super::error::EngineError;
use super::output::Finished;
use super::sequence::Sequence;

/// Work behind the `checkpoint` and `restore` actions.
pub trait CheckpointHook<C>: Send {
    /// Snapshot the core (and publish the receipt in its slots).
    fn checkpoint(&mut self, core: &mut C) -> Result<(), EngineError>;
    /// Replace the core's sequences with the newest valid checkpoint's.
    fn restore(&mut self, core: &mut C) -> Result<(), EngineError>;
    /// These sequences finished (each with its outcome) in one step; called before their final
    /// events are sent.
    fn finished(&mut self, _done: &[(&Sequence, &Finished)]) -> Result<(), EngineError> {
        Ok(())
    }
}

/// Durable record of accepted requests.
pub trait RequestJournal: Send + Sync {
    /// Record `seq` (already validated, id assigned) before the engine admits it.
    fn accept(&self, seq: &Sequence) -> Result<(), EngineError>;
    /// Record several at once (one durable write where the journal can group them).
    fn accept_all(&self, seqs: &[Sequence]) -> Result<(), EngineError> {
        seqs.iter().try_for_each(|s| self.accept(s))
    }
    /// The first request id the engine may hand out (above every id already journaled).
    fn next_id(&self) -> u64 {
        1
    }
}
