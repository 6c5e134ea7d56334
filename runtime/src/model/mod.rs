//! The Llama architecture, written once against the [`crate::backend::Backend`] abstraction.
//!
//! [`LlamaModel`] owns the weights on a backend and runs forward passes over a paged
//! [`KvCache`]; the engine describes each step as a batch of [`batch::SeqChunk`]s.

pub mod batch;
pub use crate::loader::config;
pub mod error;
pub mod kv_cache;
pub mod llama;
pub mod plan;
pub mod random;
pub mod rope;
pub mod tensor_parallel;
pub mod weights;

pub use error::ModelError;
pub use kv_cache::KvCache;
pub use llama::{Activations, LlamaModel};
