//! Starting an engine on a loaded model: pick the backend, size the KV cache from a memory budget,
//! build the model, start the engine thread with the machine chosen by the caller.
//!
//! Design: the one place where options become a running engine, shared by every front end. Typed
//! options in ([`EngineOptions`], [`ModelParts`]), a [`Started`] out; the checkpoint store is opened
//! here (its directory, key and anchor) and handed to the engine as the hooks the engine owns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::run_dir::{RunLock, checkpoint_dir, slot_path};
use super::slot_file::create_slots;
use super::witnesses::{WitnessConfig, Witnesses};
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaTuning};
use crate::checkpoint::{Anchor, KvMode, Platform, keys};
use crate::engine::EngineError;
use crate::engine::checkpointing::{self, ResumeBook, Worm, WormConfig};
use crate::engine::codec::{ByteCodec, TextCodec};
use crate::engine::constraint::GrammarSupport;
use crate::engine::forward::ForwardModel;
use crate::engine::handle::{Durability, Engine, EngineConfig};
use crate::engine::hook::{CheckpointHook, RequestJournal};
use crate::engine::kv_policy::KvPolicy;
use crate::engine::prefix_cache::CacheSalt;
use crate::loader::tensor::{HostData, HostTensor};
use crate::loader::{ChatTemplate, LoadedModel};
use crate::model::LlamaModel;
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights};
use crate::runner::grammar_vocab::grammar_vocab;
use crate::runner::{LlamaRunner, RunnerBackend, RunnerOptions, TokenizerCodec};
use crate::scheduler::Machine;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host CPU (the `cpu` backend, f32 compute).
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device `{s}` (expected cpu, cuda or cuda:N)")),
        }
    }
}

/// Engine options a command line exposes.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Where the model runs.
    pub device: Device,
    /// Bytes the KV cache may take.
    pub kv_memory_bytes: usize,
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most prompt tokens per prefill forward pass (per mixed step when `mixed_prefill`).
    pub max_prefill_tokens: usize,
    /// Run prompts in chunks inside decode steps ([`EngineConfig::mixed_prefill`]).
    pub mixed_prefill: bool,
    /// Context length cap (None: the model's `max_position_embeddings`).
    pub max_context: Option<usize>,
    /// On a GPU: f32-accurate matmul inputs and an f32 KV cache
    /// ([`CudaBackend::with_precise`]); the CPU backend always computes in f32.
    pub precise: bool,
    /// Record every scheduler transition (see [`EngineConfig::trace`]).
    pub trace: bool,
    /// The run directory: slot file and checkpoints live in it (None: neither).
    pub run_dir: Option<PathBuf>,
    /// WORM checkpoints into `<run_dir>/checkpoints` (needs `run_dir`); None: off.
    pub checkpoints: Option<CheckpointOptions>,
    /// Raised by a signal handler: checkpoint, then stop (see [`EngineConfig::shutdown`]).
    pub shutdown: Option<Arc<AtomicBool>>,
    /// CUDA kernel tuning (measured defaults; the command line reads its `SOV_*` overrides).
    pub cuda_tuning: CudaTuning,
    /// How the model runner runs decode steps (CUDA graphs or eager launches).
    pub runner: RunnerOptions,
    /// Start with n-gram speculation drafting this many tokens (slot `speculative_draft_len`;
    /// None: the machine's initial value, or the resumed run's).
    pub speculative_draft_len: Option<u32>,
    /// Share the KV of cached prompt prefixes between requests (on by default).
    pub prefix_cache: bool,
    /// Bytes of host memory for KV swapped out under pressure (0, the default here: preempt by
    /// recomputation only; the command line's `--swap-mb` defaults to 256 MiB).
    pub swap_memory_bytes: usize,
    /// Bytes of the swap pool's file tier in the run directory, for KV beyond the host pool
    /// (0, the default: none; needs a run directory).
    pub swap_file_bytes: usize,
    /// Submit every signed head to these witnesses (needs checkpoints); None: no witnesses.
    pub witnesses: Option<WitnessConfig>,
    /// Ranks the model is split across (tensor parallelism; 1: the whole model on one device).
    pub tensor_parallel: usize,
}

/// How the engine checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointOptions {
    /// None: the machine's choice, its `checkpoint_kv` constant (0 recompute, 1 blocks, 2 auto:
    /// see [`default_kv_mode`]; auto when the spec has none).
    pub mode: Option<KvMode>,
    /// PKCS#8 PEM private key (None: sov's default key in `config_dir`, created on first use).
    pub key: Option<PathBuf>,
    /// sov's config directory ([`super::SovDirs::config`]), where the default key lives.
    pub config_dir: PathBuf,
    /// Continue the run directory's newest checkpoint and journal instead of starting afresh.
    pub resume: bool,
}

/// What a front end needs to know about the engine's checkpoints.
pub struct CheckpointInfo {
    /// The checkpoint directory (`<run_dir>/checkpoints`).
    pub dir: PathBuf,
    /// Whether checkpoints store KV blocks or tokens only.
    pub mode: KvMode,
    /// The public key that verifies the receipts, when sov's default key is used.
    pub public_key: Option<PathBuf>,
    /// The default key was created by this start.
    pub key_created: bool,
    /// Torn leftovers of an interrupted checkpoint discarded at open.
    pub recovered: Vec<String>,
    /// A resume on another backend or precision than the run's heads name: what each says.
    pub platform_change: Option<String>,
    /// Filled by a resume: every request the journal knows, live or finished.
    pub book: Arc<Mutex<ResumeBook>>,
    /// The witness client, when witnesses are configured.
    pub witnesses: Option<Arc<Witnesses>>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            kv_memory_bytes: 1 << 30,
            max_batch: 256,
            max_prefill_tokens: 2048,
            mixed_prefill: true,
            max_context: None,
            precise: false,
            trace: false,
            run_dir: None,
            checkpoints: None,
            shutdown: None,
            cuda_tuning: CudaTuning::default(),
            runner: RunnerOptions::default(),
            speculative_draft_len: None,
            prefix_cache: true,
            swap_memory_bytes: 0,
            swap_file_bytes: 0,
            witnesses: None,
            tensor_parallel: 1,
        }
    }
}

/// Bytes of KV one token takes in every layer (K and V) at `dtype_bytes` per element.
pub fn kv_bytes_per_token(c: &LlamaConfig, dtype_bytes: usize) -> usize {
    2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * dtype_bytes
}

/// A started engine with what a front end needs besides it.
pub struct Started {
    /// The running engine.
    pub engine: Engine,
    /// The model's chat template, if it ships one (None: prompts are used as given).
    pub chat_template: Option<ChatTemplate>,
    /// The model's display name.
    pub model_name: String,
    /// The model's config.
    pub config: LlamaConfig,
    /// The checkpoint setup, when checkpoints are on.
    pub checkpoints: Option<CheckpointInfo>,
    /// Raises low_battery from the machine's battery (set by the front end; None: not watching).
    pub battery: Option<super::battery::BatteryWatcher>,
    /// The slot file other processes steer the engine through (None: no run directory).
    pub slot_path: Option<PathBuf>,
    /// This process's hold on the run directory (None: no run directory).
    pub run_lock: Option<RunLock>,
}

/// Everything an engine needs from a model source.
pub struct ModelParts {
    /// Model shape and hyperparameters.
    pub config: LlamaConfig,
    /// The weights, by tensor name.
    pub tensors: HashMap<String, HostTensor>,
    /// Turns text into token ids and back.
    pub codec: Arc<dyn TextCodec>,
    /// End-of-sequence token ids (empty: only stop strings and length limits end a request).
    pub eos_ids: Vec<u32>,
    /// The model's chat template, if it ships one.
    pub chat_template: Option<ChatTemplate>,
    /// The model's display name.
    pub name: String,
    /// Structured output over the model's vocabulary (None: the tokenizer gives none).
    pub grammar: Option<Arc<GrammarSupport>>,
}

impl From<LoadedModel> for ModelParts {
    fn from(m: LoadedModel) -> Self {
        let eos = m.eos_token_ids.clone();
        let tokenizer = m.tokenizer.inner().clone();
        let grammar = GrammarSupport::new(move || grammar_vocab(&tokenizer, &eos));
        let codec = TokenizerCodec {
            tokenizer: m.tokenizer,
            add_special: m.add_bos,
        };
        Self {
            grammar: Some(Arc::new(grammar)),
            config: m.config,
            tensors: m.tensors,
            codec: Arc::new(codec),
            eos_ids: m.eos_token_ids,
            chat_template: m.chat_template,
            name: m.name,
        }
    }
}

impl ModelParts {
    /// A random-weight model of shape `config` (see [`crate::model::random`]); text is bytes.
    pub fn random(config: LlamaConfig, seed: u64, dtype: WeightDtype, name: &str) -> Self {
        let tensors = random_weights(&config, seed, dtype);
        Self {
            config,
            tensors,
            codec: Arc::new(ByteCodec),
            eos_ids: Vec::new(),
            chat_template: None,
            name: name.into(),
            grammar: None,
        }
    }
}

/// Builds the model on `opts.device` and starts an engine running machine `M`.
pub fn start_engine<M: Machine + 'static>(
    parts: impl Into<ModelParts>,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let parts = parts.into();
    if opts.tensor_parallel > 1 {
        return super::tensor_parallel::start_tensor_parallel::<M>(parts, opts);
    }
    match opts.device {
        Device::Cpu => start_on::<M, _>(CpuBackend::new(), parts, opts),
        Device::Cuda(n) => {
            let backend = CudaBackend::with_tuning(n, opts.cuda_tuning.clone())
                .map_err(|e| EngineError::Forward(format!("device cuda:{n}: {e}")))?
                .with_precise(opts.precise);
            start_on::<M, _>(backend, parts, opts)
        }
    }
}

/// Starts an engine for `parts` on `backend`.
pub fn start_on<M: Machine + 'static, B: RunnerBackend>(
    backend: B,
    mut parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let prep = prepare::<M>(backend.kv_dtype().size_bytes(), &parts, opts)?;
    // Weights move to the backend one tensor at a time: host memory never holds two copies.
    let tensors = std::mem::take(&mut parts.tensors);
    let model = LlamaModel::from_tensors(backend, &parts.config, tensors)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    // Scratch for the largest step the scheduler can form (a prefill budget plus one decode token
    // per sequence), allocated now rather than in the middle of serving.
    let (rows, seqs, context) = prep.scratch(opts);
    model
        .reserve_scratch(rows, seqs, context)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    let runner = LlamaRunner::with_decode(
        model,
        prep.num_blocks,
        prep.block_size,
        B::new_decode(&opts.runner),
    )
    .map_err(|e| EngineError::Forward(e.to_string()))?;
    launch::<M, _>(runner, prep, parts, opts)
}

/// What a start settles before the weights move to a backend.
pub(crate) struct Prepared {
    /// Tokens per KV block (the machine's `block_size`).
    pub block_size: usize,
    /// KV bytes of one token in every layer.
    pub per_token: usize,
    /// KV blocks the budget holds.
    pub num_blocks: usize,
    /// The context cap: the option, the model's, whichever is smaller.
    pub context_len: usize,
    run_lock: Option<RunLock>,
    worm: Option<(Worm, CheckpointInfo)>,
}

impl Prepared {
    /// Rows, sequences and context [`LlamaModel::reserve_scratch`] is sized for.
    pub fn scratch(&self, opts: &EngineOptions) -> (usize, usize, usize) {
        (
            opts.max_prefill_tokens.max(1) + opts.max_batch,
            opts.max_batch,
            self.context_len.min(self.num_blocks * self.block_size),
        )
    }
}

/// The KV budget in blocks of `kv_dtype_bytes` elements, the run lock and the checkpoint store,
/// settled while `parts` still holds the weights (receipts hash them).
pub(crate) fn prepare<M: Machine>(
    kv_dtype_bytes: usize,
    parts: &ModelParts,
    opts: &EngineOptions,
) -> Result<Prepared, EngineError> {
    let block_size = M::constant("block_size").unwrap_or(16).max(1) as usize;
    let per_token = kv_bytes_per_token(&parts.config, kv_dtype_bytes).max(1);
    let num_blocks = (opts.kv_memory_bytes / (per_token * block_size)).max(1);
    // Held as long as the engine runs: no second process resumes or prunes this run meanwhile.
    let run_lock = opts.run_dir.as_deref().map(RunLock::acquire).transpose()?;
    // Hashed before the weights move to the backend: receipts name the exact model.
    let worm = match &opts.checkpoints {
        Some(c) => Some(open_worm::<M>(c, opts, parts)?),
        None => None,
    };
    let context_len = opts
        .max_context
        .unwrap_or(usize::MAX)
        .min(parts.config.max_position_embeddings);
    Ok(Prepared {
        block_size,
        per_token,
        num_blocks,
        context_len,
        run_lock,
        worm,
    })
}

/// Starts the engine thread of machine `M` on `runner` (whose weights came from `parts`).
pub(crate) fn launch<M: Machine + 'static, F: ForwardModel + 'static>(
    runner: F,
    prep: Prepared,
    parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let Prepared {
        block_size,
        per_token,
        num_blocks,
        context_len,
        run_lock,
        worm,
    } = prep;
    let (durability, checkpoints) = match worm {
        Some((worm, info)) => (
            Some(Durability {
                hook: Box::new(worm.hook) as Box<dyn CheckpointHook<_>>,
                journal: Some(worm.acceptor as Arc<dyn RequestJournal>),
                resume: opts.checkpoints.as_ref().is_some_and(|c| c.resume),
            }),
            Some(info),
        ),
        None => (None, None),
    };
    // A killed run's swap file holds nothing a checkpoint refers to (swapped sequences resume by
    // recomputation); a fresh spill would truncate it anyway.
    if let Some(dir) = opts.run_dir.as_deref() {
        match crate::engine::swap_spill::remove_leftover(dir) {
            Ok(true) => tracing::info!(
                "removed the swap file a killed run left in {}",
                dir.display()
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("removing a leftover swap file in {}: {e}", dir.display()),
        }
    }
    if opts.swap_file_bytes > 0 && opts.run_dir.is_none() {
        tracing::warn!("a swap file needs a run directory; swapping to host memory only");
    }
    let slot_path = opts.run_dir.as_deref().map(slot_path);
    let slots = match &slot_path {
        Some(path) => Some(create_slots(path)?),
        None => None,
    };
    let engine = Engine::start_durable::<M, _>(
        runner,
        parts.codec,
        EngineConfig {
            num_blocks,
            max_batch: opts.max_batch,
            max_prefill_tokens: opts.max_prefill_tokens,
            mixed_prefill: opts.mixed_prefill,
            context_len,
            eos_ids: parts.eos_ids,
            trace: opts.trace,
            slots,
            grammar: parts.grammar,
            shutdown: opts.shutdown.clone(),
            kv: KvPolicy {
                prefix_cache: opts.prefix_cache,
                swap_blocks: opts.swap_memory_bytes / (per_token * block_size),
                spill_blocks: opts.swap_file_bytes / (per_token * block_size),
                spill_path: opts
                    .run_dir
                    .as_deref()
                    .map(|d| d.join(crate::engine::swap_spill::SPILL_FILE)),
                // Blocks are shared only between requests to the same model in the same KV dtype.
                salt: CacheSalt::of(&[
                    parts.name.as_bytes(),
                    format!("{:?}", parts.config).as_bytes(),
                    &(per_token as u64).to_le_bytes(),
                ]),
            },
        },
        durability,
    )?;
    if let Some(w) = checkpoints.as_ref().and_then(|c| c.witnesses.as_ref()) {
        w.publish_to(engine.slots().clone());
    }
    if let Some(n) = opts.speculative_draft_len {
        // After a resume's restore, which loads the interrupted run's slots.
        engine.slots().set_speculative_draft_len(n);
    }
    Ok(Started {
        engine,
        chat_template: parts.chat_template,
        model_name: parts.name,
        config: parts.config,
        checkpoints,
        battery: None,
        slot_path,
        run_lock,
    })
}

/// Opens the checkpoint store of `run_dir` for machine `M` and model `parts`.
/// The checkpoint mode a spec asks for with its `checkpoint_kv` constant: 0 recompute, 1 blocks,
/// 2 (or absent) auto: blocks when the KV cache is in host memory (reading it back is a memcpy and
/// a restore skips the prefill), recompute on a GPU, where reading gigabytes of KV back over PCIe
/// and writing them stalls decoding (measured on an H200, Llama-3-8B shape, batch 64: blocks
/// spent 72% of busy time checkpointing, recompute 0.21%).
pub fn default_kv_mode(checkpoint_kv: Option<i64>, device: Device) -> KvMode {
    match (checkpoint_kv, device) {
        (Some(0), _) => KvMode::Recompute,
        (Some(1), _) | (_, Device::Cpu) => KvMode::Blocks,
        (_, Device::Cuda(_)) => KvMode::Recompute,
    }
}

/// What the heads say the engine runs on: `cpu`/`cuda` (`-tpN` across N tensor-parallel ranks,
/// whose sums round differently) and `f32`/`bf16` (a GPU computes in bf16 unless `precise`),
/// `-deterministic` appended on a GPU in batch-invariant mode.
pub fn platform_of(
    device: Device,
    precise: bool,
    tuning: &CudaTuning,
    tensor_parallel: usize,
) -> Platform {
    let (backend, precision) = match device {
        Device::Cpu => ("cpu", "f32".to_string()),
        Device::Cuda(_) => ("cuda", tuning.precision_name(precise)),
    };
    let backend = match tensor_parallel {
        0 | 1 => backend.to_string(),
        n => format!("{backend}-tp{n}"),
    };
    Platform {
        backend: Some(backend),
        precision: Some(precision),
    }
}

fn open_worm<M: Machine>(
    c: &CheckpointOptions,
    opts: &EngineOptions,
    parts: &ModelParts,
) -> Result<(Worm, CheckpointInfo), EngineError> {
    let device = opts.device;
    let run_dir = opts
        .run_dir
        .as_deref()
        .ok_or_else(|| EngineError::Checkpoint("checkpoints need a run directory".into()))?;
    let dir = checkpoint_dir(run_dir);
    let has_chain = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
    if c.resume && !has_chain {
        return Err(EngineError::Checkpoint(format!(
            "nothing to resume: {} holds no checkpoint directory with a journal",
            dir.display()
        )));
    }
    if !c.resume && has_chain {
        return Err(EngineError::Checkpoint(format!(
            "{} already holds a run; continue it with --resume {} or use another run directory",
            dir.display(),
            run_dir.display()
        )));
    }
    let ck = |e: crate::checkpoint::CheckpointError| EngineError::Checkpoint(e.to_string());
    let mode = c
        .mode
        .unwrap_or_else(|| default_kv_mode(M::constant("checkpoint_kv"), device));
    let (key, public_key, key_created) = match &c.key {
        Some(path) => (keys::load_private(path).map_err(ck)?, None, false),
        None => {
            let (key, public, created) = keys::load_or_create_in(&c.config_dir).map_err(ck)?;
            (key, Some(public), created)
        }
    };
    // The slots of the interrupted run remember the chain head: a rolled-back directory is refused.
    let anchor = if c.resume {
        std::fs::read(slot_path(run_dir))
            .ok()
            .and_then(|bytes| slots_from_bytes(&bytes))
            .and_then(|slots| Anchor::from_slots(&slots))
            .map(|a| a.locate(&dir))
    } else {
        None
    };
    let mut worm = checkpointing::open(WormConfig {
        dir: dir.clone(),
        key,
        spec_digest: M::SPEC_DIGEST,
        model_digest: model_digest(parts),
        anchor,
        mode,
        resume: c.resume,
        platform: platform_of(
            device,
            opts.precise,
            &opts.cuda_tuning,
            opts.tensor_parallel,
        ),
    })
    .map_err(ck)?;
    let witnesses = match &opts.witnesses {
        Some(cfg) => {
            let w = Witnesses::start(cfg.clone(), &dir).map_err(|e| {
                EngineError::Checkpoint(format!("starting the witness client: {e}"))
            })?;
            worm.set_head_sink(w.sink()).map_err(ck)?;
            worm.set_quorum_height(w.quorum_height());
            Some(Arc::new(w))
        }
        None => None,
    };
    let info = CheckpointInfo {
        dir,
        mode,
        public_key,
        key_created,
        recovered: worm.recovered.clone(),
        platform_change: worm.platform_change.clone(),
        book: worm.book.clone(),
        witnesses,
    };
    Ok((worm, info))
}

/// The 32 slot words of a slot file's bytes (little-endian u32s), if it has them.
fn slots_from_bytes(bytes: &[u8]) -> Option<[u32; 32]> {
    let mut slots = [0u32; 32];
    for (i, w) in bytes.get(..128)?.chunks_exact(4).enumerate() {
        slots[i] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    Some(slots)
}

/// BLAKE3 over the model's name, its configuration and every tensor (name, shape, dtype, bytes,
/// in name order): the `model` field of every receipt, so a resume with other weights is refused.
pub fn model_digest(parts: &ModelParts) -> crate::checkpoint::Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"sov model v1\0");
    h.update(format!("{:?}\0", parts.config).as_bytes());
    let mut names: Vec<&String> = parts.tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &parts.tensors[name];
        h.update(name.as_bytes());
        h.update(format!("\0{:?}\0", t.shape).as_bytes());
        let (dtype, bytes): (&[u8], &[u8]) = match &t.data {
            HostData::F32(v) => (b"f32", bytemuck::cast_slice(v)),
            HostData::F16(v) => (b"f16", bytemuck::cast_slice(v)),
            HostData::BF16(v) => (b"bf16", bytemuck::cast_slice(v)),
            HostData::Quant(q) => (q.ty.name().as_bytes(), &q.bytes),
        };
        h.update(dtype);
        h.update_rayon(bytes);
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_mode_follows_the_spec_then_the_device() {
        let gpu = Device::Cuda(0);
        assert_eq!(default_kv_mode(Some(0), Device::Cpu), KvMode::Recompute);
        assert_eq!(default_kv_mode(Some(1), gpu), KvMode::Blocks);
        assert_eq!(default_kv_mode(Some(2), Device::Cpu), KvMode::Blocks);
        assert_eq!(default_kv_mode(Some(2), gpu), KvMode::Recompute);
        assert_eq!(default_kv_mode(None, gpu), KvMode::Recompute);
        assert_eq!(default_kv_mode(Some(7), Device::Cpu), KvMode::Blocks);
    }
}
