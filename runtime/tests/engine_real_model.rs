//! Engine tests on the real forward pass (CPU backend): batch invariance (8 different prompts run
//! together give exactly what each gives alone, greedy and seeded sampling), preemption under KV
//! pressure, and speculative decoding leaving outputs unchanged. Each runs on a tiny random-weight
//! Llama (always) and on the default model SmolLM2-135M when it is in sov's cache (otherwise the
//! test says why it skipped).

mod common;

use common::engine_stream::wait;
use sov::app::start::{EngineOptions, KvBudget, ModelParts, Started, start_engine};
use sov::engine::{FinishReason, Finished, Prompt, Request, SamplingParams};
use sov::loader::{cached_default_model, load_model};
use sov::model::random::{WeightDtype, tiny_config};
use sov::scheduler::seed::Scheduler;

fn tiny() -> ModelParts {
    ModelParts::random(tiny_config(), 7, WeightDtype::F32, "tiny")
}

fn default_model() -> Option<ModelParts> {
    match sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| cached_default_model(&d.cache))
    {
        Some(path) => Some(
            load_model(&path, false)
                .expect("the cached default model loads")
                .into(),
        ),
        None => {
            eprintln!(
                "SKIP default-model part: SmolLM2-135M is not in sov's cache (run `sov generate --chat hi` once)"
            );
            None
        }
    }
}

fn start(parts: ModelParts, kv_bytes: usize) -> Started {
    start_engine::<Scheduler>(
        parts,
        &EngineOptions {
            kv_budget: KvBudget::Bytes(kv_bytes),
            ..EngineOptions::default()
        },
    )
    .expect("engine starts")
}

/// 8 prompts of different lengths (token ids below 256 are valid in every vocabulary here).
fn requests(sampling: &SamplingParams, max_tokens: usize) -> Vec<Request> {
    (0..8)
        .map(|i| {
            let prompt: Vec<u32> = (0..(6 + 11 * i))
                .map(|j| ((i * 37 + j * 13) % 200) as u32 + 30)
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

fn alone(started: &Started, reqs: &[Request]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| wait(&started.engine.submit(r.clone()).unwrap().rx).output_tokens)
        .collect()
}

fn together(started: &Started, reqs: &[Request]) -> Vec<Finished> {
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| started.engine.submit(r.clone()).unwrap().rx)
        .collect();
    rxs.iter().map(wait).collect()
}

fn check_batch_invariance(parts: ModelParts, max_tokens: usize) {
    let started = start(parts, 64 << 20);
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(11),
            ..SamplingParams::default()
        },
    ] {
        let reqs = requests(&sampling, max_tokens);
        let solo = alone(&started, &reqs);
        let batch = together(&started, &reqs);
        for (i, (s, b)) in solo.iter().zip(&batch).enumerate() {
            assert_eq!(b.reason, FinishReason::Length);
            assert_eq!(
                &b.output_tokens, s,
                "{}: request {i} differs in a batch (temperature {})",
                started.model_name, sampling.temperature
            );
        }
    }
    assert_eq!(
        started.engine.slots().kv_blocks_used(),
        0,
        "every block freed"
    );
}

#[test]
fn batch_invariance_tiny_random() {
    check_batch_invariance(tiny(), 24);
}

#[test]
fn batch_invariance_default_model() {
    if let Some(parts) = default_model() {
        check_batch_invariance(parts, 12);
    }
}

fn check_preemption(parts: ModelParts, kv_bytes: usize) {
    let reqs = requests(
        &SamplingParams {
            temperature: 0.7,
            seed: Some(3),
            ..SamplingParams::default()
        },
        40,
    );
    let roomy = start(parts, 64 << 20);
    let solo = alone(&roomy, &reqs);
    drop(roomy);
    let parts = tiny();
    let tight = start(parts, kv_bytes);
    let batch = together(&tight, &reqs);
    let preemptions: u32 = batch.iter().map(|f| f.preemptions).sum();
    for (i, (s, b)) in solo.iter().zip(&batch).enumerate() {
        assert_eq!(&b.output_tokens, s, "request {i} differs after preemption");
    }
    assert!(
        preemptions > 0,
        "the cache was meant to be too small for all 8 at once"
    );
}

#[test]
fn preemption_by_recomputation_keeps_outputs_tiny_random() {
    // Tiny model: 2 layers x 2 kv heads x 16 dims x K,V x f32 = 512 bytes per token; 24 blocks of
    // 16 tokens hold 384 tokens, less than the 8 requests need together (~730).
    check_preemption(tiny(), 24 * 16 * 512);
}

fn check_speculation(parts: ModelParts) {
    let started = start(parts, 64 << 20);
    // Repetitive prompts so the n-gram drafter finds matches.
    let reqs: Vec<Request> = (0..4)
        .map(|i| {
            let prompt: Vec<u32> = (0..48).map(|j| ((j % (5 + i)) * 17 + 40) as u32).collect();
            Request {
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                ..Request::new(Prompt::Tokens(prompt), 32)
            }
        })
        .collect();
    let plain = together(&started, &reqs);
    started.engine.slots().set_speculative_draft_len(4);
    let spec = together(&started, &reqs);
    for (i, (p, s)) in plain.iter().zip(&spec).enumerate() {
        assert_eq!(
            p.output_tokens, s.output_tokens,
            "{}: request {i} changed under speculation",
            started.model_name
        );
    }
}

#[test]
fn speculative_decoding_keeps_greedy_outputs_tiny_random() {
    check_speculation(tiny());
}

#[test]
fn speculative_decoding_keeps_greedy_outputs_default_model() {
    if let Some(parts) = default_model() {
        check_speculation(parts);
    }
}
