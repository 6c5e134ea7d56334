//! `sov generate`: run one or more prompts (plain or chat-formatted) and stream the text as it is
//! generated; `--json` prints one JSON object per request instead. Checkpoints (blocks mode) are on
//! by default; SIGINT/SIGTERM checkpoint and exit 0 (a second signal exits at once), and
//! `--resume RUN_DIR` continues every request of an interrupted or killed run and prints all of
//! them, in request order, as an uninterrupted run would have.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use std::sync::mpsc::Receiver;

use super::model_args::{ModelArgs, StartExtras};
use super::sampling_args::FilterArgs;
use crate::app::SovDirs;
use crate::app::start::Started;
use crate::checkpoint::{FinishedRecord, ResponseReceipt};
use crate::engine::checkpointing::ResumedRequest;
use crate::engine::{Finished, Output, Prompt, Request, SamplingParams};
use crate::loader::ChatMessage;

/// Arguments of `sov generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Which model to load and how.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A plain completion prompt (repeat for several requests run together).
    #[arg(long, required_unless_present_any = ["chat", "resume"], conflicts_with = "chat")]
    pub prompt: Vec<String>,
    /// A user message, formatted with the model's chat template (repeatable).
    #[arg(long)]
    pub chat: Vec<String>,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate per request.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-p, top-k and min-p.
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Divide positive logits of tokens in the prompt or output by this, multiply negative ones
    /// (1 = disabled).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtract this per earlier occurrence of a token in the output (0 = disabled).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Subtract this once from every token already in the output (0 = disabled).
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
    /// Continue the run in this run directory from its newest valid checkpoint (same model and
    /// machine); prompts come from its journal.
    #[arg(long, conflicts_with_all = ["prompt", "chat"])]
    pub resume: Option<PathBuf>,
    /// Witnesses cosigning the run's signed heads.
    #[command(flatten)]
    pub witnesses: super::witness_flags::WitnessFlags,
}

/// Where one request's result comes from.
enum Pending {
    /// Still generating in this engine.
    Live(Receiver<Output>),
    /// Delivered before an interruption (resume only).
    Journaled(FinishedRecord),
}

fn finished_json(id: u64, f: &Finished, receipt: Option<ResponseReceipt>) -> serde_json::Value {
    json!({
        "request_id": id,
        "prompt_tokens": f.prompt_tokens,
        "tokens": f.output_tokens,
        "text": f.text,
        "finish_reason": f.reason.as_openai(),
        "finish_detail": format!("{:?}", f.reason),
        "ttft_ms": f.time_to_first_token.map(|d| d.as_secs_f64() * 1e3),
        "preemptions": f.preemptions,
        "receipt": receipt,
    })
}

fn journaled_json(f: &FinishedRecord, receipt: Option<ResponseReceipt>) -> serde_json::Value {
    json!({
        "request_id": f.request_id,
        "tokens": f.output,
        "text": f.text,
        "finish_reason": f.reason,
        "finish_detail": f.detail,
        "resumed": "finished before the interruption",
        "receipt": receipt,
    })
}

/// Runs `sov generate`.
pub fn run(args: GenerateArgs, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    let shutdown = super::settings::shutdown_flag()?;
    let started = args.model.start_with(
        dirs,
        StartExtras {
            trace: args.trace.is_some(),
            resume: args.resume.clone(),
            shutdown: Some(shutdown.clone()),
            checkpoint_by_default: true,
            ephemeral: false,
            witnesses: args.witnesses.config()?,
            deterministic_order: crate::app::run_platform::resume_order(args.resume.as_deref())?,
            kv_e4m3: crate::app::run_platform::resume_kv_e4m3(args.resume.as_deref())?,
        },
    )?;
    let engine = &started.engine;
    let mut pending: Vec<Pending> = Vec::new();
    if args.resume.is_some() {
        let book = started
            .checkpoints
            .as_ref()
            .context("--resume needs checkpoints")?
            .book
            .clone();
        let mut book = book
            .lock()
            .map_err(|_| anyhow::anyhow!("resume book lock poisoned"))?;
        eprintln!(
            "sov: resumed {} requests from checkpoint height {} in {:.0} ms ({} finished before the interruption)",
            book.requests.len(),
            book.height,
            book.restore_time.as_secs_f64() * 1e3,
            book.requests
                .values()
                .filter(|r| matches!(r, ResumedRequest::Finished { .. }))
                .count()
        );
        for r in std::mem::take(&mut book.requests).into_values() {
            pending.push(match r {
                ResumedRequest::Live { rx, .. } => Pending::Live(rx),
                ResumedRequest::Finished { record, .. } => Pending::Journaled(record),
            });
        }
    }
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
    let mut requests = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.into_iter().enumerate() {
        requests.push(Request {
            prompt: Prompt::Text(p),
            max_tokens: args.max_tokens,
            sampling: SamplingParams {
                temperature: args.temperature,
                top_k: args.filters.top_k,
                top_p: args.filters.top_p,
                min_p: args.filters.min_p,
                repetition_penalty: args.repetition_penalty,
                frequency_penalty: args.frequency_penalty,
                presence_penalty: args.presence_penalty,
                seed: args.seed.map(|s| s.wrapping_add(i as u64)),
                ..SamplingParams::default()
            },
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            tag: Vec::new(),
            grammar: None,
        });
    }
    // Together: one journal write, and the engine sees them all in its first step.
    pending.extend(
        engine
            .submit_many(requests)?
            .into_iter()
            .map(|s| Pending::Live(s.rx)),
    );
    if let Some(c) = &started.checkpoints
        && args.resume.is_none()
    {
        eprintln!(
            "sov: accepted {} request{}; resume with --resume {}",
            pending.len(),
            if pending.len() == 1 { "" } else { "s" },
            c.dir.parent().unwrap_or(&c.dir).display()
        );
    }
    let stream = pending.len() == 1 && args.resume.is_none() && !args.json;
    // Each finished request's receipt (`sov verify --response` checks it offline).
    let receipts = started.checkpoints.as_ref().map(|c| c.book.clone());
    let witnesses = started
        .checkpoints
        .as_ref()
        .and_then(|c| c.witnesses.clone());
    let take_receipt = |id: u64| -> Option<ResponseReceipt> {
        let r = receipts.as_ref()?.lock().ok()?.receipts.remove(&id)?;
        // With witnesses: against the newest head a quorum cosigned, its cosignatures attached.
        Some(match &witnesses {
            Some(w) => w.cosigned(r),
            None => r,
        })
    };
    let mut stdout = std::io::stdout().lock();
    let mut all_ok = true;
    for source in pending {
        let rx = match source {
            Pending::Journaled(f) => {
                if args.json {
                    writeln!(stdout, "{}", journaled_json(&f, take_receipt(f.request_id)))?;
                } else {
                    writeln!(stdout, "{}\n---", f.text)?;
                }
                eprintln!(
                    "sov: request {}: {} tokens, finish: {} (before the interruption)",
                    f.request_id,
                    f.output.len(),
                    f.reason
                );
                continue;
            }
            Pending::Live(rx) => rx,
        };
        let (id, finished) = loop {
            let Ok(out) = rx.recv() else {
                if engine.interrupted() {
                    return interrupted(&started, &mut stdout);
                }
                anyhow::bail!("the engine stopped before the request finished");
            };
            if stream && !out.text.is_empty() {
                stdout.write_all(out.text.as_bytes())?;
                stdout.flush()?;
            }
            if let Some(f) = out.finished {
                break (out.request_id, f);
            }
        };
        if let crate::engine::FinishReason::Error(e) = &finished.reason {
            eprintln!("sov: request failed: {e}");
            all_ok = false;
        }
        if args.json {
            writeln!(stdout, "{}", finished_json(id, &finished, take_receipt(id)))?;
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
    drop(stdout);
    drop(started);
    if let Some(w) = witnesses {
        let wait = w.quorum_wait();
        if w.finish(wait) {
            eprintln!(
                "sov: witnesses: the newest head (log size {}) is cosigned by the quorum",
                w.quorate_size()
            );
        } else {
            eprintln!(
                "sov: warning: witnesses: no quorum on the newest head within {wait:?} (newest cosigned log size {})",
                w.quorate_size()
            );
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The engine checkpointed and stopped on SIGINT/SIGTERM: say where to resume; exit 0.
fn interrupted(started: &Started, stdout: &mut impl Write) -> anyhow::Result<ExitCode> {
    stdout.flush()?;
    match &started.checkpoints {
        Some(c) => {
            let run_dir = c.dir.parent().unwrap_or(&c.dir);
            eprintln!(
                "\nsov: interrupted: checkpoint height {} in {}; continue with `sov generate --resume {}` and the same model options",
                started.engine.slots().bft_quorum_height(),
                c.dir.display(),
                run_dir.display()
            );
        }
        None => eprintln!("\nsov: interrupted (checkpoints were off: nothing to resume)"),
    }
    Ok(ExitCode::SUCCESS)
}
