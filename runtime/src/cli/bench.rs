//! `sov bench`: offline serving benchmark with vLLM's `bench serve` conventions. N requests of
//! random token ids with fixed (or, with `--random-range-ratio`, uniformly varying) input and
//! output lengths, at most `--concurrency` in flight; reports request and token throughput, TTFT,
//! TPOT and ITL (mean, median, p99), prefill and decode tok/s as llama-bench's pp / tg
//! ([`super::bench_stats::PhaseRates`]) and peak memory; `--json [FILE]` for machines. With `--url`
//! it benchmarks a running OpenAI-compatible server instead ([`super::bench_serve`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::bench_args::BenchArgs;
use super::bench_stats::{PhaseRates, Summary, Timeline, peak_rss_bytes, phase_rates, summarize};
use crate::engine::{Engine, FinishReason, Finished, Prompt, Request, SamplingParams};

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// The model as named on the command line (or the default model's name).
    pub model: String,
    /// Requests submitted.
    pub num_prompts: usize,
    /// Requests that finished.
    pub completed: usize,
    /// Requests that ended in an error.
    pub failed: usize,
    /// Most requests in flight at once.
    pub max_concurrency: usize,
    /// Wall time from the first submit to the last finish, in seconds (warm-up excluded).
    pub duration_s: f64,
    /// Prompt tokens over all requests.
    pub total_input_tokens: usize,
    /// Generated tokens over all finished requests.
    pub total_output_tokens: usize,
    /// Finished requests per second.
    pub request_throughput: f64,
    /// Generated tokens per second.
    pub output_throughput: f64,
    /// Prompt plus generated tokens per second.
    pub total_token_throughput: f64,
    /// Prefill (pp) and decode (tg) tokens per second, llama-bench style (see [`PhaseRates`] for
    /// the definitions and how they compare with llama-bench's pp512 / tg128 and
    /// llama-batched-bench's S_PP / S_TG).
    pub phases: PhaseRates,
    /// Time to first token (submit to first token).
    pub ttft: Summary,
    /// Time per output token after the first, per request.
    pub tpot: Summary,
    /// Inter-token latency: every gap between consecutive tokens.
    pub itl: Summary,
    /// End-to-end latency, submit to finish.
    pub e2el: Summary,
    /// Peak resident set size of the process in MiB (0 when unknown).
    pub peak_rss_mib: f64,
    /// Share of the engine's busy time spent inside model forward passes.
    pub forward_share: f64,
    /// Decode steps the engine ran during the benchmark.
    pub decode_steps: u64,
    /// Checkpoint actions the machine ran (no-ops when checkpoints are off) and the share of
    /// busy time they took.
    pub checkpoints: u64,
    /// Share of busy time the checkpoint actions took (0..=1).
    pub checkpoint_share: f64,
    /// Engine-thread time per decode step outside the forward pass (µs), by phase: before the
    /// pass, after it (tokens, text, events) and retiring plus handing events over; `host_other`
    /// is the rest of the busy time that is neither forward nor checkpoint (prefill bookkeeping,
    /// the scheduler loop), also per decode step.
    pub host_schedule_us: f64,
    /// Per decode step: after the pass (tokens, text, events), µs.
    pub host_tokens_us: f64,
    /// Per decode step: retiring finished sequences and handing events over, µs.
    pub host_retire_us: f64,
    /// Per decode step: the rest of the busy time, neither forward nor checkpoint, µs.
    pub host_other_us: f64,
    /// Per decode step: host work run while the next forward pass computed (text and events of
    /// overlapped steps, `--no-host-overlap` to turn off), µs; not part of the others.
    pub host_overlapped_us: f64,
    /// Decode steps launched before the tokens of the step before them came back
    /// (`--no-decode-ahead` to turn off).
    pub decode_steps_ahead: u64,
    /// Prefill passes launched before the pass ahead of them came back (`--prefill-ahead` to
    /// turn on).
    pub prefill_passes_ahead: u64,
    /// Tokens every prompt shares at its start (`--shared-prefix-tokens`).
    pub shared_prefix_tokens: usize,
    /// KV memory during the benchmark: preemptions, swaps, recomputations, prefix-cache hits.
    pub kv: KvReport,
}

/// What the engine's KV memory paths did during one benchmark run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct KvReport {
    /// Whether the prefix cache was on.
    pub prefix_cache: bool,
    /// Sequences that left the batch for lack of KV blocks (swapped out or recomputed).
    pub preemptions: u64,
    /// Sequences swapped out to the host pool.
    pub swapped_out: u64,
    /// KV blocks copied to the host pool.
    pub blocks_swapped_out: u64,
    /// KV blocks copied back.
    pub blocks_swapped_in: u64,
    /// Of the blocks swapped out, those written to the swap file (`--swap-file-mb`).
    pub blocks_spilled: u64,
    /// Sequences whose KV was dropped and recomputed by prefill.
    pub recomputed: u64,
    /// Tokens looked up in the prefix cache at admission.
    pub prefix_query_tokens: u64,
    /// Of those, tokens whose KV came from cached blocks.
    pub prefix_hit_tokens: u64,
}

/// One request's prompt and output length.
fn workload(args: &BenchArgs, vocab: usize, eos: &[u32]) -> Vec<(Vec<u32>, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let range = |len: usize, rng: &mut rand::rngs::StdRng| {
        let r = args.random_range_ratio.clamp(0.0, 1.0);
        let lo = ((len as f64) * (1.0 - r)).round().max(1.0) as usize;
        let hi = ((len as f64) * (1.0 + r)).round().max(lo as f64) as usize;
        rng.gen_range(lo..=hi)
    };
    let token = |rng: &mut rand::rngs::StdRng| loop {
        let t = rng.gen_range(0..vocab as u32);
        if !eos.contains(&t) {
            break t;
        }
    };
    let prefix: Vec<u32> = (0..args.shared_prefix_tokens)
        .map(|_| token(&mut rng))
        .collect();
    (0..args.num_prompts)
        .map(|_| {
            let n_in = range(args.input_len, &mut rng);
            let n_out = range(args.output_len, &mut rng);
            let mut prompt = prefix.clone();
            prompt.extend((0..n_in).map(|_| token(&mut rng)));
            (prompt, n_out)
        })
        .collect()
}

fn collect(rx: std::sync::mpsc::Receiver<crate::engine::Output>) -> Option<(Finished, Instant)> {
    loop {
        let out = rx.recv().ok()?;
        if let Some(f) = out.finished {
            return Some((f, out.time));
        }
    }
}

/// What [`run_requests`] measured: each finished request with its latency and send time, the
/// failed ones (and why the first failed), and the wall time.
struct RunOutcome {
    results: Vec<(Finished, Duration, Duration)>,
    failed: usize,
    first_failure: Option<String>,
    duration: Duration,
}

fn run_requests(engine: &Engine, args: &BenchArgs, work: Vec<(Vec<u32>, usize)>) -> RunOutcome {
    let concurrency = args
        .concurrency
        .unwrap_or(work.len())
        .clamp(1, work.len().max(1));
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let failed = AtomicUsize::new(0);
    let first_failure = Mutex::new(None::<String>);
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..concurrency {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((prompt, n_out)) = work.get(i) else {
                        break;
                    };
                    let request = Request {
                        prompt: Prompt::Tokens(prompt.clone()),
                        max_tokens: *n_out,
                        sampling: args.sampling(i),
                        stop: Vec::new(),
                        ignore_eos: args.ignore_eos,
                        tag: Vec::new(),
                        grammar: None,
                    };
                    let submitted = Instant::now();
                    let outcome = match engine.submit(request) {
                        Err(e) => Err(e.to_string()),
                        Ok(s) => match collect(s.rx) {
                            None => Err("the engine closed the request's stream".to_string()),
                            Some((f, end)) => match f.reason {
                                FinishReason::Error(why) => Err(why),
                                _ => Ok((f, end)),
                            },
                        },
                    };
                    match outcome {
                        Ok((f, end)) => {
                            if let Ok(mut r) = results.lock() {
                                r.push((
                                    f,
                                    end.duration_since(submitted),
                                    submitted.duration_since(t0),
                                ));
                            }
                        }
                        Err(why) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut first) = first_failure.lock() {
                                first.get_or_insert(why);
                            }
                        }
                    }
                }
            });
        }
    });
    RunOutcome {
        duration: t0.elapsed(),
        results: results.into_inner().unwrap_or_default(),
        failed: failed.into_inner(),
        first_failure: first_failure.into_inner().unwrap_or_default(),
    }
}

/// Runs `sov bench`.
pub fn run(args: BenchArgs, dirs: &crate::app::SovDirs) -> anyhow::Result<std::process::ExitCode> {
    // A bad sampling option fails every request; say so once, before any model loads.
    args.sampling(0)
        .validate()
        .map_err(|e| anyhow::anyhow!("sampling options: {e}"))?;
    if let Some(url) = &args.online.url {
        return super::bench_serve::run(&args, url, dirs);
    }
    let started = args.model.start(dirs, false)?;
    let engine = &started.engine;
    let runs: Vec<BenchArgs> = if args.sweep.is_empty() {
        vec![args.clone()]
    } else {
        args.sweep
            .iter()
            .map(|&b| BenchArgs {
                num_prompts: b.max(1),
                concurrency: Some(b.max(1)),
                ..args.clone()
            })
            .collect()
    };
    let mut all_ok = true;
    for run_args in &runs {
        if !args.sweep.is_empty() && !args.json_to_stdout() {
            println!("sweep: batch {}", run_args.num_prompts);
        }
        all_ok &= measure(engine, run_args, &started.model_name)?;
    }
    Ok(if all_ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

/// One benchmark run on a started engine; prints its report and says whether no request failed.
fn measure(engine: &Engine, args: &BenchArgs, model_name: &str) -> anyhow::Result<bool> {
    let limits = engine.limits();
    let eos: Vec<u32> = Vec::new();
    let work = workload(args, limits.vocab_size, &eos);
    // Warm-up: one request as long as the workload's longest prompt (its own tokens, not a prompt
    // of the workload), a few tokens out -- pages in the weights and runs the first prefill and
    // decode steps of that shape (library kernels load lazily on first use), as vLLM's
    // `bench serve --num-warmups` does with workload-shaped requests.
    let warm_len = work.iter().map(|w| w.0.len()).max().unwrap_or(16);
    let warm = engine.submit(Request {
        prompt: Prompt::Tokens(vec![
            1;
            warm_len.clamp(
                1,
                limits.context_len.saturating_sub(5).max(1)
            )
        ]),
        max_tokens: 4,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: true,
        tag: Vec::new(),
        grammar: None,
    })?;
    collect(warm.rx).context("warm-up request failed")?;
    let total_input_tokens: usize = work.iter().map(|w| w.0.len()).sum();
    let max_concurrency = args.concurrency.unwrap_or(work.len());
    let before = engine.stats();
    let RunOutcome {
        results,
        failed,
        first_failure,
        duration,
    } = run_requests(engine, args, work);
    if let Some(why) = &first_failure {
        eprintln!("sov bench: {failed} request(s) failed; the first: {why}");
    }
    let after = engine.stats();
    let busy = (after.busy_time - before.busy_time).as_secs_f64();
    let forward = (after.forward_time - before.forward_time).as_secs_f64();
    let checkpoint = (after.checkpoint_time - before.checkpoint_time).as_secs_f64();
    let host = after.decode_host.since(&before.decode_host);
    let secs = duration.as_secs_f64().max(1e-9);
    let total_output_tokens: usize = results.iter().map(|r| r.0.output_tokens.len()).sum();
    let ttfts: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.0.time_to_first_token)
        .collect();
    let tpots: Vec<Duration> = results
        .iter()
        .filter(|r| r.0.output_tokens.len() > 1)
        .filter_map(|(f, e2e, _)| {
            let ttft = f.time_to_first_token?;
            Some(e2e.saturating_sub(ttft) / (f.output_tokens.len() as u32 - 1))
        })
        .collect();
    let itls: Vec<Duration> = results
        .iter()
        .flat_map(|r| r.0.inter_token_latencies.iter().copied())
        .collect();
    let e2els: Vec<Duration> = results.iter().map(|r| r.1).collect();
    let timelines: Vec<Timeline<'_>> = results
        .iter()
        .filter_map(|(f, _, submitted)| {
            Some(Timeline {
                submitted: *submitted,
                ttft: f.time_to_first_token?,
                itls: &f.inter_token_latencies,
            })
        })
        .collect();
    let result = BenchResult {
        model: model_name.to_string(),
        num_prompts: args.num_prompts,
        completed: results.len(),
        failed,
        max_concurrency,
        duration_s: secs,
        total_input_tokens,
        total_output_tokens,
        request_throughput: results.len() as f64 / secs,
        output_throughput: total_output_tokens as f64 / secs,
        total_token_throughput: (total_input_tokens + total_output_tokens) as f64 / secs,
        phases: phase_rates(total_input_tokens, &timelines),
        ttft: summarize(&ttfts),
        tpot: summarize(&tpots),
        itl: summarize(&itls),
        e2el: summarize(&e2els),
        peak_rss_mib: peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64,
        forward_share: if busy > 0.0 { forward / busy } else { 0.0 },
        decode_steps: after.decode_steps - before.decode_steps,
        checkpoints: after.checkpoints - before.checkpoints,
        checkpoint_share: if busy > 0.0 { checkpoint / busy } else { 0.0 },
        host_schedule_us: host.per_step_us(host.schedule),
        host_tokens_us: host.per_step_us(host.tokens),
        host_retire_us: host.per_step_us(host.retire),
        host_other_us: host.per_step_us(Duration::from_secs_f64(
            (busy
                - forward
                - checkpoint
                - host.total().as_secs_f64()
                - host.overlapped.as_secs_f64())
            .max(0.0),
        )),
        host_overlapped_us: host.per_step_us(host.overlapped),
        decode_steps_ahead: host.ahead,
        prefill_passes_ahead: after.prefill_passes_ahead - before.prefill_passes_ahead,
        shared_prefix_tokens: args.shared_prefix_tokens,
        kv: KvReport {
            prefix_cache: !args.model.no_prefix_cache,
            preemptions: after.preemptions - before.preemptions,
            swapped_out: after.kv.swapped_out - before.kv.swapped_out,
            blocks_swapped_out: after.kv.blocks_swapped_out - before.kv.blocks_swapped_out,
            blocks_swapped_in: after.kv.blocks_swapped_in - before.kv.blocks_swapped_in,
            blocks_spilled: after.kv.blocks_spilled - before.kv.blocks_spilled,
            recomputed: after.kv.recomputed - before.kv.recomputed,
            prefix_query_tokens: after.kv.prefix_query_tokens - before.kv.prefix_query_tokens,
            prefix_hit_tokens: after.kv.prefix_hit_tokens - before.kv.prefix_hit_tokens,
        },
    };
    if !args.json_to_stdout() {
        print_report(&result);
    }
    args.write_json(&result)?;
    Ok(failed == 0)
}

fn print_report(r: &BenchResult) {
    let line = |k: &str, v: String| println!("{k:<40}{v:>12}");
    println!("{:=^52}", " Serving Benchmark Result ");
    line("Successful requests:", r.completed.to_string());
    line("Failed requests:", r.failed.to_string());
    line(
        "Maximum request concurrency:",
        r.max_concurrency.to_string(),
    );
    line("Benchmark duration (s):", format!("{:.2}", r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", r.request_throughput),
    );
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", r.output_throughput),
    );
    line(
        "Total Token throughput (tok/s):",
        format!("{:.2}", r.total_token_throughput),
    );
    println!("{:-^52}", "Prefill / decode (llama-bench pp / tg)");
    line(
        "Prefill throughput, pp (tok/s):",
        format!("{:.2}", r.phases.prefill_tok_s),
    );
    line(
        "Decode throughput, tg (tok/s):",
        format!("{:.2}", r.phases.decode_tok_s),
    );
    for (title, short, s) in [
        ("Time to First Token", "TTFT", r.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", r.tpot),
        ("Inter-token Latency", "ITL", r.itl),
        ("End-to-end Latency", "E2EL", r.e2el),
    ] {
        println!("{:-^52}", title);
        line(&format!("Mean {short} (ms):"), format!("{:.2}", s.mean_ms));
        line(
            &format!("Median {short} (ms):"),
            format!("{:.2}", s.median_ms),
        );
        line(&format!("P99 {short} (ms):"), format!("{:.2}", s.p99_ms));
    }
    println!("{:-^52}", "Memory");
    line("Peak RSS (MiB):", format!("{:.1}", r.peak_rss_mib));
    println!("{:-^52}", "Engine");
    line("Decode steps:", r.decode_steps.to_string());
    line(
        "Model forward share of busy time:",
        format!("{:.1}%", r.forward_share * 100.0),
    );
    line("Checkpoint actions run:", r.checkpoints.to_string());
    line(
        "Checkpoint share of busy time:",
        format!("{:.2}%", r.checkpoint_share * 100.0),
    );
    println!("{:-^52}", "Host time per decode step (us)");
    line(
        "Before forward (schedule):",
        format!("{:.1}", r.host_schedule_us),
    );
    line(
        "After forward (tokens, events):",
        format!("{:.1}", r.host_tokens_us),
    );
    line(
        "Retire and hand over events:",
        format!("{:.1}", r.host_retire_us),
    );
    line("Other (prefill, loop):", format!("{:.1}", r.host_other_us));
    line(
        "Overlapped with the next forward:",
        format!("{:.1}", r.host_overlapped_us),
    );
    line(
        "Decode steps launched ahead:",
        format!("{} of {}", r.decode_steps_ahead, r.decode_steps),
    );
    line(
        "Prefill passes launched ahead:",
        r.prefill_passes_ahead.to_string(),
    );
    let kv = &r.kv;
    println!("{:-^52}", "KV memory");
    line(
        "Prefix cache:",
        if kv.prefix_cache { "on" } else { "off" }.into(),
    );
    line(
        "Prefix cache hit / queried tokens:",
        format!("{}/{}", kv.prefix_hit_tokens, kv.prefix_query_tokens),
    );
    line("Preemptions:", kv.preemptions.to_string());
    line(
        "Blocks swapped out / in:",
        format!("{}/{}", kv.blocks_swapped_out, kv.blocks_swapped_in),
    );
    line(
        "Blocks spilled to the swap file:",
        kv.blocks_spilled.to_string(),
    );
    line("Recomputed sequences:", kv.recomputed.to_string());
    println!("{:=^52}", "");
}
