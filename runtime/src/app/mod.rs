//! The application layer: start-up and process plumbing shared by the command line, the examples
//! and (next) the server. It builds an engine from options (model, backend, machine, checkpoint
//! store, keys) and owns what lives outside the engine loop: sov's directories, run directories,
//! the slot file that exposes the control surface to other processes, and the battery watcher.
//!
//! Design: dependencies point down. `cli` (and the server) call `app`; `app` calls `engine`,
//! `loader`, `model`, `backend` and the checkpoint store; nothing below reads the process
//! environment or knows a command line.

pub mod battery;
pub mod checkpoints;
pub mod dirs;
mod launch;
pub mod options;
pub mod perplexity;
pub mod reproduce;
pub mod run_dir;
pub mod run_platform;
pub mod runs;
pub mod slot_file;
pub mod start;
pub mod tensor_parallel;
pub mod witnesses;

pub use dirs::{DirOverrides, SovDirs};
pub use start::{
    CheckpointInfo, CheckpointOptions, Device, EngineOptions, KvBudget, ModelParts, Started,
    default_kv_mode, kv_bytes_per_token, kv_row_bytes, model_digest, start_engine, start_on,
};
