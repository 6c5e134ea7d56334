//! The engine side of checkpointing: the adapter that binds the engine-free checkpoint store
//! (`crate::checkpoint`, the `sov-store` crate) to [`EngineCore`](super::core::EngineCore).
//!
//! Design: the store knows bytes, not engines; the engine owns the narrow traits it calls
//! ([`super::hook::CheckpointHook`], [`super::hook::RequestJournal`]) and implements them here on
//! top of the store, going through the core's methods ([`super::core_view`]), never its fields.
//! - [`core_io`]: the store's `KvBlockIo` for the model runner, and the bodies of the `checkpoint`
//!   and `restore` actions (`checkpoint_core`, `restore_core`);
//! - [`worm`]: [`worm::open`] builds the hook, the journal acceptor and the resume book from a
//!   store directory;
//! - [`async_blocks`]: `Blocks`-mode checkpoints whose KV is staged by the model and hashed and
//!   written on a writer thread, the receipt published once its payload is durable.

pub mod async_blocks;
pub mod core_io;
pub mod kv_tail;
pub mod worm;

#[cfg(test)]
mod async_tests;
#[cfg(test)]
mod overhead_tests;
#[cfg(test)]
mod resume_tests;

pub use worm::{JournalAcceptor, ResumeBook, ResumedRequest, Worm, WormConfig, WormHook, open};
