//! Random-weight Llama models of a given shape: demos without any download (`tiny_random`),
//! throughput benchmarks of big shapes (`llama3_8b` without a checkpoint) and scheduling tests on
//! the real forward pass. Weights are N(0, 0.02)-like (uniform with that standard deviation), norm
//! weights 1, generated from a seed with the counter-based RNG, so a shape and seed always give
//! the same model.

use std::collections::HashMap;

use half::bf16;
use rayon::prelude::*;

use crate::loader::tensor::{HostData, HostTensor};
use crate::loader::validate::expected_tensors;
use crate::model::config::{LlamaConfig, RopeScaling};

/// Element type of generated weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// f32 weights.
    F32,
    /// bf16 weights.
    BF16,
}

/// A tiny Llama (2 layers, hidden 64, GQA 4/2, vocab 512): runs anywhere in milliseconds.
pub fn tiny_config() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 512,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        max_position_embeddings: 2048,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

/// Meta-Llama-3-8B's shape (config.json of the Hugging Face release).
pub fn llama3_8b_config() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 128_256,
        hidden_size: 4096,
        intermediate_size: 14_336,
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        max_position_embeddings: 8192,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: None::<RopeScaling>,
        tie_word_embeddings: false,
        attention_bias: false,
    }
}

/// Uniform in [-a, a) for element `i` of the stream `seed`.
fn uniform(seed: u64, i: u64, a: f32) -> f32 {
    let u = (bits_at(seed, i) >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
    (2.0 * u - 1.0) * a
}

/// Every tensor `config` needs, named as Hugging Face names them.
pub fn random_weights(
    config: &LlamaConfig,
    seed: u64,
    dtype: WeightDtype,
) -> HashMap<String, HostTensor> {
    // Uniform on [-a, a) has standard deviation a / sqrt(3).
    let a = 0.02 * 3f32.sqrt();
    expected_tensors(config)
        .into_iter()
        .enumerate()
        .map(|(t, (name, shape))| {
            let n: usize = shape.iter().product();
            let stream = seed.wrapping_mul(0x1000_0000).wrapping_add(t as u64);
            let is_norm = shape.len() == 1 && name.ends_with("norm.weight");
            let value = |i: usize| {
                if is_norm {
                    1.0
                } else {
                    uniform(stream, i as u64, a)
                }
            };
            let data = match dtype {
                WeightDtype::F32 => HostData::F32((0..n).into_par_iter().map(value).collect()),
                WeightDtype::BF16 => HostData::BF16(
                    (0..n)
                        .into_par_iter()
                        .map(|i| bf16::from_f32(value(i)))
                        .collect(),
                ),
            };
            (name, HostTensor { shape, data })
        })
        .collect()
}

// The counter-based generator behind the random weights, shared with the engine's sampler
// (`engine::rng`): SplitMix64's finalizer (Steele, Lea, Flood 2014) applied to a Weyl sequence keyed
// by the seed, twice, as in counter-based generators (Salmon et al. 2011).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix64_finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 64 random bits for draw `counter` of stream `seed`.
pub fn bits_at(seed: u64, counter: u64) -> u64 {
    let keyed = splitmix64_finalize(seed ^ 0x5EED_5EED_5EED_5EED);
    splitmix64_finalize(
        splitmix64_finalize(keyed.wrapping_add(counter.wrapping_mul(GOLDEN))) ^ keyed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_cover_the_config_and_are_deterministic() {
        let c = tiny_config();
        let w = random_weights(&c, 1, WeightDtype::F32);
        assert!(
            crate::loader::validate::check_tensors(std::path::Path::new("random"), &c, &w).is_ok()
        );
        let again = random_weights(&c, 1, WeightDtype::F32);
        let other = random_weights(&c, 2, WeightDtype::F32);
        let q = "model.layers.0.self_attn.q_proj.weight";
        assert_eq!(w[q].to_f32(), again[q].to_f32());
        assert_ne!(w[q].to_f32(), other[q].to_f32());
        let v = w[q].to_f32();
        let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.002, "std {std}");
    }
}
