//! Model loading: Hugging Face folders (safetensors, config.json, tokenizer.json) and GGUF files,
//! plus the default model's fetch into sov's cache.
//!
//! Design: both formats end in the same [`LoadedModel`]: a [`LlamaConfig`], host tensors under
//! Hugging Face names (quantized GGUF data dequantized, llama.cpp's Q/K permutation undone), a
//! tokenizer, a chat template and the special-token ids. Files are memory-mapped and every read is
//! checked, so a missing, truncated or mismatched file gives a [`LoadError`] naming it.

pub mod chat_template;
pub mod config;
#[cfg(test)]
mod default_model_tests;
pub mod error;
pub mod fp8;
pub mod gguf;
pub mod hf;
pub mod progress;
pub mod resolve;
pub mod tensor;
pub mod tokenizer;
pub mod validate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use chat_template::{ChatMessage, ChatTemplate};
pub use error::LoadError;
pub use resolve::{DEFAULT_MODEL, cached_default_model, resolve_model};
pub use tensor::{HostData, HostTensor};
pub use tokenizer::Tokenizer;

use crate::loader::config::LlamaConfig;

/// A model ready for the model code: configuration, weights, tokenizer and chat formatting.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// Model shape and hyperparameters.
    pub config: LlamaConfig,
    /// Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...), shapes checked against
    /// `config`; `lm_head.weight` is absent when `config.tie_word_embeddings`.
    pub tensors: HashMap<String, HostTensor>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template, if it ships one.
    pub chat_template: Option<ChatTemplate>,
    /// Ids that end generation (for SmolLM2: `<|im_end|>` = 2).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token id, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Whether `tokenizer.encode(text, true)` prepends `bos_token_id`.
    pub add_bos: bool,
    /// Files the model was read from (for digests and messages).
    pub source_files: Vec<PathBuf>,
    /// Human-readable model name.
    pub name: String,
}

/// Loads a model from a `.gguf` file or a Hugging Face folder; `progress` shows a progress bar.
pub fn load_model(path: &Path, progress: bool) -> Result<LoadedModel, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, e))?;
    if meta.is_dir() {
        hf::load_hf(path, progress)
    } else {
        gguf::load_gguf(path, progress)
    }
}
