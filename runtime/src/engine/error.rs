//! Errors the engine reports to callers: bad requests (refused at `submit`, the engine keeps serving)
//! and failures of the engine thread itself. `thiserror` types, no panics on user input.

use thiserror::Error;

/// Why a request was refused or an engine call failed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// The request has no prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room in the context for a generated token.
    #[error(
        "the prompt has {prompt_tokens} tokens; the context holds {context_len} (prompt + at least one new token)"
    )]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The model's context length in tokens.
        context_len: usize,
    },
    /// The request asked for `max_tokens = 0`.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// A sampling parameter or stop string is refused.
    #[error("invalid sampling parameter {name} = {value}: {reason}")]
    InvalidSampling {
        /// The parameter's name, e.g. `top_p`.
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// Why the value is refused.
        reason: &'static str,
    },
    /// A prompt token id is not below the vocabulary size.
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending token id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// The prompt alone needs more KV blocks than the whole cache has, so it could never run.
    #[error(
        "the prompt needs {needed} KV blocks (with its first new token) but the whole KV cache has only {total}"
    )]
    PromptExceedsCache {
        /// Blocks the prompt (plus one generated token) needs.
        needed: usize,
        /// Blocks in the KV cache.
        total: usize,
    },
    /// Encoding a text prompt failed; holds the tokenizer's message.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Setting up the backend or running the model failed; holds the cause.
    #[error("model forward failed: {0}")]
    Forward(String),
    /// The KV cache of the configured budget could not be allocated when the engine started
    /// (e.g. a budget larger than the GPU's free memory); holds the budget and the cause.
    #[error(
        "the KV cache ({mib} MiB) could not be allocated: {reason}; lower the KV budget (--kv-memory-mb)"
    )]
    KvCacheAlloc {
        /// The cache's size in MiB (blocks x block size x bytes a token).
        mib: usize,
        /// The backend's error.
        reason: String,
    },
    /// The KV budget cannot be settled (e.g. automatic sizing on a device that does not report
    /// its free memory); holds why.
    #[error("KV budget: {0}")]
    KvBudget(String),
    /// A step could not get the KV blocks the scheduler reserved for it (an engine bug).
    #[error("the KV cache ran out of blocks while committing a step (scheduler bug)")]
    KvExhausted,
    /// The engine thread has exited; no more requests are taken.
    #[error("the engine has stopped")]
    EngineStopped,
    /// The memory-mapped slot file could not be created, opened or used.
    #[error("slot file {path}: {reason}")]
    SlotFile {
        /// The slot file's path, as displayed.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The engine thread failed: it could not start, panicked, or the machine cannot resume.
    #[error("scheduler: {0}")]
    Scheduler(String),
    /// A structured-output grammar (JSON schema, regex, Lark) was refused, or this engine has
    /// no grammar support; holds why.
    #[error("response format: {0}")]
    InvalidGrammar(String),
    /// Opening, writing or restoring a checkpoint failed; holds the cause.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}
