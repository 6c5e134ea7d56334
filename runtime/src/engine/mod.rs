//! The engine: continuous batching driven by the generated scheduler.
//!
//! Data path: [`Engine::submit`] validates and tokenizes a [`Request`] on the caller's
//! thread and queues it; one engine thread owns the model and repeatedly asks the generated
//! scheduler (`crate::scheduler`, compiled from `specs/scheduler.toml`) for the next step, whose
//! actions and predicates [`core::EngineCore`] implements: admit (block manager), prefill,
//! decode and the mixed step carrying prompt chunks along with the decode rows (model forward +
//! [`sampler`]), preempt by recomputation or swap to host ([`swap_actions`] over the pool of
//! [`swap`]),
//! share cached prompt prefixes ([`prefix_cache`]), and the side paths (checkpoint, speculative
//! draft/verify). Outputs stream back per request over a channel.

pub mod advance;
pub mod ahead;
pub mod bind;
pub mod blocks;
pub mod checkpointing;
pub mod codec;
pub mod constraint;
pub mod core;
pub mod core_config;
pub mod core_view;
pub mod draw;
pub mod error;
pub mod forward;
pub mod handle;
pub mod hook;
pub mod host_times;
pub mod intake;
pub mod kv_policy;
mod mixed;
pub mod outbox;
pub mod output;
pub mod overlap;
pub mod pending;
pub mod prefill_ahead;
pub mod prefix_cache;
mod prefix_core;
pub mod request;
pub mod retire;
pub mod rng;
pub mod sampler;
pub mod sequence;
pub mod speculative;
pub mod step;
pub mod swap;
pub mod swap_actions;
pub mod swap_spill;
pub mod text;

pub use codec::{ByteCodec, TextCodec};
pub use error::EngineError;
pub use forward::ForwardModel;
pub use handle::{Engine, EngineConfig, EngineStats, Submitted, TraceEntry};
pub use host_times::DecodeHostTimes;
pub use kv_policy::{KvCounters, KvPolicy};
pub use output::{FinishReason, Finished, Output};
pub use request::{Prompt, Request, SamplingParams};
#[cfg(test)]
mod ahead_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod host_bench;
#[cfg(test)]
mod kv_tests;
#[cfg(test)]
mod mixed_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod tests;
