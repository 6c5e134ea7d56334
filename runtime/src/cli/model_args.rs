//! Options shared by the commands that run a model (`generate`, `bench`): which model, which
//! device, which machine spec, how much KV cache; and starting an engine from them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::kv_memory_arg::KvMemoryArg;
use crate::app::SovDirs;
use crate::app::battery::{BatteryWatcher, POWER_SUPPLY_DIR};
use crate::app::run_dir::{create_run_dir, remove_scratch_run_dir};
use crate::app::start::{
    CheckpointOptions, Device, EngineOptions, ModelParts, Started, default_kv_mode, start_engine,
};
use crate::backend::cuda::{CudaTuning, retired_vars_set};
use crate::checkpoint::KvMode;
use crate::loader::{load_model, resolve_model};
use crate::model::random::{WeightDtype, llama3_8b_config, tiny_config};
use crate::runner::RunnerOptions;
use crate::scheduler::{Machine, laptop, seed};

/// Prompt tokens per step on the CPU when `--max-prefill-tokens` is not given: with prompts
/// mixed into decode steps, a step's cost (and so the running streams' inter-token latency)
/// grows with it, while 256 rows already keep the CPU's matrix kernels busy.
const CPU_MAX_PREFILL_TOKENS: usize = 256;
/// The same on a GPU, where a step of 2048 rows costs little more than one of 256.
const GPU_MAX_PREFILL_TOKENS: usize = 2048;

/// Which generated machine drives the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MachineChoice {
    /// specs/scheduler.toml: the default machine: continuous batching, speculative decoding (default).
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
    /// GPU arithmetic. `bf16`: matmul inputs and the KV cache in bf16, as bf16 inference does.
    /// `f32`: f32-accurate matmul inputs (each split into two bf16 terms: two products, twice
    /// the weight reads) and an f32 KV cache (half the tokens per MiB); slower, and within float
    /// rounding of the CPU backend, which always computes in f32 and ignores this option.
    #[arg(long, value_enum, default_value_t = PrecisionChoice::Bf16)]
    pub precision: PrecisionChoice,
    /// On CUDA, the linear layers' format. `none`: bf16 weights. `fp8`: W8A8 -- e4m3 weights with
    /// one scale per output channel (quantized at load), inputs quantized per token before each
    /// product, f32 accumulation; the embedding and lm head stay bf16. Needs compute capability
    /// 8.9; not with `--precision f32` or `--deterministic` (FP8 turns the deterministic default
    /// off). Receipts name the precision `fp8-w8a8` (see `--fp8-edge-layers`). An FP8 checkpoint
    /// (compressed-tensors, e.g. the FP8-dynamic Llamas) runs as `fp8` on CUDA whatever this
    /// says, its codes and scales uploaded as they are; the CPU widens them to f32 (weight-only).
    #[arg(long, value_enum, env = "SOV_QUANTIZATION", default_value_t = QuantizationChoice::None)]
    pub quantization: QuantizationChoice,
    /// Under `--quantization fp8`, the layers at each end of the model that keep bf16 products:
    /// 1 (the default) keeps the first and the last, 0 quantizes every layer. On the default
    /// model FP8 everywhere costs 3.6% of perplexity, most of it in those two layers (see
    /// runtime/BENCHMARKS.md). Receipts then name the precision `fp8-w8a8-bf16edges1`. Refused
    /// without `--quantization fp8`, and for an FP8 checkpoint, whose weights stay as it has
    /// them.
    #[arg(long, value_name = "N")]
    pub fp8_edge_layers: Option<usize>,
    /// The KV cache's format. `bf16`, the default (f32 with `--precision f32`, and on the CPU).
    /// `fp8`: on CUDA, e4m3 codes with one f32 scale per token and head, set as each token is
    /// written: 53% of bf16's bytes a token at head_dim 128, so about twice the tokens per MiB
    /// and half the bytes a decode step's attention reads. Needs compute capability 8.9 and
    /// head_dim 64, 128 or 256, and a spec `block_size` that is a multiple of 16 (the cache keeps
    /// slots in groups of 16); not with `--precision f32`. Receipts append `-kvfp8` to the
    /// precision.
    /// Default `bf16`, or for `--resume` and `sov audit` the format the run's heads name.
    #[arg(long, value_enum)]
    pub kv_dtype: Option<KvDtypeChoice>,
    /// On CUDA, batch-invariant kernels: a request's tokens do not depend on the requests batched
    /// with it, and a recompute resume rebuilds the KV bit for bit (see
    /// kernels/docs/deterministic.md). Default: on for a GPU run whose checkpoints are in recompute
    /// mode (generate's and serve's default on a GPU), off otherwise; `--deterministic false` turns
    /// it off.
    #[arg(long, env = "SOV_DETERMINISTIC", value_parser = clap::builder::BoolishValueParser::new(),
          num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub deterministic: Option<bool>,
    /// Scheduler machine (a spec compiled into this binary).
    #[arg(long, value_enum, default_value_t = MachineChoice::Seed)]
    pub machine: MachineChoice,
    /// KV cache budget in MiB, or `auto`: 90% of the GPU memory left free once the model and
    /// its scratch are loaded, less 3 GiB for decode graphs and workspaces (GPUs only).
    #[arg(long, default_value = "1024", value_name = "MIB|auto")]
    pub kv_memory_mb: KvMemoryArg,
    /// Most sequences in the running batch.
    #[arg(long, default_value_t = 256)]
    pub max_batch: usize,
    /// Most prompt tokens per forward pass: per decode step when prompts are mixed into decode
    /// steps (the default machine's default), per prefill pass otherwise; longer prompts run in
    /// chunks. Default: 256 on the CPU (measured: the lowest TTFT and inter-token latency of
    /// 256 and 512 at 16 concurrent 512-token prompts), 2048 on a GPU.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prefill_tokens: Option<u32>,
    /// Run prompts in prefill passes of their own, which stall the running streams, instead of
    /// in chunks inside decode steps (outputs are the same either way; for comparison).
    #[arg(long, conflicts_with = "mixed_prefill")]
    pub no_mixed_prefill: bool,
    /// Mix prompts into decode steps on a GPU too. Default: mixed on the CPU, separate prefill
    /// passes on a GPU, where a mixed step is not yet fast (H200, Llama-3-8B shape, 1000
    /// requests: 4.9k output tok/s mixed against 17.5k unmixed, `runtime/BENCHMARKS.md`).
    #[arg(long)]
    pub mixed_prefill: bool,
    /// Run each decode step's host work (detokenizing, stop strings, events) between forward
    /// passes instead of while the next pass computes on the GPU (the default there; outputs are
    /// the same either way). The CPU always runs it in turn.
    #[arg(long)]
    pub no_host_overlap: bool,
    /// Wait for each decode step's tokens before launching the next one. By default a GPU's
    /// decode step N + 1 is launched before step N's tokens come back (its input tokens taken
    /// on the device), so the GPU does not wait for the host between steps; outputs are the
    /// same either way. Off with `--no-host-overlap` too.
    #[arg(long)]
    pub no_decode_ahead: bool,
    /// On a GPU, launch prefill pass N + 1 before pass N's tokens come back (a pass's inputs are
    /// prompt tokens the host already has), so the GPU does not wait for the host between
    /// passes; outputs are the same either way. Off by default: level with it on an H100 at
    /// 1000 requests (`runtime/BENCHMARKS.md`); no effect with `--no-host-overlap`.
    #[arg(long)]
    pub prefill_ahead: bool,
    /// Cap on the context length (default: the model's).
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Run directory for the slot file and checkpoints (default: a fresh one under sov's state
    /// directory).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// WORM checkpoints every `checkpoint_every` decode steps: `blocks` stores KV blocks (fast
    /// restore), `recompute` stores tokens only (KV rebuilt by prefill on resume), `off`.
    /// Default for `generate`: the machine's `checkpoint_kv` constant (0 recompute, 1 blocks,
    /// 2 auto: blocks on the CPU, recompute on a GPU); for `bench`: off.
    #[arg(long, value_enum)]
    pub checkpoint: Option<CheckpointChoice>,
    /// Private key that signs checkpoint receipts (PKCS#8 PEM, mode 0600; `sov keygen` makes
    /// one). Default: sov's own key in its config directory, created on first use.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Checkpoint at once when a discharging battery falls to this percent (Linux; 0 = off).
    #[arg(long, default_value_t = 10)]
    pub low_battery_percent: u32,
    /// Read batteries from this sysfs-shaped tree instead of /sys/class/power_supply, polled every
    /// 50 ms instead of 30 s (for tests).
    #[arg(long, hide = true, env = "SOV_POWER_SUPPLY_DIR", value_name = "DIR")]
    pub power_supply_dir: Option<PathBuf>,
    /// On CUDA, replay decode steps from captured CUDA graphs (`false`: launch every kernel each
    /// step, to measure what the graphs save).
    #[arg(long, env = "SOV_CUDA_GRAPHS", default_value_t = true, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL")]
    pub cuda_graphs: bool,
    /// On CUDA, draw plain sampled rows' tokens on the device (the host's draw bit for bit), so
    /// only ids come back instead of vocabulary-wide logits rows (default); false downloads each
    /// sampled row's logits and draws it on the host, with the same tokens.
    #[arg(long, env = "SOV_DEVICE_DRAW", default_value_t = true, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL")]
    pub device_draw: bool,
    /// Start with n-gram (prompt-lookup) speculation drafting up to N tokens per step (0 = off;
    /// at most 16). Output is identical either way; only the number of forward passes changes.
    /// Writes slot `speculative_draft_len`, which `sov slots set` can change later.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=crate::engine::speculative::MAX_DRAFT_LEN as i64))]
    pub speculative_draft_len: Option<u32>,
    /// Do not share the KV of cached prompt prefixes between requests (prefix caching is on by
    /// default; outputs are the same either way).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Host memory in MiB for KV swapped out under pressure; 0: preempt by recomputation only.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub swap_mb: usize,
    /// MiB of a swap file in the run directory for KV swapped out beyond `--swap-mb` (written and
    /// read by block; removed when empty, at exit and on resume); 0: none.
    #[arg(long, default_value_t = 0, value_name = "MIB")]
    pub swap_file_mb: usize,
    /// Split the model across N tensor-parallel ranks (Megatron-style: heads and MLP columns per
    /// rank, an all-reduce after the o and down products). On the CPU the ranks run in this
    /// process; on CUDA this build refuses it (no NCCL binding yet).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub tensor_parallel: u16,
}

/// GPU arithmetic on the command line (see [`ModelArgs::precision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionChoice {
    /// bf16 matmul inputs and a bf16 KV cache (fast).
    Bf16,
    /// f32-accurate matmul inputs and an f32 KV cache (slower; within rounding of the CPU).
    F32,
}

/// Linear-layer format on the command line (see [`ModelArgs::quantization`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantizationChoice {
    /// bf16 weights.
    None,
    /// FP8 W8A8 (e4m3 weights with per-channel scales, per-token input scales).
    Fp8,
}

/// KV cache format on the command line (see [`ModelArgs::kv_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvDtypeChoice {
    /// bf16 values (f32 in precise mode and on the CPU).
    Bf16,
    /// e4m3 codes with one f32 scale per token and head (CUDA).
    Fp8,
}

/// Checkpoint mode on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckpointChoice {
    /// Store KV blocks (fast restore).
    Blocks,
    /// Store tokens only; resume rebuilds KV by prefill.
    Recompute,
    /// No checkpoints.
    Off,
}

/// What a command adds to [`ModelArgs`] when it starts an engine.
#[derive(Debug, Clone, Default)]
pub struct StartExtras {
    /// Record the scheduler's transitions (see [`crate::engine::Engine::trace`]).
    pub trace: bool,
    /// Resume this run directory's newest checkpoint.
    pub resume: Option<PathBuf>,
    /// Raised by SIGINT/SIGTERM: checkpoint, then stop.
    pub shutdown: Option<Arc<AtomicBool>>,
    /// Checkpoint when `--checkpoint` is not given, in the machine's mode (its `checkpoint_kv`
    /// constant). False: off unless asked.
    pub checkpoint_by_default: bool,
    /// Leave nothing on disk: no run directory, no slot file, no checkpoints (`sov audit`).
    pub ephemeral: bool,
    /// Submit every signed head to these witnesses (needs checkpoints).
    pub witnesses: Option<crate::app::witnesses::WitnessConfig>,
    /// In deterministic mode on CUDA, the attention split length and parts of K to use instead of
    /// the environment's ([`CudaTuning::deterministic_order`]: `sov audit` replays a run in the
    /// order its heads name).
    pub deterministic_order: Option<(usize, usize)>,
    /// The run being resumed or replayed kept an e4m3 KV cache ([`CudaTuning::names_kv_e4m3`]):
    /// keep it unless `--kv-dtype` is given.
    pub kv_e4m3: bool,
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

    /// `--max-prefill-tokens`, or its default on `device`.
    pub fn max_prefill_tokens(&self, device: Device) -> usize {
        match (self.max_prefill_tokens, device) {
            (Some(n), _) => n as usize,
            (None, Device::Cpu) => CPU_MAX_PREFILL_TOKENS,
            (None, _) => GPU_MAX_PREFILL_TOKENS,
        }
    }

    /// Whether decode steps overlap their host work with the next forward pass on `device`: on a
    /// GPU unless `--no-host-overlap`, never on the CPU (whose cores run the pass).
    pub fn overlap_host(&self, device: Device) -> bool {
        device != Device::Cpu && !self.no_host_overlap
    }

    /// Whether overlapped decode steps launch their successor before their tokens come back on
    /// `device`: wherever the host work overlaps, unless `--no-decode-ahead`.
    pub fn decode_ahead(&self, device: Device) -> bool {
        self.overlap_host(device) && !self.no_decode_ahead
    }

    /// Whether prefill passes launch their successor before their tokens come back on `device`:
    /// with `--prefill-ahead`, wherever the host work overlaps.
    pub fn prefill_ahead(&self, device: Device) -> bool {
        self.overlap_host(device) && self.prefill_ahead
    }

    /// Whether prompts run in chunks inside decode steps on `device` (`--mixed-prefill`,
    /// `--no-mixed-prefill`, else on the CPU only).
    pub fn mixed_prefill(&self, device: Device) -> bool {
        match (self.mixed_prefill, self.no_mixed_prefill) {
            (true, _) => true,
            (_, true) => false,
            _ => device == Device::Cpu,
        }
    }

    /// Resolves and loads the model, then starts the engine (checkpoints off unless asked for);
    /// progress goes to stderr.
    pub fn start(&self, dirs: &SovDirs, trace: bool) -> anyhow::Result<Started> {
        self.start_with(
            dirs,
            StartExtras {
                trace,
                ..StartExtras::default()
            },
        )
    }

    /// The model's weights, config and tokenizer as `--model` names them (a `random:SHAPE`
    /// builds random weights), with the time loading took.
    pub fn load_parts(&self, dirs: &SovDirs) -> anyhow::Result<ModelParts> {
        Ok(
            match self
                .model
                .as_deref()
                .and_then(|m| m.strip_prefix("random:"))
            {
                Some(shape) => {
                    let config = match shape {
                        "tiny" => tiny_config(),
                        "llama3-8b" => llama3_8b_config(),
                        other => {
                            anyhow::bail!(
                                "unknown random shape `{other}` (expected tiny or llama3-8b)"
                            )
                        }
                    };
                    ModelParts::random(config, 0, WeightDtype::BF16, &format!("random {shape}"))
                }
                None => {
                    let path = resolve_model(self.model.as_deref(), &dirs.cache)?;
                    load_model(&path, true)
                        .with_context(|| format!("loading {}", path.display()))?
                        .into()
                }
            },
        )
    }

    /// `SPEC_DIGEST` of the machine `--machine` picks.
    pub fn spec_digest(&self) -> crate::checkpoint::Digest {
        use crate::scheduler::Machine;
        match self.machine {
            MachineChoice::Seed => seed::Scheduler::SPEC_DIGEST,
            MachineChoice::Laptop => laptop::Scheduler::SPEC_DIGEST,
        }
    }

    /// [`Self::start`] with checkpoints, resume and a shutdown flag.
    pub fn start_with(&self, dirs: &SovDirs, extras: StartExtras) -> anyhow::Result<Started> {
        let t0 = Instant::now();
        let parts = self.load_parts(dirs)?;
        self.start_parts(parts, dirs, extras, t0)
    }

    /// `--deterministic`, or its default for `opts`: on for a CUDA run whose checkpoints rebuild
    /// the KV by recomputation (measured on an H200: 16 of 16 such resumes exact with it, 0 of 16
    /// without, at 13-29% of throughput), off otherwise.
    pub fn deterministic_for(&self, opts: &EngineOptions, fp8: bool) -> bool {
        if fp8 && self.deterministic.is_none() {
            // FP8 products are not batch-invariant; an explicit --deterministic is refused when
            // the backend opens.
            return false;
        }
        self.deterministic.unwrap_or_else(|| {
            let checkpoint_kv = match self.machine {
                MachineChoice::Seed => seed::Scheduler::constant("checkpoint_kv"),
                MachineChoice::Laptop => laptop::Scheduler::constant("checkpoint_kv"),
            };
            let recompute = opts.checkpoints.as_ref().is_some_and(|c| {
                c.mode
                    .unwrap_or_else(|| default_kv_mode(checkpoint_kv, opts.device))
                    == KvMode::Recompute
            });
            matches!(opts.device, Device::Cuda(_)) && recompute
        })
    }

    /// The backend of a run that opens `parts` without an engine (`sov perplexity`): the device,
    /// whether it computes in f32 (`--precision f32`), and the CUDA tuning from the environment
    /// with `--deterministic` (off unless given) and the products' format applied.
    pub fn backend_choice(&self, parts: &ModelParts) -> anyhow::Result<(Device, bool, CudaTuning)> {
        let device = self.device();
        let mut tuning = cuda_tuning_from_env()?;
        tuning.deterministic = self.deterministic.unwrap_or(false);
        self.set_quantization(&mut tuning, parts, device, false)?;
        Ok((device, self.precision == PrecisionChoice::F32, tuning))
    }

    /// Starts an engine on `parts` (loaded at `t0`) as the other options say.
    pub fn start_parts(
        &self,
        parts: ModelParts,
        dirs: &SovDirs,
        extras: StartExtras,
        t0: Instant,
    ) -> anyhow::Result<Started> {
        let trace = extras.trace;
        let created_run_dir =
            extras.resume.is_none() && self.run_dir.is_none() && !extras.ephemeral;
        let run_dir = match extras.resume.as_ref().or(self.run_dir.as_ref()) {
            None if extras.ephemeral => None,
            Some(d) if extras.resume.is_some() => {
                anyhow::ensure!(d.is_dir(), "--resume {}: not a directory", d.display());
                Some(d.clone())
            }
            Some(d) => {
                crate::app::run_dir::private_dir(d)
                    .with_context(|| format!("creating {}", d.display()))?;
                Some(d.clone())
            }
            None => Some(create_run_dir(&dirs.state)?),
        };
        let device = self.device();
        let mut opts = EngineOptions {
            device,
            kv_budget: self.kv_memory_mb.budget(),
            prefix_cache: !self.no_prefix_cache,
            swap_memory_bytes: self.swap_mb << 20,
            swap_file_bytes: self.swap_file_mb << 20,
            tensor_parallel: usize::from(self.tensor_parallel),
            max_batch: self.max_batch,
            max_prefill_tokens: self.max_prefill_tokens(device),
            mixed_prefill: self.mixed_prefill(device),
            overlap_host: self.overlap_host(device),
            decode_ahead: self.decode_ahead(device),
            prefill_ahead: self.prefill_ahead(device),
            max_context: self.max_context,
            precise: self.precision == PrecisionChoice::F32,
            trace,
            run_dir: run_dir.clone(),
            checkpoints: match self.checkpoint {
                _ if run_dir.is_none() => None,
                None if extras.checkpoint_by_default => Some(CheckpointOptions {
                    mode: None,
                    key: self.key.clone(),
                    config_dir: dirs.config.clone(),
                    resume: extras.resume.is_some(),
                }),
                None | Some(CheckpointChoice::Off) => {
                    anyhow::ensure!(
                        extras.resume.is_none(),
                        "--resume needs checkpoints (drop --checkpoint off)"
                    );
                    None
                }
                Some(choice) => Some(CheckpointOptions {
                    mode: Some(if choice == CheckpointChoice::Recompute {
                        KvMode::Recompute
                    } else {
                        KvMode::Blocks
                    }),
                    key: self.key.clone(),
                    config_dir: dirs.config.clone(),
                    resume: extras.resume.is_some(),
                }),
            },
            shutdown: extras.shutdown.clone(),
            cuda_tuning: cuda_tuning_from_env()?,
            runner: RunnerOptions {
                cuda_graphs: self.cuda_graphs,
                device_draw: self.device_draw,
            },
            speculative_draft_len: self.speculative_draft_len,
            witnesses: extras.witnesses.clone(),
        };
        let fp8 = self.fp8_products(&parts, device);
        let deterministic = self.deterministic_for(&opts, fp8);
        opts.cuda_tuning.deterministic = deterministic;
        if let (true, Some((split, parts))) = (deterministic, extras.deterministic_order) {
            opts.cuda_tuning.deterministic_split_tokens = split;
            opts.cuda_tuning.deterministic_k_split = parts;
        }
        self.set_quantization(&mut opts.cuda_tuning, &parts, device, extras.kv_e4m3)?;
        anyhow::ensure!(
            opts.witnesses.is_none() || opts.checkpoints.is_some(),
            "--witness needs checkpoints (drop --checkpoint off)"
        );
        let started = match self.machine {
            MachineChoice::Seed => start_engine::<seed::Scheduler>(parts, &opts),
            MachineChoice::Laptop => start_engine::<laptop::Scheduler>(parts, &opts),
        };
        let mut started = match (started, &run_dir) {
            (Ok(s), _) => s,
            (Err(e), Some(dir)) if created_run_dir => {
                remove_scratch_run_dir(dir);
                return Err(e.into());
            }
            (Err(e), _) => return Err(e.into()),
        };
        if created_run_dir && opts.checkpoints.is_none() {
            // Nothing will be journaled: the directory only serves `sov slots` while this runs.
            if let Some(lock) = started.run_lock.as_mut() {
                lock.discard_when_released();
            }
        }
        let (power_root, every) = match &self.power_supply_dir {
            Some(dir) => (dir.clone(), Duration::from_millis(50)),
            None => (PathBuf::from(POWER_SUPPLY_DIR), Duration::from_secs(30)),
        };
        started.battery = BatteryWatcher::spawn(
            power_root,
            self.low_battery_percent,
            every,
            started.engine.slots().clone(),
        );
        let fp8_name = format!(" ({})", opts.cuda_tuning.precision_name(false));
        let precision = match (device, self.precision, deterministic) {
            _ if fp8 || opts.cuda_tuning.kv_e4m3 => fp8_name.as_str(),
            (Device::Cuda(_), PrecisionChoice::F32, false) => " (f32 precision)",
            (Device::Cuda(_), PrecisionChoice::F32, true) => " (f32 precision, deterministic)",
            (Device::Cuda(_), PrecisionChoice::Bf16, true) => " (deterministic)",
            _ => "",
        };
        eprintln!(
            "sov: {} on {:?}{precision} loaded in {:.1}s; KV cache {} MiB; slots: {}",
            started.model_name,
            device,
            t0.elapsed().as_secs_f64(),
            (started.kv_cache_bytes as f64 / (1u64 << 20) as f64).round(),
            match &started.slot_path {
                Some(p) => p.display().to_string(),
                None => "in memory".into(),
            }
        );
        if let Some(c) = &started.checkpoints {
            for r in &c.recovered {
                eprintln!("sov: recovered from an interrupted checkpoint: {r}");
            }
            if let Some(change) = &c.platform_change {
                eprintln!(
                    "sov: warning: {change}: tokens from here on may differ from an \
                     uninterrupted run's, and `sov audit` replays the whole run on the newest \
                     head's platform (resume with the run's settings for an exact continuation)"
                );
            }
            let key = match (&c.public_key, c.key_created) {
                (Some(p), true) => format!("; created signing key, public key {}", p.display()),
                (Some(p), false) => format!("; public key {}", p.display()),
                (None, _) => String::new(),
            };
            eprintln!(
                "sov: checkpoints ({:?}) in {}{key}",
                c.mode,
                c.dir.display()
            );
            if c.mode == KvMode::Recompute && device != Device::Cpu && !deterministic {
                // Measured on an H200: KV rebuilt by one prefill differs in its last bits from the
                // KV decode steps wrote, and greedy tokens of near-tied logits follow those bits.
                eprintln!(
                    "sov: note: a resume rebuilds the KV by prefill; on a GPU its rounding differs \
                     from decoding's, so resumed outputs can diverge from an uninterrupted run's \
                     (--checkpoint blocks or --deterministic resume bit-exactly)"
                );
            }
        }
        Ok(started)
    }
}

/// The CUDA tuning from the environment's `SOV_*` variables (read once, here at the edge; see
/// `kernels/README.md`); variables of retired knobs are named in a warning and otherwise ignored.
fn cuda_tuning_from_env() -> anyhow::Result<CudaTuning> {
    let get = |k: &str| std::env::var(k).ok();
    for (var, why) in retired_vars_set(get) {
        eprintln!("sov: warning: {var} is no longer read: {why}");
    }
    CudaTuning::from_vars(get).context("CUDA tuning from the environment")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    #[test]
    fn prompts_mix_into_decode_steps_unless_turned_off_with_a_budget_by_device() {
        let a = Cli::try_parse_from(["sov"]).unwrap().model;
        assert!(a.mixed_prefill(Device::Cpu));
        assert!(!a.mixed_prefill(Device::Cuda(0)));
        assert_eq!(a.max_prefill_tokens(Device::Cpu), CPU_MAX_PREFILL_TOKENS);
        assert_eq!(
            a.max_prefill_tokens(Device::Cuda(0)),
            GPU_MAX_PREFILL_TOKENS
        );
        let a = Cli::try_parse_from(["sov", "--max-prefill-tokens", "512", "--no-mixed-prefill"])
            .unwrap()
            .model;
        assert!(!a.mixed_prefill(Device::Cpu));
        assert_eq!(a.max_prefill_tokens(Device::Cpu), 512);
        assert_eq!(a.max_prefill_tokens(Device::Cuda(0)), 512);
        assert!(Cli::try_parse_from(["sov", "--max-prefill-tokens", "0"]).is_err());
        let a = Cli::try_parse_from(["sov", "--mixed-prefill"])
            .unwrap()
            .model;
        assert!(a.mixed_prefill(Device::Cuda(0)));
        assert!(Cli::try_parse_from(["sov", "--mixed-prefill", "--no-mixed-prefill"]).is_err());
    }

    #[test]
    fn host_work_overlaps_on_a_gpu_unless_turned_off() {
        let a = Cli::try_parse_from(["sov"]).unwrap().model;
        assert!(!a.overlap_host(Device::Cpu));
        assert!(a.overlap_host(Device::Cuda(0)));
        let a = Cli::try_parse_from(["sov", "--no-host-overlap"])
            .unwrap()
            .model;
        assert!(!a.overlap_host(Device::Cuda(0)));
        assert!(
            !a.decode_ahead(Device::Cuda(0)),
            "no overlap, nothing ahead"
        );
    }

    #[test]
    fn prefill_passes_go_ahead_on_a_gpu_when_asked() {
        let a = Cli::try_parse_from(["sov"]).unwrap().model;
        assert!(!a.prefill_ahead(Device::Cuda(0)));
        let a = Cli::try_parse_from(["sov", "--prefill-ahead"])
            .unwrap()
            .model;
        assert!(!a.prefill_ahead(Device::Cpu));
        assert!(a.prefill_ahead(Device::Cuda(0)));
        assert!(a.decode_ahead(Device::Cuda(0)));
        let a = Cli::try_parse_from(["sov", "--prefill-ahead", "--no-host-overlap"])
            .unwrap()
            .model;
        assert!(!a.prefill_ahead(Device::Cuda(0)));
    }

    #[test]
    fn decode_steps_go_ahead_on_a_gpu_unless_turned_off() {
        let a = Cli::try_parse_from(["sov"]).unwrap().model;
        assert!(!a.decode_ahead(Device::Cpu));
        assert!(a.decode_ahead(Device::Cuda(0)));
        let a = Cli::try_parse_from(["sov", "--no-decode-ahead"])
            .unwrap()
            .model;
        assert!(!a.decode_ahead(Device::Cuda(0)));
        assert!(a.overlap_host(Device::Cuda(0)));
    }
}
