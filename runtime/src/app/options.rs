//! The typed options and results of starting an engine: where the model runs ([`Device`]), what a
//! command line exposes ([`EngineOptions`], [`CheckpointOptions`]), the model a start consumes
//! ([`ModelParts`]) and what a front end gets back ([`Started`], [`CheckpointInfo`]).
//!
//! Design: plain data shared by every front end and by the start-up steps (`start`, `launch`,
//! `checkpoints`, `tensor_parallel`), which all import it; it imports none of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::battery::BatteryWatcher;
use super::run_dir::RunLock;
use super::witnesses::{WitnessConfig, Witnesses};
use crate::backend::cuda::CudaTuning;
use crate::checkpoint::KvMode;
use crate::engine::checkpointing::ResumeBook;
use crate::engine::codec::{ByteCodec, TextCodec};
use crate::engine::constraint::GrammarSupport;
use crate::engine::handle::Engine;
use crate::loader::tensor::HostTensor;
use crate::loader::{ChatTemplate, LoadedModel};
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights};
use crate::runner::grammar_vocab::grammar_vocab;
use crate::runner::{RunnerOptions, TokenizerCodec};

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
    /// How much memory the KV cache takes.
    pub kv_budget: KvBudget,
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most prompt tokens per prefill forward pass (per mixed step when `mixed_prefill`).
    pub max_prefill_tokens: usize,
    /// Run prompts in chunks inside decode steps ([`crate::engine::handle::EngineConfig::mixed_prefill`]).
    pub mixed_prefill: bool,
    /// Overlap each decode step's host work with the next forward pass
    /// ([`crate::engine::handle::EngineConfig::overlap_host`]).
    pub overlap_host: bool,
    /// Launch each overlapped decode step's successor before its tokens come back
    /// ([`crate::engine::handle::EngineConfig::decode_ahead`]).
    pub decode_ahead: bool,
    /// Launch each prefill pass before the one before it is waited for
    /// ([`crate::engine::handle::EngineConfig::prefill_ahead`]).
    pub prefill_ahead: bool,
    /// Context length cap (None: the model's `max_position_embeddings`).
    pub max_context: Option<usize>,
    /// On a GPU: f32-accurate matmul inputs and an f32 KV cache
    /// ([`crate::backend::cuda::CudaBackend::with_precise`]); the CPU backend always computes in f32.
    pub precise: bool,
    /// Record every scheduler transition (see [`crate::engine::handle::EngineConfig::trace`]).
    pub trace: bool,
    /// The run directory: slot file and checkpoints live in it (None: neither).
    pub run_dir: Option<PathBuf>,
    /// WORM checkpoints into `<run_dir>/checkpoints` (needs `run_dir`); None: off.
    pub checkpoints: Option<CheckpointOptions>,
    /// Raised by a signal handler: checkpoint, then stop (see [`crate::engine::handle::EngineConfig::shutdown`]).
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
            kv_budget: KvBudget::Bytes(1 << 30),
            max_batch: 256,
            max_prefill_tokens: 2048,
            mixed_prefill: true,
            overlap_host: false,
            decode_ahead: false,
            prefill_ahead: false,
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

/// How much memory the KV cache takes: a size, or a share of what the device has free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// This many bytes.
    Bytes(usize),
    /// This fraction (0 < f <= 1) of the device memory still free once the weights and the
    /// scratch are in place, less [`KV_AUTO_RESERVE_BYTES`] for what a run allocates later
    /// (decode graphs, library workspaces). Only for a device that reports its free memory (a
    /// GPU), and one device (no tensor parallelism).
    FreeDeviceMemory(f64),
}

/// Device memory [`KvBudget::FreeDeviceMemory`] leaves out of the KV cache for what a run
/// allocates after it: the decode graphs (at most 2 GiB, `runner/decode_graphs.rs`) and cuBLAS
/// workspaces.
pub const KV_AUTO_RESERVE_BYTES: usize = 3 << 30;

/// The share of free device memory `--kv-memory-mb auto` gives the KV cache (vLLM's
/// `--gpu-memory-utilization` default is the same 0.9, of the whole card).
pub const KV_AUTO_FRACTION: f64 = 0.9;

/// Bytes of KV one token takes in every layer (K and V) with rows of `row_bytes` (one token's K,
/// or V, in one layer: `KVH * D` elements in a plain format).
pub fn kv_bytes_per_token(c: &LlamaConfig, row_bytes: usize) -> usize {
    2 * c.num_hidden_layers * row_bytes
}

/// Bytes of one token's K (or V) row in one layer of `backend`'s cache for `c`.
pub fn kv_row_bytes<B: crate::backend::Backend>(backend: &B, c: &LlamaConfig) -> usize {
    let heads = crate::backend::HeadShape {
        n_heads: c.num_attention_heads,
        n_kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    };
    backend.kv_row_elems(heads) * backend.kv_dtype().size_bytes()
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
    /// Bytes the KV cache took (its blocks; settled from the device's free memory under
    /// [`KvBudget::FreeDeviceMemory`]).
    pub kv_cache_bytes: usize,
    /// The checkpoint setup, when checkpoints are on.
    pub checkpoints: Option<CheckpointInfo>,
    /// Raises low_battery from the machine's battery (set by the front end; None: not watching).
    pub battery: Option<BatteryWatcher>,
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
    /// Whether any weight is stored in FP8 (a compressed-tensors FP8 checkpoint).
    pub fn has_fp8_weights(&self) -> bool {
        self.tensors
            .values()
            .any(|t| matches!(t.data, crate::loader::HostData::Fp8(_)))
    }

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
