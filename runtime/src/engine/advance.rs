//! One sequence's next token after a forward pass: taken from the model (a greedy row it chose) or
//! sampled here from the sequence's logits row, appended, detokenized and checked against EOS, stop
//! strings and length, with the event for its stream.
//!
//! Design: a function of the one sequence it changes, so a step advances its rows on the rayon pool
//! when that pays: host sampling over Llama-3's 128K vocabulary costs ~0.7 ms a row and a real
//! tokenizer ~1.4 µs a token, which at batch 256 would keep an accelerator waiting for many times
//! its forward pass. Each row touches only its own sequence (tokens, RNG, text stream), so the
//! results do not depend on the thread count. Sending the events is left to the caller (the
//! engine's [`super::outbox::Outbox`]).

use std::time::Instant;

use rayon::prelude::*;

use super::codec::TextCodec;
use super::core::CoreConfig;
use super::output::{FinishReason, Logprobs, Output};
use super::sampler::{Sampled, sample};
use super::sequence::Sequence;

/// What the forward pass gave for one sequence's last token.
#[derive(Debug, Clone, Copy)]
pub struct RowInput<'a> {
    /// The token the model chose (a greedy row), else None.
    pub token: Option<u32>,
    /// The logits row `[vocab]` to sample from when `token` is None.
    pub logits: &'a [f32],
}

/// What advancing one sequence produced.
#[derive(Debug)]
pub struct Advanced {
    /// Why the sequence finished, if it did.
    pub reason: Option<FinishReason>,
    /// The event for its stream (None when detokenizing failed: the sequence ends with an error).
    pub event: Option<Output>,
}

/// Greedy rows (token chosen by the model) go to the thread pool from this many on, when the pool
/// has at least [`PARALLEL_THREADS`] threads: each costs about a microsecond (more with a real
/// tokenizer), so waking the pool pays only for wide batches on a host with cores to spare. On a
/// 2-core host it made the step slower (the clients and the output thread want those cores too).
const PARALLEL_ROWS: usize = 128;
const PARALLEL_THREADS: usize = 8;

/// Advances each `seqs[k]` by `rows[k]` (same length), on the thread pool when that pays.
pub fn advance_all(
    seqs: Vec<&mut Sequence>,
    rows: &[RowInput<'_>],
    cfg: &CoreConfig,
    codec: &dyn TextCodec,
    now: Instant,
) -> Vec<Advanced> {
    // A host-sampled row costs ~0.7 ms at a 128K vocabulary: always worth the pool.
    let sampled = rows.len() > 1 && rows.iter().any(|r| r.token.is_none());
    let wide = rows.len() >= PARALLEL_ROWS && rayon::current_num_threads() >= PARALLEL_THREADS;
    let parallel = sampled || wide;
    if parallel {
        seqs.into_par_iter()
            .zip(rows.par_iter())
            .map(|(s, row)| advance(s, *row, cfg, codec, now))
            .collect()
    } else {
        seqs.into_iter()
            .zip(rows)
            .map(|(s, row)| advance(s, *row, cfg, codec, now))
            .collect()
    }
}

/// Appends `s`'s next token: the model's choice, else one sampled from the logits row.
pub fn advance(
    s: &mut Sequence,
    row: RowInput<'_>,
    cfg: &CoreConfig,
    codec: &dyn TextCodec,
    now: Instant,
) -> Advanced {
    let sampled = match row.token {
        Some(token) => {
            // The host sampler takes one draw per token, greedy too: keep the counter in step so a
            // checkpoint or a later host-sampled step sees the same RNG state.
            s.rng.next_uniform();
            Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            }
        }
        None => {
            let (prompt, output) = s.tokens.split_at(s.prompt_len);
            sample(row.logits, &s.sampling, prompt, output, &mut s.rng)
        }
    };
    append(s, sampled, cfg, codec, now)
}

/// Appends `sampled` to `s`, detokenizes it and says whether `s` finished.
pub fn append(
    s: &mut Sequence,
    sampled: Sampled,
    cfg: &CoreConfig,
    codec: &dyn TextCodec,
    now: Instant,
) -> Advanced {
    let token = sampled.token;
    s.tokens.push(token);
    s.note_token_time(now);
    let is_eos = !s.ignore_eos && cfg.eos_ids.contains(&token);
    // EOS tokens add no text.
    let delta = if is_eos {
        Ok(Default::default())
    } else {
        s.text.push(codec, token).map(|d| (d.text, d.stopped))
    };
    let (text, stopped) = match delta {
        Ok(d) => d,
        Err(e) => {
            return Advanced {
                reason: Some(FinishReason::Error(format!("detokenize: {e}"))),
                event: None,
            };
        }
    };
    let reason = if is_eos {
        Some(FinishReason::Eos)
    } else if stopped {
        Some(FinishReason::Stop)
    } else if s.output().len() >= s.max_tokens {
        Some(FinishReason::Length)
    } else if s.tokens.len() >= cfg.context_len {
        Some(FinishReason::ContextLength)
    } else {
        None
    };
    let logprobs = match sampled.logprob {
        Some(lp) => vec![Logprobs {
            token,
            logprob: lp,
            top: sampled.top,
        }],
        None => Vec::new(),
    };
    Advanced {
        reason,
        event: Some(Output {
            request_id: s.id,
            tokens: vec![token],
            text,
            logprobs,
            time: now,
            finished: None,
        }),
    }
}
