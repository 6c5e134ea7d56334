//! Options shared by the commands that run a model (`generate`, `bench`): which model, which
//! device, which machine spec, how much KV cache; and starting an engine from them.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use crate::engine::random_model::{WeightDtype, llama3_8b_config, tiny_config};
use crate::engine::setup::{Device, EngineOptions, ModelParts, Started, start_engine};
use crate::loader::{load_model, resolve_model};
use crate::scheduler::{laptop, seed};

/// Which generated machine drives the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MachineChoice {
    /// specs/scheduler.toml: the seed scheduler with continuous batching (default).
    Seed,
    /// specs/laptop.toml: checkpoints every 16 steps, preemption by recomputation.
    Laptop,
}

/// Model and engine options.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file, a Hugging Face folder, or a known name (default: smollm2-135m, fetched into
    /// sov's cache on first use); `random:tiny` or `random:llama3-8b` for random bf16 weights of
    /// that shape (no download; text is raw bytes).
    #[arg(long)]
    pub model: Option<String>,
    /// cpu, cuda or cuda:N (default: cuda when a usable CUDA device is found, else cpu).
    #[arg(long)]
    pub device: Option<Device>,
    /// Scheduler machine (a spec compiled into this binary).
    #[arg(long, value_enum, default_value_t = MachineChoice::Seed)]
    pub machine: MachineChoice,
    /// KV cache budget in MiB.
    #[arg(long, default_value_t = 1024)]
    pub kv_memory_mb: usize,
    /// Most sequences in the running batch.
    #[arg(long, default_value_t = 256)]
    pub max_batch: usize,
    /// Most prompt tokens per prefill forward pass.
    #[arg(long, default_value_t = 2048)]
    pub max_prefill_tokens: usize,
    /// Cap on the context length (default: the model's).
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Run directory for the slot file (default: a fresh one under sov's state directory).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
}

impl ModelArgs {
    /// The device asked for, or CUDA device 0 when one is usable (driver, NVRTC and cuBLAS
    /// libraries present and a device found), else the CPU.
    pub fn device(&self) -> Device {
        self.device.unwrap_or_else(|| {
            if crate::backend::cuda::probe(0).is_ok() {
                Device::Cuda(0)
            } else {
                Device::Cpu
            }
        })
    }

    /// Resolves and loads the model, then starts the engine; progress goes to stderr.
    pub fn start(&self, trace: bool) -> anyhow::Result<Started> {
        let t0 = Instant::now();
        let parts: ModelParts = match self
            .model
            .as_deref()
            .and_then(|m| m.strip_prefix("random:"))
        {
            Some(shape) => {
                let config = match shape {
                    "tiny" => tiny_config(),
                    "llama3-8b" => llama3_8b_config(),
                    other => {
                        anyhow::bail!("unknown random shape `{other}` (expected tiny or llama3-8b)")
                    }
                };
                ModelParts::random(config, 0, WeightDtype::BF16, &format!("random {shape}"))
            }
            None => {
                let path = resolve_model(self.model.as_deref())?;
                load_model(&path, true)
                    .with_context(|| format!("loading {}", path.display()))?
                    .into()
            }
        };
        let run_dir = match &self.run_dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                d.clone()
            }
            None => crate::engine::run_dir::create_run_dir()?,
        };
        let device = self.device();
        let opts = EngineOptions {
            device,
            kv_memory_bytes: self.kv_memory_mb << 20,
            max_batch: self.max_batch,
            max_prefill_tokens: self.max_prefill_tokens,
            max_context: self.max_context,
            trace,
            run_dir: Some(run_dir.clone()),
        };
        let started = match self.machine {
            MachineChoice::Seed => start_engine::<seed::Scheduler>(parts, &opts)?,
            MachineChoice::Laptop => start_engine::<laptop::Scheduler>(parts, &opts)?,
        };
        eprintln!(
            "sov: {} on {:?} loaded in {:.1}s; KV cache {} MiB; slots: {}",
            started.model_name,
            device,
            t0.elapsed().as_secs_f64(),
            self.kv_memory_mb,
            run_dir.join("slots").display()
        );
        Ok(started)
    }
}
