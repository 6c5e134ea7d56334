//! `sov perplexity --text FILE`: the model's perplexity over a text file, to compare precisions
//! and quantizations of one model on one text (`--quantization fp8` against bf16 on a GPU, a Q4
//! GGUF against its F16). The text is tokenized as a prompt is, cut into windows of `--window`
//! tokens, and each window scored on its own (`app::perplexity`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;

use super::model_args::ModelArgs;
use crate::app::SovDirs;
use crate::app::perplexity::perplexity;
use crate::app::start::Device;

/// Arguments of `sov perplexity`.
#[derive(clap::Args, Debug, Clone)]
pub struct PerplexityArgs {
    /// Which model to load and how (the engine's options other than device, precision,
    /// quantization and `--deterministic` do not apply).
    #[command(flatten)]
    pub model: ModelArgs,
    /// UTF-8 text file to score.
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per window: each window runs from position 0, and its tokens after the first are
    /// scored.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Also write the text's token ids to this file (a JSON array), for scoring the same tokens
    /// elsewhere (`runtime/bench/fp8_sensitivity.py`).
    #[arg(long, value_name = "FILE")]
    pub token_ids: Option<PathBuf>,
}

/// Run `sov perplexity`.
pub fn run(args: PerplexityArgs, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.model.tensor_parallel <= 1,
        "sov perplexity runs on one rank (drop --tensor-parallel)"
    );
    anyhow::ensure!(
        args.window >= 2,
        "--window {} scores nothing: a window needs at least 2 tokens",
        args.window
    );
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    let t0 = Instant::now();
    let parts = args.model.load_parts(dirs)?;
    let (device, precise, tuning) = args.model.backend_choice(&parts)?;
    let tokens = parts
        .codec
        .encode(&text)
        .map_err(|e| anyhow::anyhow!("tokenizing {}: {e}", args.text.display()))?;
    if let Some(path) = &args.token_ids {
        let json = serde_json::to_string(&tokens)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    let name = parts.name.clone();
    let p = perplexity(parts, device, precise, &tuning, &tokens, args.window)?;
    // The products' precision as receipts name it, on a GPU; the CPU's follows the weights.
    let on = match device {
        Device::Cpu => "the CPU".to_string(),
        Device::Cuda(n) => format!("cuda:{n}, {}", tuning.precision_name(precise)),
    };
    println!(
        "{name} on {on}: perplexity {:.4} over {} tokens ({} windows of up to {}; mean NLL \
         {:.6} nats) in {:.1}s",
        p.value(),
        p.scored,
        p.windows,
        args.window,
        p.mean_nll,
        t0.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
