//! The extension point for the checkpoint side path: the scheduler's `checkpoint` and `restore`
//! actions call a [`CheckpointHook`] when one is installed (the WORM store of
//! `crate::checkpoint`), and are counted no-ops otherwise. The hook gets the whole core, including
//! the machine's name and current state, which the engine loop records before every step.

use super::core::EngineCore;
use super::error::EngineError;
use super::forward::ForwardModel;

/// Work behind the `checkpoint` and `restore` actions.
pub trait CheckpointHook<F: ForwardModel>: Send {
    /// Snapshot the core (and publish the receipt in its slots).
    fn checkpoint(&mut self, core: &mut EngineCore<F>) -> Result<(), EngineError>;
    /// Replace the core's sequences with the newest valid checkpoint's.
    fn restore(&mut self, core: &mut EngineCore<F>) -> Result<(), EngineError>;
}
