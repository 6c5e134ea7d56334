//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod engine_stream;
pub mod fixture;
pub mod source;
pub mod sov_process;
