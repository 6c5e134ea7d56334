//! The Llama architecture, written once against the [`crate::backend::Backend`] abstraction.

pub mod batch;
pub mod config;
