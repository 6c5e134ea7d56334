//! [`LlamaConfig`] from a Hugging Face `config.json`.
//!
//! Design: defaults are those of transformers' `LlamaConfig` (5.x): `num_key_value_heads` =
//! `num_attention_heads`, `head_dim` = `hidden_size / num_attention_heads`, `rope_theta` 10000,
//! `rms_norm_eps` 1e-6, `max_position_embeddings` 2048, `tie_word_embeddings` false,
//! `attention_bias` false. `rope_scaling` (or transformers 5's `rope_parameters`) of type `llama3`
//! becomes [`RopeScaling`]; `default` means none; other types are refused by name.

use std::path::Path;

use serde_json::Value;

use crate::loader::config::{LlamaConfig, RopeScaling};
use crate::loader::error::LoadError;

/// Model types whose config and weights follow the Llama layout.
const LLAMA_LIKE: &[&str] = &["llama"];

/// Parses `config.json` text; `path` names the file in errors.
pub fn parse_config(path: &Path, text: &str) -> Result<LlamaConfig, LoadError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| LoadError::metadata(path, format!("not valid JSON: {e}")))?;
    let bad = |m: String| LoadError::metadata(path, m);
    super::quant_config::check_quantization_config(path, &v)?;
    if let Some(t) = v.get("model_type").and_then(Value::as_str)
        && !LLAMA_LIKE.contains(&t)
    {
        return Err(bad(format!(
            "model_type {t:?} is not supported (only {LLAMA_LIKE:?})"
        )));
    }
    let opt_usize = |key: &str| -> Result<Option<usize>, LoadError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| bad(format!("{key} = {x} is not a non-negative integer"))),
        }
    };
    let usize_req = |key: &str| -> Result<usize, LoadError> {
        opt_usize(key)?.ok_or_else(|| bad(format!("missing {key}")))
    };
    let opt_f32 = |key: &str| -> Result<Option<f32>, LoadError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| bad(format!("{key} = {x} is not a number"))),
        }
    };
    let opt_bool = |key: &str| -> Result<Option<bool>, LoadError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(format!("{key} = {x} is not a boolean"))),
        }
    };

    if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
        && act != "silu"
    {
        return Err(bad(format!(
            "hidden_act {act:?} is not supported (Llama uses silu)"
        )));
    }
    if opt_bool("mlp_bias")? == Some(true) {
        return Err(bad("mlp_bias = true is not supported".into()));
    }
    let hidden_size = usize_req("hidden_size")?;
    let num_attention_heads = usize_req("num_attention_heads")?;
    let num_key_value_heads = opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
    if num_attention_heads == 0
        || num_key_value_heads == 0
        || !num_attention_heads.is_multiple_of(num_key_value_heads)
    {
        return Err(bad(format!(
            "head counts {num_attention_heads}/{num_key_value_heads} are not a valid GQA split"
        )));
    }
    let head_dim = opt_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads);
    let rope_params = v.get("rope_scaling").or_else(|| v.get("rope_parameters"));
    let rope_theta = opt_f32("rope_theta")?
        .or_else(|| {
            rope_params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Value::as_f64)
                .map(|f| f as f32)
        })
        .unwrap_or(10_000.0);

    Ok(LlamaConfig {
        vocab_size: usize_req("vocab_size")?,
        hidden_size,
        intermediate_size: usize_req("intermediate_size")?,
        num_hidden_layers: usize_req("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: opt_usize("max_position_embeddings")?.unwrap_or(2048),
        rms_norm_eps: opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta,
        rope_scaling: rope_scaling(path, rope_params)?,
        tie_word_embeddings: opt_bool("tie_word_embeddings")?.unwrap_or(false),
        attention_bias: opt_bool("attention_bias")?.unwrap_or(false),
    })
}

fn rope_scaling(path: &Path, p: Option<&Value>) -> Result<Option<RopeScaling>, LoadError> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(None),
        "llama3" => {
            let num = |key: &str| {
                p.get(key).and_then(Value::as_f64).ok_or_else(|| {
                    LoadError::metadata(
                        path,
                        format!("rope_scaling.{key} is missing or not a number"),
                    )
                })
            };
            Ok(Some(RopeScaling {
                factor: num("factor")? as f32,
                low_freq_factor: num("low_freq_factor")? as f32,
                high_freq_factor: num("high_freq_factor")? as f32,
                original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
            }))
        }
        other => Err(LoadError::metadata(
            path,
            format!("rope_scaling type {other:?} is not supported (only llama3)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama31_config_with_defaults_and_rope_scaling() {
        let text = r#"{
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "tie_word_embeddings": false
        }"#;
        let c = parse_config(Path::new("config.json"), text).expect("valid");
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.num_key_value_heads, 8);
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            })
        );
        assert!(!c.tie_word_embeddings && !c.attention_bias);

        let small = r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 256, "tie_word_embeddings": true}"#;
        let c = parse_config(Path::new("config.json"), small).expect("valid");
        assert_eq!((c.num_key_value_heads, c.head_dim), (4, 16));
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(c.tie_word_embeddings);
        assert!(c.rope_scaling.is_none());
    }

    /// `config.json` as transformers 5.17 writes it (`rope_parameters`, no top-level rope_theta).
    #[test]
    fn transformers5_rope_parameters() {
        let text = r#"{
          "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16,
          "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 64,
          "max_position_embeddings": 128, "mlp_bias": false, "model_type": "llama",
          "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
          "pad_token_id": null, "rms_norm_eps": 1e-05,
          "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 32, "rope_theta": 10000.0, "rope_type": "llama3"},
          "tie_word_embeddings": true, "transformers_version": "5.17.0", "vocab_size": 256
        }"#;
        let c = parse_config(Path::new("config.json"), text).expect("valid");
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32
            })
        );
        let default = text.replace(
            r#""factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 32, "rope_theta": 10000.0, "rope_type": "llama3""#,
            r#""rope_theta": 500000.0, "rope_type": "default""#,
        );
        let c = parse_config(Path::new("config.json"), &default).expect("valid");
        assert_eq!((c.rope_theta, c.rope_scaling), (500000.0, None));
        let gelu = text.replace(r#""silu""#, r#""gelu""#);
        assert!(parse_config(Path::new("config.json"), &gelu).is_err());
        let mlp_bias = text.replace(r#""mlp_bias": false"#, r#""mlp_bias": true"#);
        assert!(parse_config(Path::new("config.json"), &mlp_bias).is_err());
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let p = Path::new("/m/config.json");
        let e = parse_config(p, "{not json").unwrap_err().to_string();
        assert!(e.contains("/m/config.json") && e.contains("JSON"), "{e}");
        let e = parse_config(p, r#"{"hidden_size": 64}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing num_attention_heads"), "{e}");
        let e = parse_config(p, r#"{"model_type": "bert"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bert"), "{e}");
        let e = parse_config(
            p,
            r#"{"hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1,
                "num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 8}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("GQA"), "{e}");
        let e = parse_config(
            p,
            r#"{"hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1,
                "num_attention_heads": 4, "vocab_size": 8, "rope_scaling": {"type": "yarn"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("yarn"), "{e}");
    }
}
