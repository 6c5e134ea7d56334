//! SmolLM2-135M-Instruct, the default model, on the CPU: chat questions answered as one
//! continuous batch. The model is fetched into sov's cache on first use.
//!
//! `cargo run --release -p sov-examples --bin smollm2_135m [QUESTION ...]`

use sov::app::start::{EngineOptions, ModelParts};
use sov::engine::{Prompt, Request, SamplingParams};
use sov::loader::{ChatMessage, load_model, resolve_model};

fn main() -> anyhow::Result<()> {
    let mut questions: Vec<String> = std::env::args().skip(1).collect();
    if questions.is_empty() {
        questions = vec![
            "What is the capital of France?".into(),
            "Name three primary colors.".into(),
            "Write a haiku about the sea.".into(),
            "What is 12 times 12?".into(),
        ];
    }
    let dirs = sov::app::SovDirs::from_process_env()?;
    let path = resolve_model(None, &dirs.cache)?;
    let parts = ModelParts::from(load_model(&path, true)?);
    let started = sov_examples::start(parts, &EngineOptions::default())?;
    let template = started
        .chat_template
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the model has no chat template"))?;
    let requests = questions
        .iter()
        .map(|q| {
            let prompt = template.apply(&[ChatMessage::new("user", q.as_str())], true)?;
            Ok(Request {
                sampling: SamplingParams::greedy(),
                ..Request::new(Prompt::Text(prompt), 128)
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    sov_examples::run_batch(&started, requests, true)?;
    Ok(())
}
