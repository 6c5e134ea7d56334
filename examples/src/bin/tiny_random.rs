//! A tiny random-weight Llama (2 layers, hidden 64, vocab 512): continuous batching end to end
//! with no download. Text is raw bytes (no tokenizer), so the output is noise by design; what it
//! shows is the engine: 8 requests of different lengths batched, sampled, streamed and finished.
//!
//! `cargo run --release -p sov-examples --bin tiny_random`

use sov::app::start::{EngineOptions, KvBudget, ModelParts};
use sov::engine::{Prompt, Request, SamplingParams};
use sov::model::random::{WeightDtype, tiny_config};

fn main() -> anyhow::Result<()> {
    let parts = ModelParts::random(tiny_config(), 42, WeightDtype::F32, "tiny-random");
    let started = sov_examples::start(
        parts,
        &EngineOptions {
            kv_budget: KvBudget::Bytes(16 << 20),
            ..EngineOptions::default()
        },
    )?;
    let requests = (0..8)
        .map(|i| Request {
            sampling: SamplingParams {
                temperature: 0.8,
                seed: Some(i),
                ..SamplingParams::default()
            },
            ..Request::new(
                Prompt::Text(format!("request number {i}: {}", "abc ".repeat(i as usize))),
                16 + 8 * i as usize,
            )
        })
        .collect();
    sov_examples::run_batch(&started, requests, true)?;
    Ok(())
}
