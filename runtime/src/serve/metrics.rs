//! `GET /metrics`: the server's counters, gauges and latency histograms in Prometheus text format,
//! named in vLLM's style (`sov_num_requests_running`, `sov_time_to_first_token_seconds`, ...).
//!
//! Design: one [`ServerMetrics`] per server owns its own `metrics-exporter-prometheus` recorder
//! (built, never installed as the global recorder, so several servers can live in one process, as
//! the tests run them). Handlers call the hooks (`on_request_start`, `on_first_token`,
//! `on_token_gap`, `on_finish`) which touch pre-registered handles (lock-free atomics). What the
//! engine already counts is not counted twice: at scrape time the gauges are read from the engine's
//! slots (`batch_size`, `pending_request_count`, `kv_blocks_used`, `bft_quorum_height`) and limits,
//! and the token, preemption, checkpoint and draft counters from `Engine::stats` (so they move
//! while requests run, as vLLM's do).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::engine::Engine;

/// Prometheus text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Time to first token buckets, seconds (vLLM's).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency buckets, seconds (vLLM's, with a finer low end for small models).
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// End-to-end request latency buckets, seconds (vLLM's, with a finer low end).
/// Tokens per request buckets, powers of two.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0, 131072.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];

/// Histogram samples recorded between two upkeeps (which fold them into the buckets, so memory
/// stays bounded when nobody scrapes).
const UPKEEP_EVERY: u64 = 4096;

/// Metric names. Counters end in `_total` as written (the exporter adds no suffix).
pub mod names {
    /// Gauge: sequences in the running batch.
    pub const RUNNING: &str = "sov_num_requests_running";
    /// Gauge: requests waiting for admission.
    pub const WAITING: &str = "sov_num_requests_waiting";
    /// Gauge: KV cache blocks allocated.
    pub const KV_USED: &str = "sov_kv_blocks_used";
    /// Gauge: KV cache blocks in all.
    pub const KV_TOTAL: &str = "sov_kv_blocks_total";
    /// Gauge: height of the checkpoint receipt chain.
    pub const RECEIPT_HEIGHT: &str = "sov_receipt_height";
    /// Counter: requests the server accepted.
    pub const REQUESTS: &str = "sov_requests_total";
    /// Counter: prompt tokens of the requests queued.
    pub const PROMPT_TOKENS: &str = "sov_prompt_tokens_total";
    /// Counter: tokens generated and delivered.
    pub const GENERATION_TOKENS: &str = "sov_generation_tokens_total";
    /// Counter: finished requests by `finished_reason`.
    pub const SUCCESS: &str = "sov_request_success_total";
    /// Counter: sequences preempted for lack of KV blocks (swapped out or recomputed).
    pub const PREEMPTIONS: &str = "sov_num_preemptions_total";
    /// Counter: KV blocks copied to the host swap pool.
    pub const SWAPPED_OUT: &str = "sov_kv_blocks_swapped_out_total";
    /// Counter: KV blocks copied back from the host swap pool.
    pub const SWAPPED_IN: &str = "sov_kv_blocks_swapped_in_total";
    /// Counter: of the blocks swapped out, those written to the swap file (`--swap-file-mb`).
    pub const SPILLED: &str = "sov_kv_blocks_spilled_total";
    /// Counter: sequences whose KV was dropped and recomputed by prefill.
    pub const RECOMPUTED: &str = "sov_num_recomputed_sequences_total";
    /// Counter: tokens looked up in the prefix cache at admission (vLLM: prefix_cache_queries).
    pub const PREFIX_QUERIES: &str = "sov_prefix_cache_queries_total";
    /// Counter: of those, tokens whose KV came from the cache (vLLM: prefix_cache_hits).
    pub const PREFIX_HITS: &str = "sov_prefix_cache_hits_total";
    /// Counter: checkpoints written.
    pub const CHECKPOINTS: &str = "sov_checkpoints_total";
    /// Counter: speculative draft tokens the model accepted.
    pub const SPEC_ACCEPTED: &str = "sov_spec_decode_accepted_tokens_total";
    /// Counter: speculative draft tokens proposed.
    pub const SPEC_DRAFT: &str = "sov_spec_decode_draft_tokens_total";
    /// Histogram: seconds from acceptance to the first token.
    pub const TTFT: &str = "sov_time_to_first_token_seconds";
    /// Histogram: seconds between two tokens of one request.
    pub const ITL: &str = "sov_inter_token_latency_seconds";
    /// Histogram: seconds from acceptance to the last token.
    pub const E2E: &str = "sov_e2e_request_latency_seconds";
    /// Histogram: prompt tokens per finished request.
    pub const REQUEST_PROMPT: &str = "sov_request_prompt_tokens";
    /// Histogram: generated tokens per finished request.
    pub const REQUEST_GENERATION: &str = "sov_request_generation_tokens";
}

/// The label `sov_request_success_total` is split by.
pub const FINISHED_REASON: &str = "finished_reason";

/// Gauges with their HELP text.
const GAUGES: &[(&str, &str)] = &[
    (names::RUNNING, "Sequences in the running batch."),
    (names::WAITING, "Requests waiting to be admitted."),
    (names::KV_USED, "KV cache blocks allocated."),
    (names::KV_TOTAL, "KV cache blocks in all."),
    (names::RECEIPT_HEIGHT, "Checkpoint receipt chain height."),
];

/// Counters with their HELP text.
const COUNTERS: &[(&str, &str)] = &[
    (names::REQUESTS, "Requests accepted."),
    (names::PROMPT_TOKENS, "Prompt tokens of queued requests."),
    (names::GENERATION_TOKENS, "Tokens generated and delivered."),
    (names::SUCCESS, "Finished requests by finish reason."),
    (
        names::PREEMPTIONS,
        "Sequences preempted (swapped out or recomputed).",
    ),
    (names::SWAPPED_OUT, "KV blocks swapped out to host memory."),
    (names::SWAPPED_IN, "KV blocks swapped back in."),
    (names::SPILLED, "KV blocks swapped out to the swap file."),
    (names::RECOMPUTED, "Sequences whose KV was recomputed."),
    (
        names::PREFIX_QUERIES,
        "Tokens looked up in the prefix cache.",
    ),
    (names::PREFIX_HITS, "Tokens found in the prefix cache."),
    (names::CHECKPOINTS, "Checkpoints written."),
    (names::SPEC_ACCEPTED, "Speculative draft tokens accepted."),
    (names::SPEC_DRAFT, "Speculative draft tokens proposed."),
];

/// Histograms with their HELP text and buckets.
const HISTOGRAMS: &[(&str, &str, &[f64])] = &[
    (names::TTFT, "Time to first token.", TTFT_BUCKETS),
    (names::ITL, "Time between two tokens.", ITL_BUCKETS),
    (names::E2E, "End-to-end request latency.", E2E_BUCKETS),
    (
        names::REQUEST_PROMPT,
        "Prompt tokens per request.",
        TOKEN_BUCKETS,
    ),
    (
        names::REQUEST_GENERATION,
        "Generated tokens per request.",
        TOKEN_BUCKETS,
    ),
];

/// The metrics of one server: its recorder and the handles the hooks and the scrape touch.
pub struct ServerMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    samples: AtomicU64,
    requests: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    request_prompt: Histogram,
    request_generation: Histogram,
    running: Gauge,
    waiting: Gauge,
    kv_used: Gauge,
    kv_total: Gauge,
    receipt_height: Gauge,
    preemptions: Counter,
    kv: [Counter; 6],
    checkpoints: Counter,
    spec_accepted: Counter,
    spec_draft: Counter,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Finish reasons registered up front, so `sov_request_success_total` lists them at 0 before any
/// request ends that way (as vLLM does).
const KNOWN_REASONS: &[&str] = &["stop", "length", "abort"];

impl ServerMetrics {
    /// A fresh set of metrics with its own recorder, every series registered at zero.
    pub fn new() -> Self {
        let recorder = build_recorder();
        let handle = recorder.handle();
        for (name, help) in GAUGES {
            recorder.describe_gauge((*name).into(), None, (*help).into());
        }
        for (name, help) in COUNTERS {
            recorder.describe_counter((*name).into(), None, (*help).into());
        }
        for (name, help, _) in HISTOGRAMS {
            recorder.describe_histogram((*name).into(), None, (*help).into());
        }
        let counter = |name: &'static str| register_counter(&recorder, Key::from_static_name(name));
        let gauge =
            |name: &'static str| recorder.register_gauge(&Key::from_static_name(name), &metadata());
        let histogram = |name: &'static str| {
            recorder.register_histogram(&Key::from_static_name(name), &metadata())
        };
        for reason in KNOWN_REASONS {
            register_counter(&recorder, success_key(reason)).absolute(0);
        }
        let m = ServerMetrics {
            samples: AtomicU64::new(0),
            requests: counter(names::REQUESTS),
            prompt_tokens: counter(names::PROMPT_TOKENS),
            generation_tokens: counter(names::GENERATION_TOKENS),
            ttft: histogram(names::TTFT),
            itl: histogram(names::ITL),
            e2e: histogram(names::E2E),
            request_prompt: histogram(names::REQUEST_PROMPT),
            request_generation: histogram(names::REQUEST_GENERATION),
            running: gauge(names::RUNNING),
            waiting: gauge(names::WAITING),
            kv_used: gauge(names::KV_USED),
            kv_total: gauge(names::KV_TOTAL),
            receipt_height: gauge(names::RECEIPT_HEIGHT),
            preemptions: counter(names::PREEMPTIONS),
            kv: [
                names::SWAPPED_OUT,
                names::SWAPPED_IN,
                names::SPILLED,
                names::RECOMPUTED,
                names::PREFIX_QUERIES,
                names::PREFIX_HITS,
            ]
            .map(counter),
            checkpoints: counter(names::CHECKPOINTS),
            spec_accepted: counter(names::SPEC_ACCEPTED),
            spec_draft: counter(names::SPEC_DRAFT),
            recorder,
            handle,
        };
        // Counters show up at 0 (an untouched handle is not rendered until it is written).
        for c in [
            &m.requests,
            &m.prompt_tokens,
            &m.generation_tokens,
            &m.preemptions,
            &m.checkpoints,
            &m.spec_accepted,
            &m.spec_draft,
        ]
        .into_iter()
        .chain(&m.kv)
        {
            c.increment(0);
        }
        m
    }

    /// A request was accepted (once per choice the engine runs).
    pub fn on_request_start(&self) {
        self.requests.increment(1);
    }

    /// A request's first token arrived `ttft` after it was accepted.
    pub fn on_first_token(&self, ttft: Duration) {
        self.ttft.record(ttft.as_secs_f64());
        self.sampled(1);
    }

    /// A request's next token arrived `gap` after its previous one.
    pub fn on_token_gap(&self, gap: Duration) {
        self.itl.record(gap.as_secs_f64());
        self.sampled(1);
    }

    /// A request ended with OpenAI finish reason `reason` (`stop`, `length`, `abort`, ...) after
    /// `e2e`, having `prompt_tokens` prompt tokens and `generation_tokens` generated ones.
    pub fn on_finish(
        &self,
        reason: &str,
        e2e: Duration,
        prompt_tokens: usize,
        generation_tokens: usize,
    ) {
        self.e2e.record(e2e.as_secs_f64());
        self.request_prompt.record(prompt_tokens as f64);
        self.request_generation.record(generation_tokens as f64);
        register_counter(&self.recorder, success_key(&sanitize_label(reason))).increment(1);
        self.sampled(3);
    }

    fn sampled(&self, n: u64) {
        let before = self.samples.fetch_add(n, Ordering::Relaxed);
        if (before + n) / UPKEEP_EVERY != before / UPKEEP_EVERY {
            self.handle.run_upkeep();
        }
    }

    /// Reads the engine's live gauges and counters into the recorder, then renders everything in
    /// Prometheus text format.
    pub fn render(&self, engine: &Engine) -> String {
        let slots = engine.slots();
        let stats = engine.stats();
        self.running.set(f64::from(slots.batch_size()));
        self.waiting.set(f64::from(slots.pending_request_count()));
        self.kv_used.set(f64::from(slots.kv_blocks_used()));
        self.kv_total.set(engine.limits().num_blocks as f64);
        self.receipt_height
            .set(f64::from(slots.bft_quorum_height()));
        self.prompt_tokens.absolute(stats.prompt_tokens);
        self.generation_tokens.absolute(stats.generation_tokens);
        self.preemptions.absolute(stats.preemptions);
        let kv = stats.kv;
        let values = [
            kv.blocks_swapped_out,
            kv.blocks_swapped_in,
            kv.blocks_spilled,
            kv.recomputed,
            kv.prefix_query_tokens,
            kv.prefix_hit_tokens,
        ];
        for (c, v) in self.kv.iter().zip(values) {
            c.absolute(v);
        }
        self.checkpoints.absolute(stats.checkpoints);
        self.spec_accepted.absolute(stats.spec_accepted);
        self.spec_draft.absolute(stats.spec_proposed);
        self.handle.render()
    }
}

fn build_recorder() -> PrometheusRecorder {
    HISTOGRAMS
        .iter()
        .try_fold(PrometheusBuilder::new(), |b, (name, _, buckets)| {
            b.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)
        })
        // Only an empty bucket list is refused, and none of the constants is empty.
        .unwrap_or_default()
        .build_recorder()
}

fn metadata() -> metrics::Metadata<'static> {
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()))
}

fn register_counter(recorder: &PrometheusRecorder, key: Key) -> Counter {
    recorder.register_counter(&key, &metadata())
}

fn success_key(reason: &str) -> Key {
    Key::from_parts(
        names::SUCCESS,
        vec![Label::new(FINISHED_REASON, reason.to_string())],
    )
}

/// A finish reason as a label value: at most 32 characters of `[a-z0-9_]`, so a client cannot
/// grow the label set without bound through odd text.
fn sanitize_label(reason: &str) -> String {
    reason
        .chars()
        .take(32)
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Value of the sample line `series` (name with labels, as rendered) in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    #[test]
    fn kv_counters_come_from_the_engine() {
        use crate::backend::cpu::CpuBackend;
        use crate::engine::{ByteCodec, EngineConfig, Prompt, Request};
        use crate::model::LlamaModel;
        use crate::model::random::{WeightDtype, random_weights, tiny_config};
        use crate::runner::LlamaRunner;
        use crate::scheduler::seed::Scheduler;
        use std::sync::Arc;
        let config = tiny_config();
        let weights = random_weights(&config, 3, WeightDtype::F32);
        let model = LlamaModel::new(CpuBackend::new(), &config, &weights).unwrap();
        let runner = LlamaRunner::new(model, 64, 16).unwrap();
        let config = EngineConfig {
            num_blocks: 64,
            ..EngineConfig::default()
        };
        let engine = Engine::start::<Scheduler, _>(runner, Arc::new(ByteCodec), config).unwrap();
        let m = ServerMetrics::new();
        assert_eq!(sample(&m.render(&engine), names::PREFIX_HITS), Some(0.0));
        // The same 40-token prompt twice, one after the other: the second reads the first's two
        // full blocks from the prefix cache (the third holds its last token).
        let prompt: Vec<u32> = (1..=40).collect();
        for _ in 0..2 {
            let s = engine
                .submit(Request::new(Prompt::Tokens(prompt.clone()), 2))
                .unwrap();
            while s.rx.recv().is_ok_and(|o| o.finished.is_none()) {}
        }
        let text = m.render(&engine);
        assert_eq!(sample(&text, names::PREFIX_HITS), Some(32.0));
        assert_eq!(sample(&text, names::PREFIX_QUERIES), Some(80.0));
        assert_eq!(sample(&text, names::SWAPPED_OUT), Some(0.0));
        assert_eq!(sample(&text, names::RECOMPUTED), Some(0.0));
    }

    #[test]
    fn hooks_move_counters_and_histograms() {
        let m = ServerMetrics::new();
        let before = m.handle.render();
        assert_eq!(sample(&before, names::REQUESTS), Some(0.0));
        assert_eq!(
            sample(
                &before,
                "sov_request_success_total{finished_reason=\"stop\"}"
            ),
            Some(0.0)
        );
        m.on_request_start();
        m.on_first_token(Duration::from_millis(30));
        m.on_token_gap(Duration::from_millis(3));
        m.on_token_gap(Duration::from_millis(4));
        m.on_finish("length", Duration::from_millis(50), 7, 3);
        m.on_finish("Weird reason!", Duration::from_millis(50), 1, 1);
        let text = m.handle.render();
        assert_eq!(sample(&text, names::REQUESTS), Some(1.0));
        assert_eq!(sample(&text, "sov_request_prompt_tokens_sum"), Some(8.0));
        assert_eq!(
            sample(&text, "sov_request_generation_tokens_count"),
            Some(2.0)
        );
        let le4 = "sov_request_generation_tokens_bucket{le=\"4\"}";
        assert_eq!(sample(&text, le4), Some(2.0));
        assert_eq!(
            sample(
                &text,
                "sov_request_success_total{finished_reason=\"length\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "sov_request_success_total{finished_reason=\"weird_reason_\"}"
            ),
            Some(1.0)
        );
        assert!(text.contains("# TYPE sov_time_to_first_token_seconds histogram"));
        assert_eq!(
            sample(&text, "sov_time_to_first_token_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "sov_time_to_first_token_seconds_bucket{le=\"0.04\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "sov_time_to_first_token_seconds_bucket{le=\"0.02\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "sov_inter_token_latency_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "sov_e2e_request_latency_seconds_count"),
            Some(2.0)
        );
    }

    #[test]
    fn two_servers_keep_separate_counts() {
        let a = ServerMetrics::new();
        let b = ServerMetrics::new();
        a.on_request_start();
        a.on_request_start();
        assert_eq!(sample(&a.handle.render(), names::REQUESTS), Some(2.0));
        assert_eq!(sample(&b.handle.render(), names::REQUESTS), Some(0.0));
    }

    #[test]
    fn upkeep_keeps_every_sample() {
        let m = ServerMetrics::new();
        for _ in 0..(UPKEEP_EVERY + 10) {
            m.on_token_gap(Duration::from_micros(500));
        }
        let text = m.handle.render();
        assert_eq!(
            sample(&text, "sov_inter_token_latency_seconds_count"),
            Some((UPKEEP_EVERY + 10) as f64)
        );
    }
}
