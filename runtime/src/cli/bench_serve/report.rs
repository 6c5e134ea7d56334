//! The online benchmark's result: vLLM `bench serve`'s metrics computed from the timed requests,
//! and its printed layout.
//!
//! Design: `calculate_metrics` of vLLM's `benchmarks/serve.py`. Over successful requests: TPOT
//! per request is (E2EL - TTFT) / (output tokens - 1) when more than one token came; ITL is every
//! gap; input tokens are the planned prompt lengths (the server's `usage.prompt_tokens` instead,
//! when text prompts are re-tokenized by the server). Goodput counts the requests meeting every
//! SLO (`ttft`, `tpot`, `e2el` in ms; a one-token request's TPOT is 0). Peak output throughput
//! counts text chunks per whole second of the run; peak concurrency is the most requests in flight.

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use super::client::Outcome;
use crate::cli::bench_stats::{Summary, summarize};

/// A service-level objective: `ttft:MS`, `tpot:MS` or `e2el:MS`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    /// Which metric: "ttft", "tpot" or "e2el".
    pub metric: SloMetric,
    /// Upper bound in milliseconds.
    pub ms: f64,
}

/// The metrics an SLO may bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// End-to-end latency.
    E2el,
}

impl FromStr for Slo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (k, v) = s
            .split_once(':')
            .ok_or_else(|| format!("goodput SLO '{s}' is not KEY:MS"))?;
        let metric = match k.trim().to_ascii_lowercase().as_str() {
            "ttft" => SloMetric::Ttft,
            "tpot" => SloMetric::Tpot,
            "e2el" => SloMetric::E2el,
            other => {
                return Err(format!(
                    "goodput metric '{other}' is not ttft, tpot or e2el"
                ));
            }
        };
        match v.trim().parse::<f64>() {
            Ok(ms) if ms.is_finite() && ms >= 0.0 => Ok(Slo { metric, ms }),
            _ => Err(format!(
                "goodput SLO '{s}': '{v}' is not a number of ms >= 0"
            )),
        }
    }
}

/// The result of an online run.
#[derive(Debug, Clone, Serialize)]
pub struct OnlineResult {
    /// Endpoint URL benchmarked.
    pub url: String,
    /// Model name sent (empty when none).
    pub model: String,
    /// Configured request rate ("inf" or requests per second).
    pub request_rate: String,
    /// Gamma shape of the arrivals.
    pub burstiness: f64,
    /// Most requests in flight allowed (None: unlimited).
    pub max_concurrency: Option<usize>,
    /// Requests sent.
    pub num_prompts: usize,
    /// Requests that succeeded.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// First send to last finish, in seconds.
    pub duration_s: f64,
    /// Prompt tokens of successful requests.
    pub total_input_tokens: usize,
    /// Generated tokens of successful requests.
    pub total_output_tokens: usize,
    /// Successful requests per second.
    pub request_throughput: f64,
    /// Requests meeting every SLO per second (None without SLOs).
    pub request_goodput: Option<f64>,
    /// The SLOs.
    pub goodput_slos: Vec<Slo>,
    /// Generated tokens per second.
    pub output_throughput: f64,
    /// Most text chunks (tokens, when each chunk carries one) in one whole second of the run.
    pub peak_output_throughput: f64,
    /// Most requests in flight at once.
    pub peak_concurrent_requests: usize,
    /// Prompt plus generated tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: Summary,
    /// Time per output token after the first.
    pub tpot: Summary,
    /// Inter-token latency.
    pub itl: Summary,
    /// End-to-end latency.
    pub e2el: Summary,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
}

/// Settings echoed in the result.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// Endpoint URL.
    pub url: String,
    /// Model sent.
    pub model: String,
    /// Request rate as configured.
    pub request_rate: String,
    /// Burstiness.
    pub burstiness: f64,
    /// Concurrency limit.
    pub max_concurrency: Option<usize>,
    /// SLOs for goodput.
    pub slos: Vec<Slo>,
}

/// TPOT of one request (zero with one token or fewer), as vLLM defines it.
fn tpot(o: &Outcome) -> Duration {
    let n = o.output_tokens();
    if n > 1 {
        o.latency.saturating_sub(o.ttft) / (n as u32 - 1)
    } else {
        Duration::ZERO
    }
}

/// Computes the result; `planned_input[i]` is request i's prompt length as drawn.
pub fn compute(
    info: RunInfo,
    outcomes: &[Outcome],
    planned_input: &[usize],
    duration: Duration,
) -> OnlineResult {
    let ok: Vec<(usize, &Outcome)> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.success)
        .collect();
    let secs = duration.as_secs_f64().max(1e-9);
    let total_input_tokens: usize = ok
        .iter()
        .map(|(i, o)| {
            o.prompt_tokens
                .unwrap_or(planned_input.get(*i).copied().unwrap_or(0))
        })
        .sum();
    let total_output_tokens: usize = ok.iter().map(|(_, o)| o.output_tokens()).sum();
    let ttfts: Vec<Duration> = ok.iter().map(|(_, o)| o.ttft).collect();
    let tpots: Vec<Duration> = ok
        .iter()
        .filter(|(_, o)| o.output_tokens() > 1)
        .map(|(_, o)| tpot(o))
        .collect();
    let itls: Vec<Duration> = ok.iter().flat_map(|(_, o)| o.itl.iter().copied()).collect();
    let e2els: Vec<Duration> = ok.iter().map(|(_, o)| o.latency).collect();
    let request_goodput = (!info.slos.is_empty()).then(|| {
        let good = ok
            .iter()
            .filter(|(_, o)| {
                info.slos.iter().all(|slo| {
                    let v = match slo.metric {
                        SloMetric::Ttft => o.ttft,
                        SloMetric::Tpot => tpot(o),
                        SloMetric::E2el => o.latency,
                    };
                    v.as_secs_f64() * 1e3 <= slo.ms
                })
            })
            .count();
        good as f64 / secs
    });
    OnlineResult {
        url: info.url,
        model: info.model,
        request_rate: info.request_rate,
        burstiness: info.burstiness,
        max_concurrency: info.max_concurrency,
        num_prompts: outcomes.len(),
        completed: ok.len(),
        failed: outcomes.len() - ok.len(),
        duration_s: secs,
        total_input_tokens,
        total_output_tokens,
        request_throughput: ok.len() as f64 / secs,
        request_goodput,
        goodput_slos: info.slos,
        output_throughput: total_output_tokens as f64 / secs,
        peak_output_throughput: peak_tokens_per_second(ok.iter().map(|(_, o)| *o)),
        peak_concurrent_requests: peak_concurrency(ok.iter().map(|(_, o)| *o)),
        total_token_throughput: (total_input_tokens + total_output_tokens) as f64 / secs,
        ttft: summarize(&ttfts),
        tpot: summarize(&tpots),
        itl: summarize(&itls),
        e2el: summarize(&e2els),
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
    }
}

/// Most text chunks (tokens) arriving within one whole second of the run.
fn peak_tokens_per_second<'a>(ok: impl Iterator<Item = &'a Outcome>) -> f64 {
    let mut per_second: Vec<usize> = Vec::new();
    for o in ok {
        let mut t = o.start + o.ttft;
        let times = std::iter::once(t).chain(o.itl.iter().map(|gap| {
            t += *gap;
            t
        }));
        for at in times {
            let s = at.as_secs() as usize;
            if per_second.len() <= s {
                per_second.resize(s + 1, 0);
            }
            per_second[s] += 1;
        }
    }
    per_second.into_iter().max().unwrap_or(0) as f64
}

/// Most successful requests in flight at once (from its send to its last chunk).
fn peak_concurrency<'a>(ok: impl Iterator<Item = &'a Outcome>) -> usize {
    let mut edges: Vec<(Duration, i64)> = ok
        .flat_map(|o| [(o.start, 1), (o.start + o.latency, -1)])
        .collect();
    // Ends sort before starts at the same instant.
    edges.sort();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

/// Prints the result in vLLM `bench serve`'s layout.
pub fn print(r: &OnlineResult) {
    let line = |k: &str, v: String| println!("{k:<40} {v:<10}");
    let f2 = |x: f64| format!("{x:.2}");
    println!("{:=^50}", " Serving Benchmark Result ");
    line("Successful requests:", r.completed.to_string());
    line("Failed requests:", r.failed.to_string());
    if let Some(c) = r.max_concurrency {
        line("Maximum request concurrency:", c.to_string());
    }
    line("Request rate configured (RPS):", r.request_rate.clone());
    line("Benchmark duration (s):", f2(r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line("Request throughput (req/s):", f2(r.request_throughput));
    if let Some(g) = r.request_goodput {
        line("Request goodput (req/s):", f2(g));
    }
    line("Output token throughput (tok/s):", f2(r.output_throughput));
    line(
        "Peak output token throughput (tok/s):",
        f2(r.peak_output_throughput),
    );
    line(
        "Peak concurrent requests:",
        r.peak_concurrent_requests.to_string(),
    );
    line(
        "Total Token throughput (tok/s):",
        f2(r.total_token_throughput),
    );
    for (title, short, s) in [
        ("Time to First Token", "TTFT", r.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", r.tpot),
        ("Inter-token Latency", "ITL", r.itl),
        ("End-to-end Latency", "E2EL", r.e2el),
    ] {
        println!("{title:-^50}");
        line(&format!("Mean {short} (ms):"), f2(s.mean_ms));
        line(&format!("Median {short} (ms):"), f2(s.median_ms));
        line(&format!("P99 {short} (ms):"), f2(s.p99_ms));
    }
    println!("{:=^50}", "");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn outcome(start: u64, ttft: u64, itl: &[u64], usage: Option<usize>) -> Outcome {
        Outcome {
            success: true,
            start: ms(start),
            ttft: ms(ttft),
            itl: itl.iter().map(|&g| ms(g)).collect(),
            latency: ms(ttft + itl.iter().sum::<u64>()),
            chunks: itl.len() + 1,
            completion_tokens: usage,
            ..Outcome::default()
        }
    }

    /// Two requests worked by hand with vLLM's definitions.
    #[test]
    fn metrics_follow_vllm_definitions() {
        // A: sent at 0, TTFT 100, gaps 10 and 30 -> 3 tokens, E2EL 140, TPOT (140-100)/2 = 20.
        // B: sent at 500, TTFT 300, gap 50, but the server's usage says 5 tokens (one chunk
        //    carried several): E2EL 350, TPOT (350-300)/4 = 12.5.
        // C: failed.
        let failed = Outcome {
            error: Some("HTTP 500".into()),
            ..Outcome::default()
        };
        let outs = [
            outcome(0, 100, &[10, 30], None),
            outcome(500, 300, &[50], Some(5)),
            failed,
        ];
        let info = RunInfo {
            url: "u".into(),
            model: "m".into(),
            request_rate: "inf".into(),
            burstiness: 1.0,
            max_concurrency: None,
            slos: vec!["ttft:200".parse().unwrap(), "tpot:25".parse().unwrap()],
        };
        let r = compute(info, &outs, &[7, 9, 11], Duration::from_secs(2));
        assert_eq!((r.completed, r.failed), (2, 1));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (16, 8));
        assert_eq!(r.output_throughput, 4.0);
        assert_eq!(r.total_token_throughput, 12.0);
        assert_eq!(r.ttft.mean_ms, 200.0);
        assert_eq!(r.tpot.mean_ms, 16.25);
        // ITL gaps 10, 30, 50: median 30; numpy p99 = 30 + 0.98 * 20 = 49.6.
        assert_eq!(r.itl.median_ms, 30.0);
        assert!((r.itl.p99_ms - 49.6).abs() < 1e-9);
        assert_eq!(r.e2el.median_ms, 245.0);
        // Only A meets TTFT <= 200 and TPOT <= 25: 1 request in 2 s.
        assert_eq!(r.request_goodput, Some(0.5));
        // Tokens of A at 100, 110, 140 ms and B's chunks at 800, 850 ms: all in second 0.
        assert_eq!(r.peak_output_throughput, 5.0);
        // A runs 0..140, B 500..850: never both.
        assert_eq!(r.peak_concurrent_requests, 1);
        assert_eq!(r.first_error.as_deref(), Some("HTTP 500"));
    }

    #[test]
    fn slo_parsing() {
        let s: Slo = "TPOT:12.5".parse().unwrap();
        assert_eq!((s.metric, s.ms), (SloMetric::Tpot, 12.5));
        assert!("itl:5".parse::<Slo>().is_err());
        assert!("ttft".parse::<Slo>().is_err());
        assert!("ttft:-1".parse::<Slo>().is_err());
    }
}
