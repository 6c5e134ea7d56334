//! A compressed-tensors FP8 folder (the tiny model of `tests.rs` with its seven projections in
//! F8_E4M3, scales per channel in bf16 or per tensor in f32, in another shard than their weights)
//! loads into FP8 rows, and the CPU model read from it equals the one read from its f32 values.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::tests::{CONFIG, tensor_specs, value, write_folder};
use crate::backend::cpu::CpuBackend;
use crate::loader::fp8::e4m3_to_f32;
use crate::loader::tensor::{HostData, HostTensor};
use crate::loader::{LoadedModel, load_model};
use crate::model::LlamaModel;
use crate::model::batch::SeqChunk;

/// Code `i` of projection `t`: every finite e4m3 code appears (0x7f and 0xff are NaN).
fn code(t: usize, i: usize) -> u8 {
    let c = ((t * 7 + i) % 254) as u8;
    if c >= 0x7f { c + 1 } else { c }
}

/// Row `r`'s scale of projection `t` (k_proj has one scale for the tensor).
fn scale(t: usize, r: usize, per_tensor: bool) -> f32 {
    let r = if per_tensor { 0 } else { r };
    (1 + (t + r) % 5) as f32 / 64.0
}

/// Name, shape, dtype and bytes of the tensors of one shard.
type Shard = Vec<(String, Vec<usize>, Dtype, Vec<u8>)>;

fn write_shard(path: &Path, tensors: &Shard) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).expect("ser")).expect("write");
}

/// Turns the tiny folder in `dir` into an FP8 checkpoint: weights in shard 1, scales in shard 2.
fn write_fp8_folder(dir: &Path) {
    write_folder(dir, 1);
    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    let mut config: serde_json::Value = serde_json::from_str(CONFIG).expect("config");
    config["quantization_config"] = serde_json::json!({
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "dynamic": true}}},
        "ignore": ["lm_head"], "kv_cache_scheme": null});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let (mut weights, mut scales) = (Shard::new(), Shard::new());
    for (t, (name, shape, dtype)) in tensor_specs().into_iter().enumerate() {
        let n: usize = shape.iter().product();
        if !name.contains("_proj.") {
            let bytes = (0..n)
                .flat_map(|i| match dtype {
                    Dtype::F32 => value(t, i).to_le_bytes().to_vec(),
                    Dtype::F16 => half::f16::from_f32(value(t, i)).to_le_bytes().to_vec(),
                    _ => half::bf16::from_f32(value(t, i)).to_le_bytes().to_vec(),
                })
                .collect();
            weights.push((name, shape, dtype, bytes));
            continue;
        }
        let rows = shape[0];
        let codes = (0..n).map(|i| code(t, i)).collect();
        let scale_name = format!("{name}_scale");
        if name.contains("k_proj") {
            let s = scale(t, 0, true).to_le_bytes().to_vec();
            scales.push((scale_name, vec![1], Dtype::F32, s));
        } else {
            let s = (0..rows)
                .flat_map(|r| half::bf16::from_f32(scale(t, r, false)).to_le_bytes())
                .collect();
            scales.push((scale_name, vec![rows, 1], Dtype::BF16, s));
        }
        weights.push((name, shape, Dtype::F8_E4M3, codes));
    }
    let mut weight_map = serde_json::Map::new();
    for (file, shard) in [("w.safetensors", &weights), ("s.safetensors", &scales)] {
        write_shard(&dir.join(file), shard);
        for (n, ..) in shard.iter() {
            weight_map.insert(n.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}

fn last_logits(m: &LoadedModel, tensors: &HashMap<String, HostTensor>) -> Vec<f32> {
    let model = LlamaModel::new(CpuBackend::with_threads(1), &m.config, tensors).expect("model");
    let mut kv = model.new_kv_cache(4, 16).expect("kv");
    let prompt: Vec<u32> = (0..9).map(|i| (i * 29 + 3) % 263).collect();
    let table = [0u32, 1];
    let chunk = SeqChunk {
        tokens: &prompt,
        start_pos: 0,
        block_table: &table,
    };
    model.forward(&mut kv, &[chunk]).expect("forward")
}

#[test]
fn an_fp8_checkpoint_loads_into_fp8_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fp8_folder(dir.path());
    let m = load_model(dir.path(), false).expect("FP8 folder loads");
    let mut projections = 0;
    for (t, (name, shape, _)) in tensor_specs().into_iter().enumerate() {
        let got = &m.tensors[&name];
        assert_eq!(got.shape, shape, "{name}");
        if !name.contains("_proj.") {
            assert!(!matches!(got.data, HostData::Fp8(_)), "{name}");
            continue;
        }
        projections += 1;
        let HostData::Fp8(rows) = &got.data else {
            panic!("{name} is not FP8");
        };
        let per_tensor = name.contains("k_proj");
        let cols = shape[1];
        let want: Vec<f32> = (0..got.numel())
            .map(|i| e4m3_to_f32(code(t, i)) * scale(t, i / cols, per_tensor))
            .collect();
        assert_eq!(rows.to_f32(), want, "{name}");
    }
    assert_eq!(projections, 7);
    assert!(!m.tensors.keys().any(|n| n.ends_with("_scale")));

    // q/k/v and gate/up concatenate as FP8 rows, each row keeping its scale: the model equals the
    // one read from the same values in f32.
    let widened: HashMap<String, HostTensor> = m
        .tensors
        .iter()
        .map(|(n, t)| {
            let data = HostData::F32(t.to_f32());
            let shape = t.shape.clone();
            (n.clone(), HostTensor { shape, data })
        })
        .collect();
    let (a, b) = (last_logits(&m, &m.tensors), last_logits(&m, &widened));
    assert!(a.iter().all(|x| x.is_finite()));
    assert_eq!(a, b);
}

#[test]
fn unsupported_quantization_is_refused_before_the_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fp8_folder(dir.path());
    let mut config: serde_json::Value = serde_json::from_str(CONFIG).expect("config");
    config["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4});
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    let e = load_model(dir.path(), false).expect_err("AWQ refused");
    assert!(
        e.to_string()
            .contains(r#"quant_method "awq" is not supported"#),
        "{e}"
    );

    // Without a quantization_config the FP8 tensors still need their scales.
    std::fs::write(dir.path().join("config.json"), CONFIG).expect("config");
    std::fs::write(dir.path().join("s.safetensors"), b"").expect("empty");
    let e = load_model(dir.path(), false).expect_err("scales shard broken");
    assert!(e.to_string().contains("s.safetensors"), "{e}");
}
