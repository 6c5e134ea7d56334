//! Chunked prefill mixed with decode on the real forward pass (CPU backend), through the public
//! engine: requests arriving while others decode, with long prompts prefilled in several 32-token
//! chunks inside decode steps, give exactly their tokens alone and exactly what the unmixed engine
//! (`mixed_prefill: false`, prompts in prefill passes of their own) gives, greedy and seeded. Runs
//! on a tiny random-weight Llama (always) and on the default model SmolLM2-135M (its quantized
//! kernels) when it is in sov's cache (otherwise the test says why it skipped).

mod common;

use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::engine_stream::wait;
use sov::app::start::{EngineOptions, KvBudget, ModelParts, Started, start_engine};
use sov::engine::{FinishReason, Output, Prompt, Request, SamplingParams};
use sov::loader::{cached_default_model, load_model};
use sov::model::random::{WeightDtype, tiny_config};
use sov::scheduler::seed::Scheduler;

/// Waits for the stream's first token (the request is decoding from then on).
fn first_token(rx: &Receiver<Output>) -> Vec<u32> {
    loop {
        let out = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("the request did not start");
        assert!(out.finished.is_none(), "finished before its first token");
        if !out.tokens.is_empty() {
            return out.tokens;
        }
    }
}

fn start(parts: ModelParts, mixed: bool) -> Started {
    start_engine::<Scheduler>(
        parts,
        &EngineOptions {
            kv_budget: KvBudget::Bytes(64 << 20),
            max_prefill_tokens: 32,
            mixed_prefill: mixed,
            ..EngineOptions::default()
        },
    )
    .expect("engine starts")
}

/// Prompts of 9 to 135 tokens (ids below 256 are valid in every vocabulary here).
fn requests(sampling: &SamplingParams, max_tokens: usize) -> Vec<Request> {
    (0..6)
        .map(|i| {
            let prompt: Vec<u32> = (0..(9 + 25 * i))
                .map(|j| ((i * 41 + j * 17) % 200) as u32 + 30)
                .collect();
            Request {
                sampling: SamplingParams {
                    seed: sampling.seed.map(|s| s + i as u64),
                    ..sampling.clone()
                },
                ignore_eos: true,
                ..Request::new(Prompt::Tokens(prompt), max_tokens + i)
            }
        })
        .collect()
}

/// The first two requests start; once both decode, the other four arrive (their prompts are
/// prefilled alongside the running streams). Every request's tokens, in order.
fn staggered(started: &Started, reqs: &[Request]) -> Vec<Vec<u32>> {
    let submit = |r: &Request| started.engine.submit(r.clone()).unwrap().rx;
    let early: Vec<_> = reqs[..2].iter().map(submit).collect();
    let heads: Vec<Vec<u32>> = early.iter().map(first_token).collect();
    let late: Vec<_> = reqs[2..].iter().map(submit).collect();
    let mut out = Vec::new();
    for (head, rx) in heads.into_iter().zip(&early) {
        let f = wait(rx);
        assert_eq!(f.output_tokens[..head.len()], head[..]);
        out.push(f);
    }
    out.extend(late.iter().map(wait));
    for f in &out {
        assert_eq!(f.reason, FinishReason::Length);
    }
    out.into_iter().map(|f| f.output_tokens).collect()
}

fn alone(started: &Started, reqs: &[Request]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| wait(&started.engine.submit(r.clone()).unwrap().rx).output_tokens)
        .collect()
}

fn check_mixed(parts: impl Fn() -> ModelParts, max_tokens: usize) {
    let mixed = start(parts(), true);
    let unmixed = start(parts(), false);
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(5),
            ..SamplingParams::default()
        },
    ] {
        let reqs = requests(&sampling, max_tokens);
        let solo = alone(&mixed, &reqs);
        let got = staggered(&mixed, &reqs);
        let want = staggered(&unmixed, &reqs);
        for (i, ((g, w), s)) in got.iter().zip(&want).zip(&solo).enumerate() {
            let t = sampling.temperature;
            assert_eq!(
                g, w,
                "{}: request {i} mixed != unmixed (t {t})",
                mixed.model_name
            );
            assert_eq!(
                g, s,
                "{}: request {i} mixed != alone (t {t})",
                mixed.model_name
            );
        }
    }
    let (m, u) = (mixed.engine.stats(), unmixed.engine.stats());
    assert!(m.decode_steps > 0 && u.decode_steps > 0);
    for started in [&mixed, &unmixed] {
        assert_eq!(
            started.engine.slots().kv_blocks_used(),
            0,
            "every block freed"
        );
    }
}

#[test]
fn mixed_prefill_keeps_outputs_tiny_random() {
    check_mixed(
        || ModelParts::random(tiny_config(), 7, WeightDtype::F32, "tiny"),
        24,
    );
}

#[test]
fn mixed_prefill_keeps_outputs_default_model() {
    let Some(path) = sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| cached_default_model(&d.cache))
    else {
        eprintln!("SKIP: SmolLM2-135M is not in sov's cache (run `sov generate --chat hi` once)");
        return;
    };
    let parts = || -> ModelParts {
        load_model(&path, false)
            .expect("the cached default model loads")
            .into()
    };
    check_mixed(parts, 12);
}
