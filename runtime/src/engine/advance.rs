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
use super::core_config::CoreConfig;
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
    advance_rows(sampled || wide, seqs, rows, cfg, codec, now)
}

/// [`advance_all`] with the choice made: on the pool (`parallel`) or on this thread.
fn advance_rows(
    parallel: bool,
    seqs: Vec<&mut Sequence>,
    rows: &[RowInput<'_>],
    cfg: &CoreConfig,
    codec: &dyn TextCodec,
    now: Instant,
) -> Vec<Advanced> {
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
            let masked; // [vocab], for a constrained row
            let logits = match s.constraint.as_mut() {
                Some(c) => {
                    let mut row_copy = row.logits.to_vec();
                    if let Err(e) = c.matcher.mask_logits(&mut row_copy) {
                        return failed(format!("grammar: {e}"));
                    }
                    masked = row_copy;
                    &masked[..]
                }
                None => row.logits,
            };
            sample(
                logits,
                &s.sampling,
                prompt,
                output,
                &cfg.eos_ids,
                &mut s.rng,
            )
        }
    };
    append(s, sampled, cfg, codec, now)
}

/// A sequence that cannot continue: it ends with `why`, no event.
fn failed(why: String) -> Advanced {
    Advanced {
        reason: Some(FinishReason::Error(why)),
        event: None,
    }
}

/// Appends `sampled` to `s` (advancing its grammar matcher, if any), detokenizes it and says
/// whether `s` finished.
pub fn append(
    s: &mut Sequence,
    sampled: Sampled,
    cfg: &CoreConfig,
    codec: &dyn TextCodec,
    now: Instant,
) -> Advanced {
    let token = sampled.token;
    if let Some(c) = s.constraint.as_mut()
        && let Err(e) = c.matcher.commit(token)
    {
        return failed(format!("grammar: {e}"));
    }
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
    } else if stopped
        || s.constraint
            .as_ref()
            .is_some_and(|c| c.matcher.is_finished())
    {
        // A complete grammar allows only EOS next: end here (before min_tokens, which it
        // overrides), as a stop.
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::super::codec::ByteCodec;
    use super::super::intake::{IntakeLimits, build_sequence};
    use super::super::request::{Prompt, Request, SamplingParams};
    use super::*;

    const VOCAB: usize = 300;

    fn batch(n: usize) -> Vec<Sequence> {
        let limits = IntakeLimits {
            context_len: 64,
            vocab_size: VOCAB,
            num_blocks: 64,
            block_size: 16,
            max_tokens_cap: 64,
        };
        (0..n)
            .map(|i| {
                let mut r = Request::new(Prompt::Tokens(vec![65 + i as u32 % 20; 3]), 24);
                r.sampling = if i % 2 == 0 {
                    SamplingParams {
                        seed: Some(i as u64),
                        ..SamplingParams::greedy()
                    }
                } else {
                    SamplingParams {
                        temperature: 0.9,
                        top_p: 0.9,
                        seed: Some(i as u64),
                        ..SamplingParams::default()
                    }
                };
                if i % 3 == 0 {
                    r.stop = vec!["ca".into()];
                }
                build_sequence(i as u64, r, &ByteCodec, &limits, mpsc::channel().0).unwrap()
            })
            .collect()
    }

    /// Every row, step after step, gives the same tokens, text, events and reasons on the pool as on
    /// one thread (greedy and sampled rows, stop strings; finished rows simply keep going here).
    #[test]
    fn pool_and_one_thread_agree() {
        let cfg = CoreConfig {
            num_blocks: 64,
            block_size: 16,
            max_batch: 64,
            max_prefill_tokens: 64,
            context_len: 64,
            max_tokens_cap: 64,
            eos_ids: vec![299],
            kv: Default::default(),
        };
        let now = Instant::now();
        let (mut a, mut b) = (batch(40), batch(40));
        let mut finished = 0;
        for step in 0..24usize {
            // [rows, vocab]: a different pseudo-random row per sequence and step.
            let logits: Vec<f32> = (0..40 * VOCAB)
                .map(|k| ((k * 2_654_435_761 + step * 40_503) % 1000) as f32 / 250.0)
                .collect();
            let rows: Vec<RowInput<'_>> = (0..40)
                .map(|i| RowInput {
                    token: (i % 2 == 0).then_some(((i * 7 + step * 13) % 128) as u32 + 64),
                    logits: &logits[i * VOCAB..(i + 1) * VOCAB],
                })
                .collect();
            let one = advance_rows(false, a.iter_mut().collect(), &rows, &cfg, &ByteCodec, now);
            let pool = advance_rows(true, b.iter_mut().collect(), &rows, &cfg, &ByteCodec, now);
            for (x, y) in one.iter().zip(&pool) {
                assert_eq!(x.reason, y.reason);
                assert_eq!(x.event, y.event);
                finished += usize::from(x.reason.is_some());
            }
        }
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.tokens, y.tokens);
            assert_eq!(x.text.text(), y.text.text());
            assert_eq!(x.rng, y.rng);
        }
        assert!(finished > 0, "the run reached finish reasons");
    }
}
