//! Llama-family model configuration, as Hugging Face's `config.json` (`LlamaConfig`) defines it.
//!
//! Contract between the loaders (this module's `hf` and `gguf`, which fill it from `config.json`
//! or GGUF metadata) and the model (`crate::model`, which reads it, and re-exports this module as
//! `crate::model::config`). Field names follow Hugging Face.

use serde::{Deserialize, Serialize};

/// Llama-3.1 style RoPE frequency scaling (`rope_scaling` with `rope_type = "llama3"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// Factor the low-frequency (long-wavelength) RoPE frequencies are divided by.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled fully.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are not scaled;
    /// between the two bounds the scaling is interpolated.
    pub high_freq_factor: f32,
    /// Context length the model was pretrained with, before scaling.
    pub original_max_position_embeddings: usize,
}

/// Shape and numerics of a Llama-architecture model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary (rows of the embedding matrix).
    pub vocab_size: usize,
    /// Width of the residual stream (`d_model`).
    pub hidden_size: usize,
    /// Inner width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer (fewer than query heads under grouped-query attention).
    pub num_key_value_heads: usize,
    /// Per-head dimension; `hidden_size / num_attention_heads` when the source does not say.
    pub head_dim: usize,
    /// Longest context the model supports, in tokens.
    pub max_position_embeddings: usize,
    /// Epsilon added to the mean square in RMSNorm.
    pub rms_norm_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Llama-3.1 frequency scaling (None: plain RoPE).
    pub rope_scaling: Option<RopeScaling>,
    /// Output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Qwen2-style bias on the q, k and v projections.
    pub attention_bias: bool,
}
