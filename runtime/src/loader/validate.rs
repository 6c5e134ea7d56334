//! Checks a loaded tensor map against the shapes a [`LlamaConfig`] implies, so a mismatched file
//! fails at load time with the tensor's name instead of deep inside the forward pass.

use std::collections::HashMap;
use std::path::Path;

use super::error::LoadError;
use super::tensor::HostTensor;
use crate::loader::config::LlamaConfig;

/// Every tensor the Llama architecture needs, with its Hugging Face name and shape.
pub fn expected_tensors(c: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let q = c.num_attention_heads * c.head_dim;
    let kv = c.num_key_value_heads * c.head_dim;
    let mut out = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![c.vocab_size, c.hidden_size],
        ),
        ("model.norm.weight".to_string(), vec![c.hidden_size]),
    ];
    if !c.tie_word_embeddings {
        out.push((
            "lm_head.weight".to_string(),
            vec![c.vocab_size, c.hidden_size],
        ));
    }
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let mut layer = vec![
            (format!("{p}.input_layernorm.weight"), vec![c.hidden_size]),
            (
                format!("{p}.post_attention_layernorm.weight"),
                vec![c.hidden_size],
            ),
            (
                format!("{p}.self_attn.q_proj.weight"),
                vec![q, c.hidden_size],
            ),
            (
                format!("{p}.self_attn.k_proj.weight"),
                vec![kv, c.hidden_size],
            ),
            (
                format!("{p}.self_attn.v_proj.weight"),
                vec![kv, c.hidden_size],
            ),
            (
                format!("{p}.self_attn.o_proj.weight"),
                vec![c.hidden_size, q],
            ),
            (
                format!("{p}.mlp.gate_proj.weight"),
                vec![c.intermediate_size, c.hidden_size],
            ),
            (
                format!("{p}.mlp.up_proj.weight"),
                vec![c.intermediate_size, c.hidden_size],
            ),
            (
                format!("{p}.mlp.down_proj.weight"),
                vec![c.hidden_size, c.intermediate_size],
            ),
        ];
        if c.attention_bias {
            layer.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            layer.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            layer.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.extend(layer);
    }
    out
}

/// Fails with the first missing tensor or wrong shape; `path` names the model in the error.
pub fn check_tensors(
    path: &Path,
    config: &LlamaConfig,
    tensors: &HashMap<String, HostTensor>,
) -> Result<(), LoadError> {
    for (name, shape) in expected_tensors(config) {
        match tensors.get(&name) {
            None => {
                return Err(LoadError::MissingTensor {
                    path: path.to_path_buf(),
                    tensor: name,
                });
            }
            Some(t) if t.shape != shape => {
                return Err(LoadError::Shape {
                    path: path.to_path_buf(),
                    tensor: name,
                    actual: t.shape.clone(),
                    expected: shape,
                });
            }
            Some(t) if t.numel() != host_len(t) => {
                return Err(LoadError::Shape {
                    path: path.to_path_buf(),
                    tensor: name,
                    actual: vec![host_len(t)],
                    expected: shape,
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn host_len(t: &HostTensor) -> usize {
    t.data.len()
}
