//! sov: a Llama-family serving runtime whose engine loop is generated from a TOML state machine.
//!
//! Data path: request -> [`engine`] waiting queue -> generated [`scheduler`] step -> actions bound to
//! the [`model`] on a [`backend`] over a paged KV cache (run by the [`runner`], which owns the
//! CUDA decode graphs) -> sampler -> per-request output stream.
//! Side paths: [`checkpoint`] (WORM snapshots with signed receipts) and KV swapping.

#![warn(missing_docs)]

pub mod app;
pub mod backend;
pub use sov_store as checkpoint;
pub mod cli;
pub mod engine;
pub mod loader;
pub mod model;
pub mod runner;
pub mod scheduler;
pub mod serve;
