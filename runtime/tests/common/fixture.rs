//! Reads the tiny-random parity fixtures written by `tests/fixtures/make_parity.py`:
//! `config.json` (transformers 5 layout, `rope_parameters` or `rope_scaling`), `model.safetensors`
//! (f32 weights, Hugging Face names) and `expected.safetensors` (prompts and transformers' logits).
//!
//! Read here with `serde_json` and `safetensors` directly, independently of `sov::loader`, so the
//! parity tests check the model against transformers without depending on the loader's code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use sov::loader::tensor::{HostData, HostTensor};
use sov::model::config::{LlamaConfig, RopeScaling};

/// One fixture: configuration, weights and reference prompts.
pub struct Fixture {
    pub config: LlamaConfig,
    pub weights: HashMap<String, HostTensor>,
    /// `(tokens [len], logits [len, vocab])` per prompt.
    pub prompts: Vec<(Vec<u32>, Vec<f32>)>,
}

/// Directory of fixture `name`.
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn f32s(view: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    assert_eq!(view.dtype(), Dtype::F32);
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("config.json: missing number {key}"))
}

/// Parses the fixture's `config.json`.
pub fn read_config(dir: &Path) -> LlamaConfig {
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
    let v: Value = serde_json::from_str(&text).expect("config.json is JSON");
    let rope = v
        .get("rope_scaling")
        .filter(|r| !r.is_null())
        .or_else(|| v.get("rope_parameters"));
    let rope_theta = v
        .get("rope_theta")
        .and_then(Value::as_f64)
        .or_else(|| {
            rope.and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
        })
        .unwrap_or(10000.0) as f32;
    let rope_scaling = rope
        .filter(|r| r.get("rope_type").and_then(Value::as_str) == Some("llama3"))
        .map(|r| RopeScaling {
            factor: num(r, "factor") as f32,
            low_freq_factor: num(r, "low_freq_factor") as f32,
            high_freq_factor: num(r, "high_freq_factor") as f32,
            original_max_position_embeddings: num(r, "original_max_position_embeddings") as usize,
        });
    let usize_of = |k: &str| num(&v, k) as usize;
    LlamaConfig {
        vocab_size: usize_of("vocab_size"),
        hidden_size: usize_of("hidden_size"),
        intermediate_size: usize_of("intermediate_size"),
        num_hidden_layers: usize_of("num_hidden_layers"),
        num_attention_heads: usize_of("num_attention_heads"),
        num_key_value_heads: usize_of("num_key_value_heads"),
        head_dim: usize_of("head_dim"),
        max_position_embeddings: usize_of("max_position_embeddings"),
        rms_norm_eps: num(&v, "rms_norm_eps") as f32,
        rope_theta,
        rope_scaling,
        tie_word_embeddings: v
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        attention_bias: v
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

/// Reads every tensor of a safetensors file as f32 host tensors.
pub fn read_weights(path: &Path) -> HashMap<String, HostTensor> {
    let bytes = std::fs::read(path).expect("model.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                HostTensor {
                    shape: view.shape().to_vec(),
                    data: HostData::F32(f32s(&view)),
                },
            )
        })
        .collect()
}

/// Loads fixture `name`.
pub fn load(name: &str) -> Fixture {
    let dir = fixture_dir(name);
    let config = read_config(&dir);
    let weights = read_weights(&dir.join("model.safetensors"));
    let bytes = std::fs::read(dir.join("expected.safetensors")).expect("expected.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut prompts = Vec::new();
    for i in 0.. {
        let Ok(tokens) = st.tensor(&format!("tokens.{i}")) else {
            break;
        };
        assert_eq!(tokens.dtype(), Dtype::I32);
        let ids = tokens
            .data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect();
        let logits = f32s(
            &st.tensor(&format!("logits.{i}"))
                .expect("logits for every prompt"),
        );
        prompts.push((ids, logits));
    }
    assert!(!prompts.is_empty(), "{name}: no prompts");
    Fixture {
        config,
        weights,
        prompts,
    }
}

/// `||a - b|| / ||b||`.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den
}
