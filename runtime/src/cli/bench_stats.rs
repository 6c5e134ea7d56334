//! Summary statistics of a benchmark run, with vLLM `bench serve`'s definitions: TTFT (submit to
//! first token), TPOT (per request: (latency - TTFT) / (output tokens - 1)), ITL (every gap
//! between consecutive tokens), each as mean, median and p99 in milliseconds. Shared by the
//! offline bench and the online one (`sov bench --url`).
//!
//! Prefill and decode throughput ([`phase_rates`]) split a run at the moment the last request got
//! its first token, as llama-batched-bench splits T_PP from T_TG.
//!
//! Design: numpy's definitions, which vLLM's `bench serve` calls (`np.mean`, `np.median`,
//! `np.percentile` with its default linear interpolation between closest ranks); the tests check
//! them against a fixture numpy wrote (runtime/bench/percentile_fixture.py).

use std::time::Duration;

use serde::Serialize;

/// Mean, median and 99th percentile, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Mean, in milliseconds.
    pub mean_ms: f64,
    /// Median (50th percentile, interpolated), in milliseconds.
    pub median_ms: f64,
    /// 99th percentile (interpolated), in milliseconds.
    pub p99_ms: f64,
}

/// Percentile `p` (0..=100) of sorted `v` with linear interpolation (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Summary of durations.
pub fn summarize(values: &[Duration]) -> Summary {
    let ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    summarize_ms(ms)
}

/// Summary of values already in milliseconds (any order); all zero when there are none.
pub fn summarize_ms(mut ms: Vec<f64>) -> Summary {
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return Summary::default();
    }
    Summary {
        mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
        median_ms: percentile(&ms, 50.0),
        p99_ms: percentile(&ms, 99.0),
    }
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One finished request's timeline, relative to the start of the run.
#[derive(Debug, Clone, Copy)]
pub struct Timeline<'a> {
    /// When it was submitted.
    pub submitted: Duration,
    /// Submission to first token.
    pub ttft: Duration,
    /// The gaps before each later token.
    pub itls: &'a [Duration],
}

/// Prefill (pp) and decode (tg) throughput of a run, llama-bench style.
///
/// Definitions, with `t_pp` the moment the last request got its first token (every prompt
/// prefilled) and `t_end` the moment of the last token of the run:
/// - `prefill_tok_s` (pp) = prompt tokens of all requests / (`t_pp` - first submission);
/// - `decode_tok_s` (tg) = tokens generated after `t_pp` / (`t_end` - `t_pp`): each request's
///   first token comes from its prefill, every later one from a decode step.
///
/// With every request submitted at once (`--sweep B`, or `--num-prompts` no more than
/// `--concurrency`) and equal lengths these are llama-batched-bench's S_PP (npl * npp / T_PP) and
/// S_TG (npl * ntg / T_TG) at npl = the concurrency; at concurrency 1 they are llama-bench's
/// pp`N` (N = `--input-len`) and tg`M` (M = `--output-len`), except that tg here decodes after
/// the prompt (context N..N+M) where llama-bench's tg128 starts from an empty context, and pp here
/// includes sampling the first token. Prefill that runs inside decode steps (mixed batches)
/// counts toward pp until the last prompt is done. When requests arrive in waves (more requests
/// than the concurrency) `t_pp` is the last wave's, so both figures blur prefill with decode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseRates {
    /// Prompt tokens per second until every prompt was prefilled (pp).
    pub prefill_tok_s: f64,
    /// Generated tokens per second after that (tg).
    pub decode_tok_s: f64,
    /// `t_pp` - first submission, in seconds.
    pub prefill_s: f64,
    /// `t_end` - `t_pp`, in seconds.
    pub decode_s: f64,
    /// Tokens generated after `t_pp`.
    pub decode_tokens: usize,
}

/// [`PhaseRates`] of requests `runs` whose prompts hold `prompt_tokens` tokens in all.
pub fn phase_rates(prompt_tokens: usize, runs: &[Timeline<'_>]) -> PhaseRates {
    let Some(start) = runs.iter().map(|r| r.submitted).min() else {
        return PhaseRates::default();
    };
    let t_pp = runs
        .iter()
        .map(|r| r.submitted + r.ttft)
        .max()
        .unwrap_or(start);
    let mut t_end = t_pp;
    let mut decode_tokens = 0;
    for r in runs {
        let mut t = r.submitted + r.ttft;
        for gap in r.itls {
            t += *gap;
            if t > t_pp {
                decode_tokens += 1;
            }
        }
        t_end = t_end.max(t);
    }
    let rate = |n: usize, d: Duration| {
        if d.is_zero() {
            0.0
        } else {
            n as f64 / d.as_secs_f64()
        }
    };
    PhaseRates {
        prefill_tok_s: rate(prompt_tokens, t_pp - start),
        decode_tok_s: rate(decode_tokens, t_end - t_pp),
        prefill_s: (t_pp - start).as_secs_f64(),
        decode_s: (t_end - t_pp).as_secs_f64(),
        decode_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy() {
        // numpy.percentile([1, 2, 3, 4], [50, 99]) == [2.5, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        let s = summarize(&[
            Duration::from_millis(3),
            Duration::from_millis(1),
            Duration::from_millis(2),
        ]);
        assert_eq!((s.mean_ms, s.median_ms), (2.0, 2.0));
        assert!(peak_rss_bytes().is_some_and(|b| b > 0));
    }

    /// Against numpy's mean, median and percentile (default 'linear' method) on the inputs of
    /// bench_stats_fixture.json, which runtime/bench/percentile_fixture.py writes with numpy.
    #[test]
    fn percentiles_match_numpy_fixture() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("bench_stats_fixture.json")).expect("fixture");
        let cases = fixture["cases"].as_array().expect("cases");
        assert!(cases.len() >= 5);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        for case in cases {
            let values: Vec<f64> = serde_json::from_value(case["values"].clone()).expect("values");
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let pcts: Vec<(f64, f64)> =
                serde_json::from_value(case["percentiles"].clone()).expect("percentiles");
            for (p, want) in pcts {
                let got = percentile(&sorted, p);
                assert!(
                    close(got, want),
                    "p{p} of {} values: {got} vs numpy {want}",
                    values.len()
                );
            }
            let s = summarize_ms(values.clone());
            let (mean, median) = (
                case["mean"].as_f64().expect("mean"),
                case["median"].as_f64().expect("median"),
            );
            assert!(
                close(s.mean_ms, mean) && close(s.median_ms, median),
                "{s:?}"
            );
            assert!(close(s.p99_ms, percentile(&sorted, 99.0)));
        }
    }

    /// Two requests submitted at 0 with 10-token prompts; A's first token at 100 ms, then at
    /// 150, 250, 350 ms; B's first at 200 ms, then 300 and 400 ms. Every prompt is done at
    /// 200 ms: pp = 20 / 0.2 s = 100 tok/s; after that come A's 250, 350 and B's 300, 400 (A's
    /// 150 is before): tg = 4 / (0.4 - 0.2) s = 20 tok/s.
    #[test]
    fn phase_rates_split_at_the_last_first_token() {
        let ms = Duration::from_millis;
        let a = [ms(50), ms(100), ms(100)];
        let b = [ms(100), ms(100)];
        let runs = [
            Timeline {
                submitted: ms(0),
                ttft: ms(100),
                itls: &a,
            },
            Timeline {
                submitted: ms(0),
                ttft: ms(200),
                itls: &b,
            },
        ];
        let r = phase_rates(20, &runs);
        assert!((r.prefill_tok_s - 100.0).abs() < 1e-9, "{r:?}");
        assert!((r.decode_tok_s - 20.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.decode_tokens, 4);
        assert_eq!(phase_rates(5, &[]), PhaseRates::default());
        // One request: pp = prompt / TTFT, tg = (tokens - 1) / (last token - first token).
        let one = [Timeline {
            submitted: ms(10),
            ttft: ms(40),
            itls: &b,
        }];
        let r = phase_rates(8, &one);
        assert!((r.prefill_tok_s - 200.0).abs() < 1e-9, "{r:?}");
        assert!((r.decode_tok_s - 10.0).abs() < 1e-9, "{r:?}");
    }
}
