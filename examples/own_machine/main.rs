//! `own_machine`: sov's engine driven by a machine this example defines itself
//! (`examples/own_machine/spec.toml`, the `waves` machine: admission in waves, a checkpoint every
//! 8 decode steps, no speculation). Prints the machine's state graph and digest, serves a few
//! prompts, suspends the engine through the slots, verifies the checkpoint chain and prints the
//! transitions the machine took and the generated text.
//!
//! Model: `--model NAME|PATH` (a known name, a .gguf file or a Hugging Face folder), or
//! `--model random:tiny` (random weights, text is raw bytes). Without `--model`: sov's default model
//! if it is in sov's cache, else `random:tiny`, so the example runs without a download.
//!
//! `cargo run --release -p sov-examples --bin own_machine -- [--model M] [--device cpu|cuda]
//! [--max-tokens N] [PROMPT ...]`

use anyhow::{Context, bail};
use sov::app::SovDirs;
use sov::app::run_dir::create_run_dir;
use sov::app::start::{Device, ModelParts};
use sov::checkpoint::digest::to_hex;
use sov::engine::{Prompt, Request, SamplingParams};
use sov::loader::{ChatMessage, cached_default_model, load_model, resolve_model};
use sov::model::random::{WeightDtype, tiny_config};
use sov_examples::own_machine::{self, RunPlaces, machine};

struct Args {
    model: Option<String>,
    device: Device,
    max_tokens: usize,
    prompts: Vec<String>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        model: None,
        device: Device::Cpu,
        max_tokens: 32,
        prompts: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--model" => args.model = Some(value("--model")?),
            "--device" => {
                args.device = value("--device")?
                    .parse()
                    .map_err(|e: String| anyhow::anyhow!(e))?
            }
            "--max-tokens" => {
                args.max_tokens = value("--max-tokens")?
                    .parse()
                    .context("--max-tokens is not a number")?
            }
            "-h" | "--help" => {
                println!(
                    "usage: own_machine [--model NAME|PATH|random:tiny] [--device cpu|cuda|cuda:N] [--max-tokens N] [PROMPT ...]"
                );
                std::process::exit(0);
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag} (see --help)"),
            _ => args.prompts.push(a),
        }
    }
    if args.prompts.is_empty() {
        args.prompts = [
            "What is the capital of France?",
            "Name three primary colors.",
            "Write a haiku about the sea.",
            "What is 12 times 12?",
        ]
        .map(String::from)
        .to_vec();
    }
    Ok(args)
}

/// The model the run uses: `--model`, else the cached default, else random tiny weights.
fn pick_model(model: Option<&str>, dirs: &SovDirs) -> anyhow::Result<ModelParts> {
    let random = || ModelParts::random(tiny_config(), 7, WeightDtype::F32, "random tiny");
    let path = match model {
        Some("random:tiny") => return Ok(random()),
        Some(m) => resolve_model(Some(m), &dirs.cache)?,
        None => match cached_default_model(&dirs.cache) {
            Some(path) => path,
            None => {
                eprintln!(
                    "the default model is not in {} (fetch it with --model smollm2-135m); using random:tiny",
                    dirs.cache.display()
                );
                return Ok(random());
            }
        },
    };
    Ok(ModelParts::from(load_model(&path, true)?))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    println!(
        "machine `{}`, spec digest {}",
        machine::NAME,
        to_hex(&machine::SPEC_DIGEST)
    );
    println!("{}", machine::MERMAID);

    let dirs = SovDirs::from_process_env()?;
    let parts = pick_model(args.model.as_deref(), &dirs)?;
    // Chat models get their template; a model without one (random weights) gets the raw prompt.
    let requests = args
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let text = match &parts.chat_template {
                Some(t) => t.apply(&[ChatMessage::new("user", p.as_str())], true)?,
                None => p.clone(),
            };
            // Every other request twice as long, so one wave's requests finish at different times.
            let max_tokens = args.max_tokens * (1 + i % 2);
            Ok(Request {
                sampling: SamplingParams::greedy(),
                ..Request::new(Prompt::Text(text), max_tokens)
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    let places = RunPlaces {
        run_dir: create_run_dir(&dirs.state)?,
        config_dir: dirs.config.clone(),
    };
    let opts = own_machine::engine_options(args.device, &places, 2);
    let report = own_machine::run(parts, &opts, requests)?;

    println!(
        "\n{}: {} requests in waves of at most 2",
        report.model_name,
        report.finished.len()
    );
    for (i, (f, prompt)) in report.finished.iter().zip(&args.prompts).enumerate() {
        println!(
            "[{i}] {prompt:?} -> {:?}, {} tokens in {} stream events: {}",
            f.reason,
            f.output_tokens.len(),
            report.events[i],
            f.text.trim()
        );
    }
    let decodes = own_machine::steps_with(&report.trace, "decode").len();
    println!(
        "{} tokens in {:.2}s ({decodes} decode steps, {} checkpoints)",
        report.output_tokens(),
        report.elapsed.as_secs_f64(),
        report.stats.checkpoints
    );

    println!(
        "\ntransitions taken ({} steps that did something):",
        report.trace.len()
    );
    for line in own_machine::transition_counts(&report.trace) {
        println!("  {line}");
    }
    let admits: Vec<String> = own_machine::steps_with(&report.trace, "admit")
        .into_iter()
        .map(|(step, from)| format!("step {step} (from {from})"))
        .collect();
    println!("admitted at: {}", admits.join(", "));
    let visited = report.states_visited();
    let unvisited: Vec<&str> = machine::State::ALL
        .iter()
        .map(|s| s.name())
        .filter(|s| !visited.contains(s))
        .collect();
    println!(
        "states visited: {}; not visited: {}",
        visited.into_iter().collect::<Vec<_>>().join(", "),
        if unvisited.is_empty() {
            "none".into()
        } else {
            unvisited.join(", ")
        }
    );

    let v = &report.verified;
    println!(
        "\nverified {} receipts in {}, head {}",
        v.receipts,
        v.dir.display(),
        v.head
    );
    println!(
        "check it again with: sov verify {} --key {}",
        places.run_dir.display(),
        v.public_key.display()
    );
    Ok(())
}
