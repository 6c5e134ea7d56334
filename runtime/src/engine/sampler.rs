//! Token sampling from one row of logits: penalties, greedy, temperature, top-k, top-p, min-p, and
//! log-probabilities of the chosen token and the top n.
//!
//! Design: the warpers run in Hugging Face `generate`'s order (penalties, temperature, top-k, top-p,
//! min-p), then one inverse-CDF draw with the request's counter-based RNG ([`super::rng`]); the
//! draw itself ([`super::draw`]) is specified to the bit, so a model that draws on its device
//! chooses the same token. Every
//! step takes exactly one draw (greedy too), so the RNG counter equals the number of tokens
//! generated and a request samples the same tokens whatever else is in its batch. Ties are broken
//! by the lower token id. Logprobs are those of the raw model distribution (before penalties and
//! temperature), as vLLM reports them by default.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::draw::draw;
use super::request::SamplingParams;
use super::rng::SampleRng;

/// A token and its log-probability under the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// The token id.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
}

/// The outcome of sampling one position.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token chosen.
    pub token: u32,
    /// Log-probability of `token` (when logprobs were requested).
    pub logprob: Option<f32>,
    /// The most likely tokens, best first (when top-n logprobs were requested).
    pub top: Vec<TokenLogprob>,
}

/// Descending by value, then ascending by token id: a total order, so selection is deterministic.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// The `k` best `(token, value)` pairs of `values`, best first.
fn top_k_sorted(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    let k = k.min(all.len());
    if k == 0 {
        return Vec::new();
    }
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, by_logit_desc);
        all.truncate(k);
    }
    all.sort_unstable_by(by_logit_desc);
    all
}

/// Index of the largest value (lowest index among ties). NaN never wins.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// log(sum(exp(values))), computed stably.
fn log_sum_exp(values: &[f32]) -> f32 {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = values.iter().map(|&v| ((v - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

/// Applies repetition (over prompt and output), frequency and presence penalties (over output).
fn apply_penalties(logits: &mut [f32], p: &SamplingParams, prompt: &[u32], output: &[u32]) {
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; logits.len()];
        for &t in prompt.iter().chain(output) {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (logit, _) in logits.iter_mut().zip(&seen).filter(|(_, s)| **s) {
            if *logit > 0.0 {
                *logit /= p.repetition_penalty;
            } else {
                *logit *= p.repetition_penalty;
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(logit) = logits.get_mut(t as usize) {
                *logit -= p.frequency_penalty * c as f32 + p.presence_penalty;
            }
        }
    }
}

/// Adds `p.logit_bias`, and bans the end-of-sequence tokens `eos_ids` while fewer than
/// `p.min_tokens` tokens were generated (`generated` so far).
fn apply_bias(logits: &mut [f32], p: &SamplingParams, generated: usize, eos_ids: &[u32]) {
    for &(token, bias) in &p.logit_bias {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit += bias;
        }
    }
    if generated < p.min_tokens {
        for &eos in eos_ids {
            if let Some(logit) = logits.get_mut(eos as usize) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// Samples one token from `logits` (`[vocab]`) for a request with parameters `p`, given its prompt
/// and the tokens it has generated so far (`eos_ids`: the end-of-sequence tokens `min_tokens`
/// holds back). Takes exactly one draw from `rng`. Logprobs are those of the model's distribution,
/// before penalties and bias (as vLLM reports them by default).
pub fn sample(
    logits: &[f32],
    p: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    eos_ids: &[u32],
    rng: &mut SampleRng,
) -> Sampled {
    let bits = rng.next_bits();
    let (logprob_of, top) = match p.logprobs {
        Some(n) => {
            let lse = log_sum_exp(logits);
            let top = top_k_sorted(logits, n)
                .into_iter()
                .map(|(token, v)| TokenLogprob {
                    token,
                    logprob: v - lse,
                })
                .collect();
            (Some(lse), top)
        }
        None => (None, Vec::new()),
    };
    let mut work = logits.to_vec(); // [vocab]
    apply_penalties(&mut work, p, prompt, output);
    apply_bias(&mut work, p, output.len(), eos_ids);
    let token = if p.is_greedy() {
        argmax(&work)
    } else {
        draw(&work, &p.draw_spec(bits))
    };
    Sampled {
        token,
        logprob: logprob_of.map(|lse| logits[token as usize] - lse),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    /// Empirical frequencies of `draws` samples.
    fn histogram(logits: &[f32], p: &SamplingParams, draws: usize) -> Vec<f64> {
        let mut rng = SampleRng::new(99);
        let mut h = vec![0.0; logits.len()];
        for _ in 0..draws {
            h[sample(logits, p, &[], &[], &[], &mut rng).token as usize] += 1.0 / draws as f64;
        }
        h
    }

    fn softmax(v: &[f32]) -> Vec<f64> {
        let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = v.iter().map(|&x| ((x - m) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn greedy_picks_argmax_lowest_id_on_ties() {
        let logits = [0.5, 2.0, 2.0, -1.0];
        let mut rng = SampleRng::new(1);
        assert_eq!(
            sample(&logits, &SamplingParams::greedy(), &[], &[], &[], &mut rng).token,
            1
        );
        assert_eq!(rng.counter, 1, "greedy still takes one draw");
    }

    #[test]
    fn temperature_sampling_matches_softmax() {
        let logits = [1.0, 2.0, 0.0, 1.5];
        let p = params(0.7);
        let want = softmax(&logits.map(|x| x / 0.7));
        let got = histogram(&logits, &p, 40_000);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 0.01, "got {got:?} want {want:?}");
        }
    }

    #[test]
    fn top_k_top_p_min_p_restrict_support() {
        let logits = [3.0, 2.9, 0.0, -1.0, 2.8];
        // top-k 2: only tokens 0 and 1.
        let h = histogram(
            &logits,
            &SamplingParams {
                top_k: 2,
                ..params(1.0)
            },
            5_000,
        );
        assert!(
            h[2] == 0.0 && h[3] == 0.0 && h[4] == 0.0 && h[0] > 0.3 && h[1] > 0.3,
            "{h:?}"
        );
        // top-p: the three near-equal tokens hold ~0.96 of the mass; 0.5 keeps the first two.
        let h = histogram(
            &logits,
            &SamplingParams {
                top_p: 0.5,
                ..params(1.0)
            },
            5_000,
        );
        assert!(h[2] == 0.0 && h[3] == 0.0 && h[4] == 0.0, "{h:?}");
        // min-p 0.2: exp(0 - 3) = 0.05 < 0.2 drops tokens 2 and 3.
        let h = histogram(
            &logits,
            &SamplingParams {
                min_p: 0.2,
                ..params(1.0)
            },
            5_000,
        );
        assert!(h[2] == 0.0 && h[3] == 0.0 && h[4] > 0.2, "{h:?}");
        // top-p over a large vocabulary exercises the growing prefix: 1000 equal logits, top_p 0.9.
        let flat = vec![0.0f32; 1000];
        let h = histogram(
            &flat,
            &SamplingParams {
                top_p: 0.9,
                ..params(1.0)
            },
            20_000,
        );
        let support = h.iter().filter(|&&x| x > 0.0).count();
        assert!((850..=900).contains(&support), "support {support}");
        assert!(h[900..].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn logit_bias_and_min_tokens_steer_the_choice() {
        let logits = [2.0, 1.0, 0.5];
        let mut rng = SampleRng::new(0);
        let biased = SamplingParams {
            logit_bias: vec![(2, 5.0), (7, 1.0)], // an id past the vocabulary is ignored
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&logits, &biased, &[], &[], &[], &mut rng).token, 2);
        let banned = SamplingParams {
            logit_bias: vec![(0, -100.0)],
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&logits, &banned, &[], &[], &[], &mut rng).token, 1);
        // Token 0 as EOS: held back until two tokens exist, then allowed again.
        let min2 = SamplingParams {
            min_tokens: 2,
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&logits, &min2, &[], &[5], &[0], &mut rng).token, 1);
        assert_eq!(
            sample(&logits, &min2, &[], &[5, 5], &[0], &mut rng).token,
            0
        );
        // Logprobs stay those of the model's distribution.
        let lp = SamplingParams {
            logprobs: Some(0),
            ..biased
        };
        let s = sample(&logits, &lp, &[], &[], &[], &mut rng);
        let lse = log_sum_exp(&logits);
        assert_eq!(s.logprob, Some(0.5 - lse));
        assert!(!lp.is_plain_argmax(0) && !min2.is_plain_argmax(1) && min2.is_plain_argmax(2));
    }

    #[test]
    fn penalties_follow_hf_and_openai() {
        let logits = [2.0, -2.0, 1.0];
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut w = logits.to_vec();
        apply_penalties(&mut w, &p, &[0], &[1]);
        assert_eq!(w, vec![1.0, -4.0, 1.0]);
        let p = SamplingParams {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy()
        };
        let mut w = logits.to_vec();
        apply_penalties(&mut w, &p, &[2], &[0, 0, 1]);
        assert_eq!(w, vec![2.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 1.0]);
        // Greedy with a repetition penalty moves off the repeated token.
        let mut rng = SampleRng::new(0);
        let p = SamplingParams {
            repetition_penalty: 4.0,
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&logits, &p, &[], &[0], &[], &mut rng).token, 2);
    }

    #[test]
    fn logprobs_are_raw_log_softmax() {
        let logits = [1.0f32, 3.0, 2.0];
        let p = SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        };
        let s = sample(&logits, &p, &[], &[], &[], &mut SampleRng::new(0));
        let want = softmax(&logits);
        assert_eq!(s.token, 1);
        assert!((s.logprob.unwrap_or(0.0) as f64 - want[1].ln()).abs() < 1e-5);
        assert_eq!(
            s.top.iter().map(|t| t.token).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert!((s.top[1].logprob as f64 - want[2].ln()).abs() < 1e-5);
    }

    #[test]
    fn seeded_draw_depends_only_on_seed_and_index() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            seed: Some(5),
            ..params(1.0)
        };
        let run = |start: u64| {
            let mut rng = SampleRng {
                seed: 5,
                counter: start,
            };
            sample(&logits, &p, &[], &[], &[], &mut rng).token
        };
        let mut rng = SampleRng::new(5);
        let seq: Vec<u32> = (0..8)
            .map(|_| sample(&logits, &p, &[], &[], &[], &mut rng).token)
            .collect();
        assert_eq!(run(6), seq[6]);
        assert!(seq.iter().any(|&t| t != seq[0]), "draws vary: {seq:?}");
    }
}
