//! The arguments of `sov bench`: the workload (requests, lengths, concurrency, sampling), where
//! the result goes (`--json`), and the options only the online mode (`--url`) reads.
//!
//! Design: one clap struct both modes read, in a file of its own so the offline benchmark
//! (`bench`) and the online one (`bench_serve`) each import it and neither imports the other's
//! arguments.

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use super::bench_serve::arrivals::RequestRate;
use super::bench_serve::report::Slo;
use super::bench_serve::workload::PromptFormat;
use super::model_args::ModelArgs;
use super::sampling_args::FilterArgs;
use crate::engine::SamplingParams;

/// Arguments of `sov bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Which model to load and how.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Number of requests.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Every prompt starts with the same N random tokens (a shared system prompt) before its own
    /// `--input-len` ones (vLLM's `--random-prefix-len`); the prefix cache prefills it once.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub shared_prefix_tokens: usize,
    /// Lengths vary uniformly in [len * (1 - r), len * (1 + r)] (vLLM's random dataset).
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Most requests in flight (default: all at once).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Generate exactly the output length, ignoring end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-p, top-k and min-p.
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Seed of the prompt generator and the samplers.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the result as one JSON object to FILE, or with no FILE print it instead of the report.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Run the benchmark once per listed batch size B (B requests, concurrency B) on one loaded
    /// model, e.g. `--sweep 1,16,64,256`; overrides --num-prompts and --concurrency.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Vec<usize>,
    /// The online mode's options (`--url` and what only it reads).
    #[command(flatten)]
    pub online: OnlineArgs,
}

impl BenchArgs {
    /// The sampling settings of the `i`-th request: the options, seeded with `--seed` + `i`.
    pub fn sampling(&self, i: usize) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.filters.top_p,
            top_k: self.filters.top_k,
            min_p: self.filters.min_p,
            seed: Some(self.seed.wrapping_add(i as u64)),
            ..SamplingParams::default()
        }
    }

    /// Whether `--json` was given without a file: the JSON replaces the printed report.
    pub fn json_to_stdout(&self) -> bool {
        self.json.as_deref() == Some(std::path::Path::new("-"))
    }

    /// Writes `value` as `--json` asks: one line on stdout, or to the named file.
    pub fn write_json(&self, value: &impl Serialize) -> anyhow::Result<()> {
        match &self.json {
            None => Ok(()),
            Some(_) if self.json_to_stdout() => {
                println!("{}", serde_json::to_string(value)?);
                Ok(())
            }
            Some(path) => std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
                .with_context(|| format!("writing {}", path.display())),
        }
    }
}

/// Options of `sov bench` that only the online mode (`--url`) reads.
#[derive(clap::Args, Debug, Clone)]
pub struct OnlineArgs {
    /// Benchmark the OpenAI-compatible server at this base URL (e.g. http://127.0.0.1:8000)
    /// instead of loading a model; `--model` is then the model name sent (default: the first of
    /// the server's `/v1/models`).
    #[arg(long)]
    pub url: Option<String>,
    /// Endpoint under the URL: /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Mean requests per second (Gamma-distributed gaps), or `inf` to send all at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: RequestRate,
    /// Gamma shape of the arrival gaps: 1 = Poisson, lower = burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// API key, sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Service-level objectives for goodput, e.g. `--goodput ttft:500 tpot:50` (ms; ttft, tpot,
    /// e2el).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<Slo>,
    /// Tokenizer the prompts are drawn from: a tokenizer.json, a Hugging Face folder or a .gguf
    /// (default: the default model's, from sov's cache).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Send prompts as token ids or as text (default: ids for completions, text for chat).
    #[arg(long, value_enum)]
    pub prompt_format: Option<PromptFormat>,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::BenchArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn sampling(args: &[&str]) -> Result<(), String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.bench.sampling(3).validate().map_err(|e| e.to_string())
    }

    #[test]
    fn sampling_options_are_checked_before_any_request() {
        assert_eq!(sampling(&[]), Ok(()));
        assert_eq!(
            sampling(&["--temperature", "0.8", "--top-p", "0.9", "--top-k", "40"]),
            Ok(())
        );
        for bad in [
            ["--top-p", "1.5"],
            ["--top-p", "nan"],
            ["--min-p", "2"],
            ["--temperature=-1", "--seed=0"],
        ] {
            let err = sampling(&bad).expect_err("a bad option passed");
            assert!(err.contains("invalid sampling parameter"), "{bad:?}: {err}");
        }
        let cli = Cli::try_parse_from(["bench", "--seed", "10", "--top-k", "5"]).expect("parses");
        let s = cli.bench.sampling(3);
        assert_eq!((s.seed, s.top_k), (Some(13), 5));
    }
}
