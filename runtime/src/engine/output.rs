//! What a request's stream carries: per step the new token ids, the text delta and logprobs; at the
//! end a finish reason and timing (time to first token, per-token latency).

use std::time::{Duration, Instant};

use super::sampler::TokenLogprob;

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was generated.
    Eos,
    /// A stop string matched (it is not part of the text).
    Stop,
    /// `max_tokens` new tokens were generated.
    Length,
    /// The sequence filled the model's (or the KV cache's) context.
    ContextLength,
    /// The client aborted the request ([`super::Engine::abort`]); its blocks were freed.
    Abort,
    /// The engine failed while running this request (others keep running).
    Error(String),
}

impl FinishReason {
    /// The OpenAI / vLLM spelling: `stop` (EOS or stop string), `length` (max_tokens or context),
    /// `abort`, `error`.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::ContextLength => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// Logprob information for one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The generated token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens at that position, best first.
    pub top: Vec<TokenLogprob>,
}

/// Final accounting of a finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// Why the request ended.
    pub reason: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Every generated token id, in order (including an EOS token that ended the sequence).
    pub output_tokens: Vec<u32>,
    /// The full generated text (stop string excluded).
    pub text: String,
    /// From submission to the first generated token.
    pub time_to_first_token: Option<Duration>,
    /// Gap before each later token (inter-token latencies), `[output_tokens.len() - 1]`.
    pub inter_token_latencies: Vec<Duration>,
    /// Times the sequence was preempted (and recomputed).
    pub preemptions: u32,
}

/// One event on a request's stream. The last one has `finished` set.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The request this event belongs to.
    pub request_id: u64,
    /// Tokens generated since the previous event.
    pub tokens: Vec<u32>,
    /// Text that became final since the previous event; never splits a UTF-8 character.
    pub text: String,
    /// Per new token, when logprobs were requested.
    pub logprobs: Vec<Logprobs>,
    /// When the engine produced this event.
    pub time: Instant,
    /// Set on the last event of the stream.
    pub finished: Option<Finished>,
}
