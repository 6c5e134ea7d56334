//! Weights of a Llama model on a backend, gathered from Hugging Face-named host tensors.
//!
//! Every tensor's shape is checked against the configuration before upload. The q/k/v
//! projections are concatenated into one `[(H + 2*KVH) * D, hidden]` matrix and gate/up into one
//! `[2 * F, hidden]` matrix (the fused layout the backend ops read, see `crate::backend`), so a
//! layer runs four matrix products instead of seven.

use std::collections::HashMap;

use crate::backend::Backend;
use crate::loader::tensor::{HostData, HostTensor};

use super::config::LlamaConfig;
use super::error::ModelError;

/// One decoder layer's weights in backend memory.
pub struct LayerWeights<B: Backend> {
    /// `[hidden]` f32.
    pub input_norm: B::Buffer,
    /// `[(H + 2*KVH) * D, hidden]`: q rows, then k rows, then v rows.
    pub qkv: B::Buffer,
    /// `[(H + 2*KVH) * D]` f32, when the model has attention bias (Qwen2).
    pub qkv_bias: Option<B::Buffer>,
    /// `[hidden, H * D]`.
    pub o_proj: B::Buffer,
    /// `[hidden]` f32.
    pub post_norm: B::Buffer,
    /// `[2 * F, hidden]`: gate rows, then up rows.
    pub gate_up: B::Buffer,
    /// `[hidden, F]`.
    pub down: B::Buffer,
}

/// All weights of the model in backend memory.
pub struct ModelWeights<B: Backend> {
    /// `[vocab, hidden]`.
    pub embed: B::Buffer,
    pub layers: Vec<LayerWeights<B>>,
    /// `[hidden]` f32.
    pub final_norm: B::Buffer,
    /// `[vocab, hidden]`; `None` when the head is tied to `embed`.
    pub lm_head: Option<B::Buffer>,
}

/// Looks up a tensor and checks its shape.
fn tensor<'a>(
    weights: &'a HashMap<String, HostTensor>,
    name: &str,
    shape: &[usize],
) -> Result<&'a HostTensor, ModelError> {
    let t = weights.get(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    if t.shape != shape {
        return Err(ModelError::WrongShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: t.shape.clone(),
        });
    }
    let len = match &t.data {
        HostData::F32(v) => v.len(),
        HostData::F16(v) => v.len(),
        HostData::BF16(v) => v.len(),
    };
    if len != t.numel() {
        return Err(ModelError::WrongShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: vec![len],
        });
    }
    Ok(t)
}

/// Concatenates row-major tensors along their first axis (all share the trailing dims). Keeps the
/// common dtype, or widens to f32 when the parts differ.
fn concat_rows(parts: &[&HostTensor]) -> HostTensor {
    let rows: usize = parts.iter().map(|t| t.shape[0]).sum();
    let mut shape = parts[0].shape.clone();
    shape[0] = rows;
    let data = match parts.iter().map(|t| &t.data).collect::<Vec<_>>().as_slice() {
        all if all.iter().all(|d| matches!(d, HostData::F16(_))) => HostData::F16(
            all.iter()
                .flat_map(|d| {
                    if let HostData::F16(v) = d {
                        v.as_slice()
                    } else {
                        &[]
                    }
                })
                .copied()
                .collect(),
        ),
        all if all.iter().all(|d| matches!(d, HostData::BF16(_))) => HostData::BF16(
            all.iter()
                .flat_map(|d| {
                    if let HostData::BF16(v) = d {
                        v.as_slice()
                    } else {
                        &[]
                    }
                })
                .copied()
                .collect(),
        ),
        _ => HostData::F32(parts.iter().flat_map(|t| t.to_f32()).collect()),
    };
    HostTensor { shape, data }
}

impl<B: Backend> ModelWeights<B> {
    /// Checks and uploads every tensor `config` calls for.
    pub fn load(
        backend: &B,
        config: &LlamaConfig,
        weights: &HashMap<String, HostTensor>,
    ) -> Result<Self, ModelError> {
        let c = config;
        let hidden = c.hidden_size;
        let (q_rows, kv_rows) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let f32_vec = |name: &str, len: usize| -> Result<B::Buffer, ModelError> {
            Ok(backend.upload_f32(&tensor(weights, name, &[len])?.to_f32())?)
        };
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<B::Buffer, ModelError> {
            Ok(backend.upload_weight(tensor(weights, name, &[rows, cols])?)?)
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = |w: &str| format!("{p}.self_attn.{w}_proj.weight");
            let q = tensor(weights, &attn("q"), &[q_rows, hidden])?;
            let k = tensor(weights, &attn("k"), &[kv_rows, hidden])?;
            let v = tensor(weights, &attn("v"), &[kv_rows, hidden])?;
            let qkv_bias = if c.attention_bias {
                let bias = |w: &str, len: usize| -> Result<Vec<f32>, ModelError> {
                    Ok(tensor(weights, &format!("{p}.self_attn.{w}_proj.bias"), &[len])?.to_f32())
                };
                let mut b = bias("q", q_rows)?;
                b.extend(bias("k", kv_rows)?);
                b.extend(bias("v", kv_rows)?);
                Some(backend.upload_f32(&b)?)
            } else {
                None
            };
            let mlp = |w: &str| format!("{p}.mlp.{w}_proj.weight");
            let gate = tensor(weights, &mlp("gate"), &[c.intermediate_size, hidden])?;
            let up = tensor(weights, &mlp("up"), &[c.intermediate_size, hidden])?;
            layers.push(LayerWeights {
                input_norm: f32_vec(&format!("{p}.input_layernorm.weight"), hidden)?,
                qkv: backend.upload_weight(&concat_rows(&[q, k, v]))?,
                qkv_bias,
                o_proj: matrix(&attn("o"), hidden, q_rows)?,
                post_norm: f32_vec(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
                gate_up: backend.upload_weight(&concat_rows(&[gate, up]))?,
                down: matrix(&mlp("down"), hidden, c.intermediate_size)?,
            });
        }
        Ok(ModelWeights {
            embed: matrix("model.embed_tokens.weight", c.vocab_size, hidden)?,
            layers,
            final_norm: f32_vec("model.norm.weight", hidden)?,
            lm_head: if c.tie_word_embeddings {
                None
            } else {
                Some(matrix("lm_head.weight", c.vocab_size, hidden)?)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn concat_rows_keeps_a_common_dtype_and_widens_mixed_ones() {
        let a = HostTensor {
            shape: vec![1, 2],
            data: HostData::BF16(vec![bf16::ONE, bf16::ZERO]),
        };
        let b = HostTensor {
            shape: vec![2, 2],
            data: HostData::BF16(vec![bf16::ZERO; 4]),
        };
        let c = concat_rows(&[&a, &b]);
        assert_eq!(c.shape, vec![3, 2]);
        assert!(matches!(c.data, HostData::BF16(ref v) if v.len() == 6 && v[0] == bf16::ONE));
        let f = HostTensor {
            shape: vec![1, 2],
            data: HostData::F32(vec![2.0, 3.0]),
        };
        let mixed = concat_rows(&[&a, &f]);
        assert_eq!(mixed.to_f32(), vec![1.0, 0.0, 2.0, 3.0]);
    }

    #[test]
    fn tensor_reports_missing_and_misshapen_tensors() {
        let mut w = HashMap::new();
        w.insert(
            "x".to_string(),
            HostTensor {
                shape: vec![2, 3],
                data: HostData::F32(vec![0.0; 6]),
            },
        );
        assert!(matches!(
            tensor(&w, "y", &[2, 3]),
            Err(ModelError::MissingTensor { .. })
        ));
        assert!(matches!(
            tensor(&w, "x", &[3, 2]),
            Err(ModelError::WrongShape { .. })
        ));
        assert!(tensor(&w, "x", &[2, 3]).is_ok());
    }
}
