//! Starting an engine on a loaded model: pick the backend, size the KV cache from a memory budget,
//! build the model, start the engine thread with the machine chosen by the caller.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::loader::tensor::HostTensor;
use crate::loader::{ChatTemplate, LoadedModel};
use crate::model::LlamaModel;
use crate::model::config::LlamaConfig;
use crate::scheduler::Machine;

use super::codec::{ByteCodec, TextCodec};
use super::error::EngineError;
use super::handle::{Engine, EngineConfig};
use super::llama::{LlamaRunner, TokenizerCodec};
use super::random_model::{WeightDtype, random_weights};

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
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
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    pub device: Device,
    /// Bytes the KV cache may take.
    pub kv_memory_bytes: usize,
    pub max_batch: usize,
    pub max_prefill_tokens: usize,
    /// Context length cap (None: the model's `max_position_embeddings`).
    pub max_context: Option<usize>,
    pub trace: bool,
    pub run_dir: Option<std::path::PathBuf>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            kv_memory_bytes: 1 << 30,
            max_batch: 256,
            max_prefill_tokens: 2048,
            max_context: None,
            trace: false,
            run_dir: None,
        }
    }
}

/// Bytes of KV one token takes in every layer (K and V) at `dtype_bytes` per element.
pub fn kv_bytes_per_token(c: &LlamaConfig, dtype_bytes: usize) -> usize {
    2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * dtype_bytes
}

/// A started engine with what a front end needs besides it.
pub struct Started {
    pub engine: Engine,
    pub chat_template: Option<ChatTemplate>,
    pub model_name: String,
    pub config: LlamaConfig,
}

/// Everything an engine needs from a model source.
pub struct ModelParts {
    pub config: LlamaConfig,
    pub tensors: HashMap<String, HostTensor>,
    pub codec: Arc<dyn TextCodec>,
    pub eos_ids: Vec<u32>,
    pub chat_template: Option<ChatTemplate>,
    pub name: String,
}

impl From<LoadedModel> for ModelParts {
    fn from(m: LoadedModel) -> Self {
        let codec = TokenizerCodec {
            tokenizer: m.tokenizer,
            add_special: m.add_bos,
        };
        Self {
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
    /// A random-weight model of shape `config` (see [`super::random_model`]); text is bytes.
    pub fn random(config: LlamaConfig, seed: u64, dtype: WeightDtype, name: &str) -> Self {
        let tensors = random_weights(&config, seed, dtype);
        Self {
            config,
            tensors,
            codec: Arc::new(ByteCodec),
            eos_ids: Vec::new(),
            chat_template: None,
            name: name.into(),
        }
    }
}

/// Builds the model on `opts.device` and starts an engine running machine `M`.
pub fn start_engine<M: Machine + 'static>(
    parts: impl Into<ModelParts>,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let parts = parts.into();
    match opts.device {
        Device::Cpu => start_on::<M, _>(CpuBackend::new(), parts, opts),
        Device::Cuda(n) => {
            let backend = CudaBackend::new(n)
                .map_err(|e| EngineError::Forward(format!("device cuda:{n}: {e}")))?;
            start_on::<M, _>(backend, parts, opts)
        }
    }
}

/// Starts an engine for `parts` on `backend`.
pub fn start_on<M: Machine + 'static, B: Backend>(
    backend: B,
    parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let block_size = M::constant("block_size").unwrap_or(16).max(1) as usize;
    let per_token = kv_bytes_per_token(&parts.config, backend.kv_dtype().size_bytes()).max(1);
    let num_blocks = (opts.kv_memory_bytes / (per_token * block_size)).max(1);
    // Weights move to the backend one tensor at a time: host memory never holds two copies.
    let model = LlamaModel::from_tensors(backend, &parts.config, parts.tensors)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    let runner = LlamaRunner::new(model, num_blocks, block_size)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    let context_len = opts
        .max_context
        .unwrap_or(usize::MAX)
        .min(parts.config.max_position_embeddings);
    let engine = Engine::start::<M, _>(
        runner,
        parts.codec,
        EngineConfig {
            num_blocks,
            max_batch: opts.max_batch,
            max_prefill_tokens: opts.max_prefill_tokens,
            context_len,
            eos_ids: parts.eos_ids,
            trace: opts.trace,
            run_dir: opts.run_dir.clone(),
        },
    )?;
    Ok(Started {
        engine,
        chat_template: parts.chat_template,
        model_name: parts.name,
        config: parts.config,
    })
}
