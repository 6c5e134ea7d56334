//! `config.json`'s `quantization_config`: which quantized Hugging Face checkpoints sov reads, and a
//! clear refusal for the others.
//!
//! Design: sov reads the compressed-tensors FP8 scheme (`llm-compressor`'s FP8-dynamic: e4m3
//! weights with per-channel or per-tensor scales; inputs quantized per token at run time, or not
//! at all). The tensors themselves say which weights are FP8 (`crate::loader::fp8`), so this
//! module only checks the declared scheme; any other method (GPTQ, AWQ, bitsandbytes, block-wise
//! FP8, INT8, FP4) or static activation and KV-cache scales fail here, before gigabytes are read.

use std::path::Path;

use serde_json::Value;

use crate::loader::error::LoadError;

/// Fails unless `config` has no `quantization_config` or one sov can run (see the module doc).
pub fn check_quantization_config(path: &Path, config: &Value) -> Result<(), LoadError> {
    let q = match config.get("quantization_config") {
        None | Some(Value::Null) => return Ok(()),
        Some(q) => q,
    };
    let bad = |m: String| {
        LoadError::metadata(
            path,
            format!(
                "quantization_config: {m} (sov reads bf16, f16 and f32 weights, GGUF files, and \
                 compressed-tensors FP8 checkpoints with per-channel or per-tensor weight scales \
                 and dynamic per-token inputs)"
            ),
        )
    };
    let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let method = str_of(q, "quant_method").unwrap_or_default();
    if method != "compressed-tensors" {
        return Err(bad(format!("quant_method {method:?} is not supported")));
    }
    if let Some(format) = str_of(q, "format")
        && format != "float-quantized"
    {
        return Err(bad(format!("format {format:?} is not supported")));
    }
    if !matches!(q.get("kv_cache_scheme"), None | Some(Value::Null)) {
        return Err(bad(
            "a kv_cache_scheme (FP8 KV scales) is not supported".into()
        ));
    }
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no config_groups object".into()))?;
    for (name, g) in groups {
        let fp8 = |v: &Value| {
            str_of(v, "type").as_deref() == Some("float")
                && v.get("num_bits").and_then(Value::as_u64) == Some(8)
        };
        let w = g.get("weights").unwrap_or(&Value::Null);
        let strategy = str_of(w, "strategy").unwrap_or_default();
        if !fp8(w) || !matches!(strategy.as_str(), "channel" | "tensor") {
            return Err(bad(format!(
                "group {name:?}: weights {w} are not 8-bit float with channel or tensor scales"
            )));
        }
        match g.get("input_activations") {
            None | Some(Value::Null) => {}
            Some(a) if fp8(a) && a.get("dynamic").and_then(Value::as_bool) == Some(true) => {}
            Some(a) => {
                return Err(bad(format!(
                    "group {name:?}: input_activations {a} are not dynamic 8-bit float"
                )));
            }
        }
        if !matches!(g.get("output_activations"), None | Some(Value::Null)) {
            return Err(bad(format!(
                "group {name:?}: output activation quantization is not supported"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `quantization_config` of an llm-compressor FP8-dynamic Llama checkpoint.
    fn fp8_dynamic() -> Value {
        serde_json::json!({"quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": {"dynamic": true, "num_bits": 8, "strategy": "token",
                                      "symmetric": true, "type": "float"},
                "output_activations": null, "targets": ["Linear"],
                "weights": {"dynamic": false, "num_bits": 8, "strategy": "channel",
                            "symmetric": true, "type": "float"}}},
            "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"}})
    }

    fn error(edit: impl FnOnce(&mut Value)) -> String {
        let mut c = fp8_dynamic();
        edit(&mut c["quantization_config"]);
        check_quantization_config(Path::new("config.json"), &c)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn reads_fp8_dynamic_and_no_quantization() {
        let p = Path::new("config.json");
        check_quantization_config(p, &fp8_dynamic()).expect("FP8-dynamic");
        check_quantization_config(p, &serde_json::json!({"hidden_size": 8})).expect("none");
        let mut weight_only = fp8_dynamic();
        weight_only["quantization_config"]["config_groups"]["group_0"]["input_activations"] =
            Value::Null;
        check_quantization_config(p, &weight_only).expect("weight-only FP8");
    }

    #[test]
    fn refuses_other_schemes_with_their_names() {
        let e = error(|q| *q = serde_json::json!({"quant_method": "gptq", "bits": 4}));
        assert!(e.contains(r#"quant_method "gptq""#), "{e}");
        let e = error(|q| q["format"] = "pack-quantized".into());
        assert!(e.contains(r#"format "pack-quantized""#), "{e}");
        let e = error(|q| q["kv_cache_scheme"] = serde_json::json!({"num_bits": 8}));
        assert!(e.contains("kv_cache_scheme"), "{e}");
        let e = error(|q| q["config_groups"]["group_0"]["weights"]["strategy"] = "block".into());
        assert!(e.contains("channel or tensor scales"), "{e}");
        let e = error(|q| q["config_groups"]["group_0"]["weights"]["type"] = "int".into());
        assert!(e.contains("not 8-bit float"), "{e}");
        let e =
            error(|q| q["config_groups"]["group_0"]["input_activations"]["dynamic"] = false.into());
        assert!(e.contains("not dynamic 8-bit float"), "{e}");
    }
}
