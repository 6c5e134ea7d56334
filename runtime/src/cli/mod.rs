//! Command-line subcommands of the `sov` binary (clap). `main.rs` only calls [`main_entry`].
//!
//! - `generate`: run prompts, stream text ([`generate`])
//! - `serve`: the OpenAI-compatible HTTP server ([`serve`])
//! - `bench`: offline serving benchmark ([`mod@bench`])
//! - `slots get|set`: the live control surface of a running engine ([`slots`])
//! - `spec check|graph`: the spec compiler without building ([`spec`])
//! - `keygen`, `verify`: checkpoint receipt keys and chain verification ([`keygen`], [`verify`])
//! - `audit`: re-execute a run's finished requests and compare ([`audit`])
//! - `runs list|prune`: the run directories in sov's state directory ([`runs`])
//! - `witness`: a C2SP tlog-witness cosigning logs' tree heads ([`witness`])

pub mod audit;
pub mod bench;
pub mod bench_args;
pub mod bench_serve;
pub mod bench_stats;
pub mod generate;
pub mod keygen;
pub mod kv_memory_arg;
pub mod model_args;
pub mod perplexity;
pub mod precision_args;
pub mod runs;
pub mod sampling_args;
pub mod serve;
pub mod settings;
pub mod slots;
pub mod spec;
pub mod verify;
pub mod witness;
pub mod witness_flags;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// sov: serve Llama-family models with a spec-generated continuous-batching scheduler.
#[derive(Parser, Debug)]
#[command(name = "sov", version, about)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
    /// Options every command takes.
    #[command(flatten)]
    pub global: settings::GlobalArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text for one or more prompts, streaming it as it is produced.
    Generate(generate::GenerateArgs),
    /// Serve an OpenAI-compatible HTTP API whose requests survive restarts.
    Serve(serve::ServeArgs),
    /// Benchmark serving throughput and latency (vLLM `bench serve` conventions).
    Bench(bench_args::BenchArgs),
    /// Read or steer a running engine through its slot file.
    #[command(subcommand)]
    Slots(slots::SlotsCommand),
    /// Check a scheduler spec or print its state graph.
    #[command(subcommand)]
    Spec(spec::SpecCommand),
    /// Create the Ed25519 key that signs checkpoint receipts.
    Keygen(keygen::KeygenArgs),
    /// Verify a run's signed log, receipts and checkpoints, or responses' receipts offline.
    Verify(verify::VerifyArgs),
    /// Re-execute every finished request of a run and compare it token for token.
    Audit(audit::AuditArgs),
    /// Score a text file: the model's perplexity, to compare precisions and quantizations.
    Perplexity(perplexity::PerplexityArgs),
    /// List or prune the run directories in sov's state directory.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Run a C2SP tlog-witness: cosign logs' tree heads that extend what it saw before.
    Witness(witness::WitnessArgs),
}

/// Parses the command line, runs the command, reports errors on stderr.
pub fn main_entry() -> ExitCode {
    let cli = Cli::parse();
    let result = cli.global.init_logging().and_then(|()| run(cli));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sov: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Generate(a) => generate::run(a, &cli.global.dirs()?),
        Command::Serve(a) => serve::run(a, &cli.global.dirs()?),
        Command::Bench(a) => bench::run(a, &cli.global.dirs()?),
        Command::Slots(c) => slots::run(c, &cli.global.dirs()?),
        Command::Spec(c) => spec::run(c),
        Command::Keygen(a) => keygen::run(a, &cli.global.dirs()?),
        Command::Verify(a) => verify::run(a),
        Command::Audit(a) => audit::run(a, &cli.global.dirs()?),
        Command::Perplexity(a) => perplexity::run(a, &cli.global.dirs()?),
        Command::Runs(c) => runs::run(c, &cli.global.dirs()?),
        Command::Witness(a) => witness::run(a),
    }
}
