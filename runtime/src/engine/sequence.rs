//! One request inside the engine: its tokens, KV block table, sampler state, text stream, timing
//! and the channel its outputs go to.

use std::sync::mpsc::Sender;
use std::time::Instant;

use super::output::{FinishReason, Finished, Output};
use super::request::SamplingParams;
use super::rng::SampleRng;
use super::text::TextStream;

/// A sequence: prompt plus generated tokens.
#[derive(Debug)]
pub struct Sequence {
    /// Request id (also the sequence id: one sequence per request).
    pub id: u64,
    /// Prompt then generated tokens, `[prompt_len + generated]`.
    pub tokens: Vec<u32>,
    /// Number of leading `tokens` that are the prompt.
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache (positions `0..computed`).
    pub computed: usize,
    /// The prompt (and after a preemption the whole history) has run; one token is pending decode.
    pub prefilled: bool,
    /// Physical KV blocks, in order.
    pub block_table: Vec<u32>,
    /// Most new tokens (request's, capped by the machine's max_tokens).
    pub max_tokens: usize,
    /// How to sample the next token.
    pub sampling: SamplingParams,
    /// The sequence's own sampler RNG (seeded per request, saved in checkpoints).
    pub rng: SampleRng,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Incremental detokenizer and stop-string matcher for the generated tokens.
    pub text: TextStream,
    /// Where the sequence's outputs (tokens, text, the finish) are sent.
    pub tx: Sender<Output>,
    /// When the request was submitted.
    pub arrival: Instant,
    /// When the first generated token arrived.
    pub first_token_at: Option<Instant>,
    /// When the newest generated token arrived.
    pub last_token_at: Option<Instant>,
    /// Gap before each token after the first.
    pub inter_token: Vec<std::time::Duration>,
    /// Times the sequence's KV was dropped to make room (it is recomputed on readmission).
    pub preemptions: u32,
    /// Speculative tokens proposed by the last `draft` action, checked by the next `verify`.
    pub draft: Vec<u32>,
    /// The front end's bytes about the request ([`super::Request::tag`]), journaled with it.
    pub tag: Vec<u8>,
    /// Structured output: the grammar and its matcher (None: free text).
    pub constraint: Option<super::constraint::Constrained>,
    /// Prefix caching: the hashes of its full blocks and how many of its blocks are offered.
    pub prefix: super::prefix_cache::PrefixState,
}

impl Sequence {
    /// The prompt tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    /// The tokens generated so far.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Records the arrival time of a new token.
    pub fn note_token_time(&mut self, now: Instant) {
        match self.last_token_at {
            None => self.first_token_at = Some(now),
            Some(prev) => self.inter_token.push(now.duration_since(prev)),
        }
        self.last_token_at = Some(now);
    }

    /// The final accounting for `reason`.
    pub fn finished(&self, reason: FinishReason) -> Finished {
        Finished {
            reason,
            prompt_tokens: self.prompt_len,
            output_tokens: self.output().to_vec(),
            text: self.text.text().to_string(),
            time_to_first_token: self.first_token_at.map(|t| t.duration_since(self.arrival)),
            inter_token_latencies: self.inter_token.clone(),
            preemptions: self.preemptions,
        }
    }
}
