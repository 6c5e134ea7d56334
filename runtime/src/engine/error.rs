//! Errors the engine reports to callers: bad requests (refused at `submit`, the engine keeps serving)
//! and failures of the engine thread itself. `thiserror` types, no panics on user input.

use thiserror::Error;

/// Why a request was refused or an engine call failed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt_tokens} tokens; the context holds {context_len} (prompt + at least one new token)"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        context_len: usize,
    },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("invalid sampling parameter {name} = {value}: {reason}")]
    InvalidSampling {
        name: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocab { token: u32, vocab_size: usize },
    #[error("the prompt needs {needed} KV blocks but the cache has only {total}")]
    PromptExceedsCache { needed: usize, total: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model forward failed: {0}")]
    Forward(String),
    #[error("the KV cache ran out of blocks while committing a step (scheduler bug)")]
    KvExhausted,
    #[error("the engine has stopped")]
    EngineStopped,
    #[error("slot file {path}: {reason}")]
    SlotFile { path: String, reason: String },
    #[error("scheduler: {0}")]
    Scheduler(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}
