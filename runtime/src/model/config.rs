//! Llama-family model configuration, as Hugging Face's `config.json` (`LlamaConfig`) defines it.
//!
//! Contract between the loaders (`crate::loader`, which fill it from `config.json` or GGUF metadata)
//! and the model (`crate::model`, which reads it). Field names follow Hugging Face.

use serde::{Deserialize, Serialize};

/// Llama-3.1 style RoPE frequency scaling (`rope_scaling` with `rope_type = "llama3"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Shape and numerics of a Llama-architecture model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head dimension; `hidden_size / num_attention_heads` when the source does not say.
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// Output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Qwen2-style bias on the q, k and v projections.
    pub attention_bias: bool,
}
