//! [`LlamaConfig`] from GGUF metadata (`llama.*` keys, as llama.cpp's converter writes them).
//!
//! Design: key names from `gguf.constants.Keys` (gguf-py 0.19.0) with `{arch}` = the file's
//! `general.architecture` (llama-architecture files only). The vocabulary size is the length of
//! `tokenizer.ggml.tokens` (`{arch}.vocab_size` when the list is absent). Llama-3.1 RoPE scaling is
//! stored by llama.cpp as a `rope_freqs` tensor of per-frequency divisors rather than as keys; it
//! is turned back into [`RopeScaling`] in [`rope_scaling_from_freqs`].

use std::path::Path;

use super::reader::Gguf;
use crate::loader::config::{LlamaConfig, RopeScaling};
use crate::loader::error::LoadError;

/// Architectures whose tensors and metadata follow the Llama layout.
const LLAMA_LIKE: &[&str] = &["llama"];

/// Reads the model configuration from `g`'s metadata. `has_output` says whether the file has its
/// own `output.weight` (else the head is tied to the embedding); `has_qkv_bias` whether the
/// attention projections carry biases.
pub fn llama_config(
    g: &Gguf<'_>,
    has_output: bool,
    has_qkv_bias: bool,
) -> Result<LlamaConfig, LoadError> {
    let path = g.path.as_path();
    let arch = g
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| LoadError::metadata(path, "missing general.architecture"))?;
    if !LLAMA_LIKE.contains(&arch) {
        return Err(LoadError::metadata(
            path,
            format!("architecture {arch:?} is not supported (only {LLAMA_LIKE:?})"),
        ));
    }
    let int = |key: &str| -> Result<usize, LoadError> {
        let full = format!("{arch}.{key}");
        g.get(&full)
            .and_then(|v| v.as_u64())
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| LoadError::metadata(path, format!("missing or non-integer {full}")))
    };
    let opt_float = |key: &str| g.get(&format!("{arch}.{key}")).and_then(|v| v.as_f64());

    let hidden_size = int("embedding_length")?;
    let num_attention_heads = int("attention.head_count")?;
    let num_key_value_heads = int("attention.head_count_kv").unwrap_or(num_attention_heads);
    if num_attention_heads == 0
        || num_key_value_heads == 0
        || !num_attention_heads.is_multiple_of(num_key_value_heads)
    {
        return Err(LoadError::metadata(
            path,
            format!(
                "head counts {num_attention_heads}/{num_key_value_heads} are not a valid GQA split"
            ),
        ));
    }
    let head_dim = int("attention.key_length").unwrap_or(hidden_size / num_attention_heads);
    let vocab_size = match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        Some(tokens) => tokens.len(),
        None => int("vocab_size")?,
    };
    let rms_norm_eps = opt_float("attention.layer_norm_rms_epsilon").ok_or_else(|| {
        LoadError::metadata(
            path,
            format!("missing {arch}.attention.layer_norm_rms_epsilon"),
        )
    })? as f32;

    Ok(LlamaConfig {
        vocab_size,
        hidden_size,
        intermediate_size: int("feed_forward_length")?,
        num_hidden_layers: int("block_count")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: int("context_length")?,
        rms_norm_eps,
        rope_theta: opt_float("rope.freq_base").unwrap_or(10_000.0) as f32,
        rope_scaling: None,
        tie_word_embeddings: !has_output,
        attention_bias: has_qkv_bias,
    })
}

/// Llama-3.1 RoPE scaling recovered from llama.cpp's `rope_freqs` tensor (one divisor per
/// frequency, `head_dim / 2` of them). The divisors are recomputed for the published Llama-3.x
/// settings (`low_freq_factor` 1, `high_freq_factor` 4, original context 8192, `factor` the
/// largest divisor) and accepted only if they match; anything else is reported as unsupported.
pub fn rope_scaling_from_freqs(
    path: &Path,
    freqs: &[f32],
    head_dim: usize,
    rope_theta: f32,
) -> Result<RopeScaling, LoadError> {
    let candidate = RopeScaling {
        factor: freqs.iter().copied().fold(1.0, f32::max),
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let expected = llama3_divisors(&candidate, head_dim, rope_theta);
    let matches = expected.len() == freqs.len()
        && expected
            .iter()
            .zip(freqs)
            .all(|(e, f)| (e - f).abs() <= 1e-3 * e.abs().max(1.0));
    if matches {
        Ok(candidate)
    } else {
        Err(LoadError::metadata(
            path,
            "rope_freqs tensor does not match Llama-3 style scaling (low 1, high 4, 8192); \
             this RoPE scaling is not supported",
        ))
    }
}

/// The per-frequency divisors llama.cpp's converter writes for Llama-3 scaling
/// (`LlamaModel.generate_extra_tensors` in convert_hf_to_gguf.py).
pub fn llama3_divisors(s: &RopeScaling, head_dim: usize, rope_theta: f32) -> Vec<f32> {
    let old_context = s.original_max_position_embeddings as f64;
    let low_freq_wavelen = old_context / f64::from(s.low_freq_factor);
    let high_freq_wavelen = old_context / f64::from(s.high_freq_factor);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(rope_theta).powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                f64::from(s.factor)
            } else {
                let smooth = (old_context / wavelen - f64::from(s.low_freq_factor))
                    / f64::from(s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / f64::from(s.factor) + smooth)
            };
            divisor as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama31_rope_freqs_round_trip_and_others_are_refused() {
        let s = RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let freqs = llama3_divisors(&s, 128, 500_000.0);
        assert_eq!(freqs.len(), 64);
        assert_eq!(freqs[0], 1.0);
        assert_eq!(freqs[63], 8.0);
        let got = rope_scaling_from_freqs(Path::new("m.gguf"), &freqs, 128, 500_000.0)
            .expect("llama 3.1 divisors are recognized");
        assert_eq!(got, s);
        let mut odd = freqs.clone();
        odd[40] *= 1.5;
        assert!(rope_scaling_from_freqs(Path::new("m.gguf"), &odd, 128, 500_000.0).is_err());
    }
}
