//! Weights of a Llama model on a backend, gathered from Hugging Face-named host tensors.
//!
//! Every tensor's shape is checked against the configuration before upload. The q/k/v
//! projections are concatenated into one `[(H + 2*KVH) * D, hidden]` matrix and gate/up into one
//! `[2 * F, hidden]` matrix (the fused layout the backend ops read, see `crate::backend`), so a
//! layer runs four matrix products instead of seven.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;

use crate::backend::{Backend, ProjectionSite};
use crate::loader::tensor::{Fp8Rows, HostData, HostTensor, QuantData, QuantType};

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
    /// Per-layer weights, first layer first.
    pub layers: Vec<LayerWeights<B>>,
    /// `[hidden]` f32.
    pub final_norm: B::Buffer,
    /// `[vocab, hidden]`; `None` when the head is tied to `embed`.
    pub lm_head: Option<B::Buffer>,
}

/// Where the weights come from: borrowed (every upload copies) or owned (every tensor moves into
/// the backend and leaves the map as soon as it is uploaded, so host memory holds one copy).
pub enum TensorSource<'a> {
    /// Borrows the host tensors; each upload copies.
    Borrowed(&'a HashMap<String, HostTensor>),
    /// Owns the host tensors; each is removed from the map when it is uploaded.
    Owned(RefCell<HashMap<String, HostTensor>>),
}

impl<'a> TensorSource<'a> {
    /// Takes tensor `name`, checking that it exists and has `shape`.
    fn take(&self, name: &str, shape: &[usize]) -> Result<Cow<'a, HostTensor>, ModelError> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
        };
        let t = match self {
            TensorSource::Borrowed(m) => Cow::Borrowed(m.get(name).ok_or_else(missing)?),
            TensorSource::Owned(m) => Cow::Owned(m.borrow_mut().remove(name).ok_or_else(missing)?),
        };
        let wrong = |got: Vec<usize>| ModelError::WrongShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            got,
        };
        if t.shape != shape {
            return Err(wrong(t.shape.clone()));
        }
        let len = t.data.len();
        if len != t.numel() {
            return Err(wrong(vec![len]));
        }
        Ok(t)
    }
}

/// Uploads a weight, moving it when owned.
fn upload<B: Backend>(backend: &B, t: Cow<'_, HostTensor>) -> Result<B::Buffer, ModelError> {
    Ok(match t {
        Cow::Borrowed(t) => backend.upload_weight(t)?,
        Cow::Owned(t) => backend.upload_weight_owned(t)?,
    })
}

/// Concatenates row-major tensors along their first axis (all share the trailing dims). Keeps the
/// common dtype (quantized parts of one block type stay quantized: blocks run along rows, so rows
/// of blocks concatenate like rows of values; FP8 rows keep their own scales), or widens to f32
/// when the parts differ.
fn concat_rows(parts: &[&HostTensor]) -> HostTensor {
    let rows: usize = parts.iter().map(|t| t.shape[0]).sum();
    let mut shape = parts[0].shape.clone();
    shape[0] = rows;
    let quant_ty = match &parts[0].data {
        HostData::Quant(q) => Some(q.ty),
        _ => None,
    };
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
        all if all
            .iter()
            .all(|d| matches!(d, HostData::Quant(q) if Some(q.ty) == quant_ty)) =>
        {
            HostData::Quant(QuantData {
                ty: quant_ty.unwrap_or(QuantType::Q8_0),
                bytes: all
                    .iter()
                    .flat_map(|d| {
                        if let HostData::Quant(q) = d {
                            q.bytes.as_slice()
                        } else {
                            &[]
                        }
                    })
                    .copied()
                    .collect(),
            })
        }
        all if all.iter().all(|d| matches!(d, HostData::Fp8(_))) => {
            let rows: Vec<&Fp8Rows> = all
                .iter()
                .filter_map(|d| match d {
                    HostData::Fp8(r) => Some(r),
                    _ => None,
                })
                .collect();
            HostData::Fp8(Fp8Rows::concat_rows(&rows))
        }
        _ => HostData::F32(parts.iter().flat_map(|t| t.to_f32()).collect()),
    };
    HostTensor { shape, data }
}

impl<B: Backend> ModelWeights<B> {
    /// Checks and uploads every tensor `config` calls for.
    pub fn load(
        backend: &B,
        config: &LlamaConfig,
        weights: TensorSource<'_>,
    ) -> Result<Self, ModelError> {
        let c = config;
        let hidden = c.hidden_size;
        let (q_rows, kv_rows) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let f32_vec = |name: &str, len: usize| -> Result<B::Buffer, ModelError> {
            Ok(backend.upload_f32(&weights.take(name, &[len])?.to_f32())?)
        };
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<B::Buffer, ModelError> {
            upload(backend, weights.take(name, &[rows, cols])?)
        };
        // The linear products' weights, which a backend may quantize (`Backend::upload_projection`).
        let projection = |name: &str, dims: [usize; 2], site| -> Result<B::Buffer, ModelError> {
            let t = weights.take(name, &dims)?.into_owned();
            Ok(backend.upload_projection(t, site)?)
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let site = ProjectionSite {
                layer: i,
                layers: c.num_hidden_layers,
            };
            let p = format!("model.layers.{i}");
            let attn = |w: &str| format!("{p}.self_attn.{w}_proj.weight");
            let qkv = {
                let q = weights.take(&attn("q"), &[q_rows, hidden])?;
                let k = weights.take(&attn("k"), &[kv_rows, hidden])?;
                let v = weights.take(&attn("v"), &[kv_rows, hidden])?;
                concat_rows(&[&q, &k, &v])
            };
            let qkv_bias = if c.attention_bias {
                let bias = |w: &str, len: usize| -> Result<Vec<f32>, ModelError> {
                    let name = format!("{p}.self_attn.{w}_proj.bias");
                    Ok(weights.take(&name, &[len])?.to_f32())
                };
                let mut b = bias("q", q_rows)?;
                b.extend(bias("k", kv_rows)?);
                b.extend(bias("v", kv_rows)?);
                Some(backend.upload_f32(&b)?)
            } else {
                None
            };
            let mlp = |w: &str| format!("{p}.mlp.{w}_proj.weight");
            let gate_up = {
                let gate = weights.take(&mlp("gate"), &[c.intermediate_size, hidden])?;
                let up = weights.take(&mlp("up"), &[c.intermediate_size, hidden])?;
                concat_rows(&[&gate, &up])
            };
            layers.push(LayerWeights {
                input_norm: f32_vec(&format!("{p}.input_layernorm.weight"), hidden)?,
                qkv: backend.upload_projection(qkv, site)?,
                qkv_bias,
                o_proj: projection(&attn("o"), [hidden, q_rows], site)?,
                post_norm: f32_vec(&format!("{p}.post_attention_layernorm.weight"), hidden)?,
                gate_up: backend.upload_projection(gate_up, site)?,
                down: projection(&mlp("down"), [hidden, c.intermediate_size], site)?,
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
    fn concat_rows_keeps_quantized_blocks_of_one_type() {
        // Q8_0 rows of 32 values: d = 1.0 (f16 0x3c00), codes 0..32 and 32..64.
        let block = |base: u8| -> Vec<u8> {
            let mut b = vec![0x00, 0x3c];
            b.extend((0..32).map(|i| base + i));
            b
        };
        let q = |base: u8| HostTensor {
            shape: vec![1, 32],
            data: HostData::Quant(QuantData {
                ty: QuantType::Q8_0,
                bytes: block(base),
            }),
        };
        let c = concat_rows(&[&q(0), &q(32)]);
        assert_eq!(c.shape, vec![2, 32]);
        assert!(matches!(&c.data, HostData::Quant(d) if d.ty == QuantType::Q8_0));
        let want: Vec<f32> = (0..64).map(|i| i as f32).collect();
        assert_eq!(c.to_f32(), want);
        let f = HostTensor {
            shape: vec![1, 32],
            data: HostData::F32(vec![0.5; 32]),
        };
        assert!(matches!(concat_rows(&[&q(0), &f]).data, HostData::F32(_)));
    }

    #[test]
    fn take_reports_missing_and_misshapen_tensors() {
        let mut w = HashMap::new();
        let t = HostTensor {
            shape: vec![2, 3],
            data: HostData::F32(vec![0.0; 6]),
        };
        w.insert("x".to_string(), t);
        let src = TensorSource::Borrowed(&w);
        assert!(matches!(
            src.take("y", &[2, 3]),
            Err(ModelError::MissingTensor { .. })
        ));
        assert!(matches!(
            src.take("x", &[3, 2]),
            Err(ModelError::WrongShape { .. })
        ));
        assert!(matches!(src.take("x", &[2, 3]), Ok(Cow::Borrowed(_))));
        let owned = TensorSource::Owned(RefCell::new(w));
        assert!(matches!(owned.take("x", &[2, 3]), Ok(Cow::Owned(_))));
        assert!(
            matches!(
                owned.take("x", &[2, 3]),
                Err(ModelError::MissingTensor { .. })
            ),
            "moved out"
        );
    }
}
