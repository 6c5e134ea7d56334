//! The Llama-3-8B shape: loads a checkpoint (GGUF file or Hugging Face folder) when a path is
//! given, otherwise random bf16 weights of that shape (16 GB) for throughput benchmarks. Runs a
//! batch of 128-token prompts generating 128 tokens each and prints the output throughput.
//!
//! `cargo run --release -p sov-examples --bin llama3_8b -- [PATH] [--device cuda:0] [--batch N]`

use sov::app::start::{Device, EngineOptions, KvBudget, ModelParts};
use sov::engine::{Prompt, Request, SamplingParams};
use sov::loader::load_model;
use sov::model::random::{WeightDtype, llama3_8b_config};

fn main() -> anyhow::Result<()> {
    let mut path = None;
    let mut device = Device::Cpu;
    let mut batch = 16usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => {
                device = args
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .map_err(anyhow::Error::msg)?
            }
            "--batch" => batch = args.next().unwrap_or_default().parse()?,
            _ => path = Some(a),
        }
    }
    let parts = match path {
        Some(p) => ModelParts::from(load_model(std::path::Path::new(&p), true)?),
        None => {
            eprintln!(
                "llama3_8b: no checkpoint given; generating random bf16 weights of the Llama-3-8B shape (16 GB)"
            );
            ModelParts::random(llama3_8b_config(), 0, WeightDtype::BF16, "llama3-8b-random")
        }
    };
    let vocab = parts.config.vocab_size as u32;
    let opts = EngineOptions {
        device,
        kv_budget: KvBudget::Bytes(8 << 30),
        ..EngineOptions::default()
    };
    let started = sov_examples::start(parts, &opts)?;
    let requests = (0..batch)
        .map(|i| {
            let prompt = (0..128)
                .map(|j| ((i * 7919 + j * 104_729) as u32) % vocab)
                .collect();
            Request {
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                ..Request::new(Prompt::Tokens(prompt), 128)
            }
        })
        .collect();
    sov_examples::run_batch(&started, requests, false)?;
    Ok(())
}
