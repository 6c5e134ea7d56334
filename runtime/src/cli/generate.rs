//! `sov generate`: run one or more prompts (plain or chat-formatted) and stream the text as it is
//! generated; `--json` prints one JSON object per request instead.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use super::model_args::ModelArgs;
use crate::engine::{Finished, Prompt, Request, SamplingParams};
use crate::loader::ChatMessage;

/// Arguments of `sov generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A plain completion prompt (repeat for several requests run together).
    #[arg(long, required_unless_present = "chat", conflicts_with = "chat")]
    pub prompt: Vec<String>,
    /// A user message, formatted with the model's chat template (repeatable).
    #[arg(long)]
    pub chat: Vec<String>,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 = disabled.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Seed of the sampler (request i uses seed + i).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop string (repeatable); not included in the output.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object per request instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Write the scheduler's transition trace to this file (JSON lines).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

fn finished_json(f: &Finished) -> serde_json::Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "tokens": f.output_tokens,
        "text": f.text,
        "finish_reason": f.reason.as_openai(),
        "finish_detail": format!("{:?}", f.reason),
        "ttft_ms": f.time_to_first_token.map(|d| d.as_secs_f64() * 1e3),
        "preemptions": f.preemptions,
    })
}

/// Runs `sov generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let started = args.model.start(args.trace.is_some())?;
    let engine = &started.engine;
    let prompts: Vec<String> = if args.chat.is_empty() {
        args.prompt.clone()
    } else {
        let template = started
            .chat_template
            .as_ref()
            .context("--chat: the model has no chat template; use --prompt")?;
        args.chat
            .iter()
            .map(|c| {
                let mut messages = Vec::new();
                if let Some(s) = &args.system {
                    messages.push(ChatMessage::new("system", s.as_str()));
                }
                messages.push(ChatMessage::new("user", c.as_str()));
                template.apply(&messages, true)
            })
            .collect::<Result<_, _>>()?
    };
    let mut receivers = Vec::new();
    for (i, p) in prompts.into_iter().enumerate() {
        let request = Request {
            prompt: Prompt::Text(p),
            max_tokens: args.max_tokens,
            sampling: SamplingParams {
                temperature: args.temperature,
                top_k: args.top_k,
                top_p: args.top_p,
                min_p: args.min_p,
                repetition_penalty: args.repetition_penalty,
                frequency_penalty: args.frequency_penalty,
                presence_penalty: args.presence_penalty,
                seed: args.seed.map(|s| s.wrapping_add(i as u64)),
                logprobs: None,
            },
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
        };
        receivers.push(engine.submit(request)?);
    }
    let stream = receivers.len() == 1 && !args.json;
    let mut stdout = std::io::stdout().lock();
    let mut all_ok = true;
    for rx in &receivers {
        let finished = loop {
            let out = rx
                .recv()
                .context("the engine stopped before the request finished")?;
            if stream && !out.text.is_empty() {
                stdout.write_all(out.text.as_bytes())?;
                stdout.flush()?;
            }
            if let Some(f) = out.finished {
                break f;
            }
        };
        if let crate::engine::FinishReason::Error(e) = &finished.reason {
            eprintln!("sov: request failed: {e}");
            all_ok = false;
        }
        if args.json {
            writeln!(stdout, "{}", finished_json(&finished))?;
        } else if stream {
            writeln!(stdout)?;
        } else {
            writeln!(stdout, "{}\n---", finished.text)?;
        }
        let decode_s: f64 = finished
            .inter_token_latencies
            .iter()
            .map(|d| d.as_secs_f64())
            .sum();
        let n = finished.output_tokens.len();
        eprintln!(
            "sov: {} prompt + {} generated tokens, finish: {}; TTFT {:.0} ms; decode {:.1} tok/s",
            finished.prompt_tokens,
            n,
            finished.reason.as_openai(),
            finished
                .time_to_first_token
                .map(|d| d.as_secs_f64() * 1e3)
                .unwrap_or(0.0),
            if decode_s > 0.0 {
                (n.saturating_sub(1)) as f64 / decode_s
            } else {
                0.0
            }
        );
    }
    if let Some(path) = &args.trace {
        let mut f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        for e in engine.trace() {
            let line = json!({
                "step": e.step, "from": e.from, "to": e.to, "cause": e.cause,
                "actions": e.actions, "updates": e.updates, "notes": e.notes,
            });
            writeln!(f, "{line}")?;
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
