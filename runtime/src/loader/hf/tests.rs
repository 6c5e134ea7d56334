//! Hugging Face folder tests: a tiny Llama written to a temp folder (safetensors via the
//! `safetensors` crate's serializer, tokenizer.json by serializing the fixture GGUF's tokenizer),
//! loaded back whole and sharded, plus missing, truncated and mismatched files.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::loader::error::LoadError;
use crate::loader::tensor::HostData;
use crate::loader::{ChatMessage, load_model};

pub(super) const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 263,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": 2
}"#;

/// Name, shape and dtype of every tensor of the tiny model.
pub(super) fn tensor_specs() -> Vec<(String, Vec<usize>, Dtype)> {
    let p = "model.layers.0";
    vec![
        (
            "model.embed_tokens.weight".into(),
            vec![263, 32],
            Dtype::BF16,
        ),
        ("lm_head.weight".into(), vec![263, 32], Dtype::F16),
        ("model.norm.weight".into(), vec![32], Dtype::F32),
        (format!("{p}.input_layernorm.weight"), vec![32], Dtype::F32),
        (
            format!("{p}.post_attention_layernorm.weight"),
            vec![32],
            Dtype::F32,
        ),
        (
            format!("{p}.self_attn.q_proj.weight"),
            vec![32, 32],
            Dtype::F32,
        ),
        (
            format!("{p}.self_attn.k_proj.weight"),
            vec![16, 32],
            Dtype::F32,
        ),
        (
            format!("{p}.self_attn.v_proj.weight"),
            vec![16, 32],
            Dtype::F32,
        ),
        (
            format!("{p}.self_attn.o_proj.weight"),
            vec![32, 32],
            Dtype::F32,
        ),
        (
            format!("{p}.mlp.gate_proj.weight"),
            vec![64, 32],
            Dtype::F32,
        ),
        (format!("{p}.mlp.up_proj.weight"), vec![64, 32], Dtype::F32),
        (
            format!("{p}.mlp.down_proj.weight"),
            vec![32, 64],
            Dtype::F32,
        ),
    ]
}

/// Element `i` of tensor number `t`: distinct, exactly representable in bf16.
pub(super) fn value(t: usize, i: usize) -> f32 {
    ((t * 7 + i) % 64) as f32 / 16.0 - 2.0
}

fn bytes_of(t: usize, shape: &[usize], dtype: Dtype) -> Vec<u8> {
    let n: usize = shape.iter().product();
    (0..n)
        .flat_map(|i| match dtype {
            Dtype::F32 => value(t, i).to_le_bytes().to_vec(),
            Dtype::F16 => f16::from_f32(value(t, i)).to_le_bytes().to_vec(),
            Dtype::BF16 => bf16::from_f32(value(t, i)).to_le_bytes().to_vec(),
            Dtype::I32 => (i as i32).to_le_bytes().to_vec(),
            other => panic!("test does not write {other:?}"),
        })
        .collect()
}

/// Serializes `specs` (tensor number, name, shape, dtype) to a safetensors file.
fn write_safetensors(path: &Path, specs: &[(usize, String, Vec<usize>, Dtype)]) {
    let data: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = specs
        .iter()
        .map(|(t, n, s, d)| (n.clone(), s.clone(), *d, bytes_of(*t, s, *d)))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    let bytes = safetensors::serialize(views, None).expect("serialize");
    std::fs::write(path, bytes).expect("write safetensors");
}

/// A complete tiny model folder; `shards` > 1 splits the weights with an index.
pub(super) fn write_folder(dir: &Path, shards: usize) {
    std::fs::write(dir.join("config.json"), CONFIG).expect("config");
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/loader/fixtures/tiny_llama.gguf");
    let tiny = load_model(&gguf, false).expect("fixture loads");
    let json = tiny
        .tokenizer
        .inner()
        .to_string(false)
        .expect("tokenizer serializes");
    std::fs::write(dir.join("tokenizer.json"), json).expect("tokenizer.json");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
            "chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}"#,
    )
    .expect("tokenizer_config.json");
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .expect("generation_config.json");

    let specs: Vec<(usize, String, Vec<usize>, Dtype)> = tensor_specs()
        .into_iter()
        .enumerate()
        .map(|(t, (n, s, d))| (t, n, s, d))
        .collect();
    if shards == 1 {
        write_safetensors(&dir.join("model.safetensors"), &specs);
        return;
    }
    let mut weight_map = serde_json::Map::new();
    for k in 0..shards {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", k + 1);
        let part: Vec<_> = specs
            .iter()
            .filter(|s| s.0 % shards == k)
            .cloned()
            .collect();
        for s in &part {
            weight_map.insert(s.1.clone(), file.clone().into());
        }
        write_safetensors(&dir.join(&file), &part);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}

fn check_loaded(dir: &Path) {
    let m = load_model(dir, false).expect("folder loads");
    assert_eq!(m.config.head_dim, 8);
    assert_eq!(m.config.num_key_value_heads, 2);
    assert!(!m.config.tie_word_embeddings);
    for (t, (name, shape, dtype)) in tensor_specs().into_iter().enumerate() {
        let got = &m.tensors[&name];
        assert_eq!(got.shape, shape, "{name}");
        let want: Vec<f32> = (0..got.numel()).map(|i| value(t, i)).collect();
        let kind_ok = matches!(
            (&got.data, dtype),
            (HostData::F32(_), Dtype::F32)
                | (HostData::F16(_), Dtype::F16)
                | (HostData::BF16(_), Dtype::BF16)
        );
        assert!(kind_ok, "{name} keeps its dtype");
        assert_eq!(got.to_f32(), want, "{name}");
    }
    assert_eq!(m.eos_token_ids, vec![2, 0], "generation_config.json wins");
    assert_eq!(m.bos_token_id, Some(1));
    assert!(!m.add_bos);
    let chat = m.chat_template.as_ref().expect("template");
    assert_eq!(
        chat.apply(&[ChatMessage::new("user", "hi")], false)
            .expect("renders"),
        "[user]hi<|im_end|>"
    );
    assert_eq!(
        m.tokenizer.encode("the the", false).expect("encodes").len(),
        2
    );
    assert!(m.source_files.iter().any(|f| f.ends_with("config.json")));
}

#[test]
fn loads_a_single_file_and_a_sharded_folder() {
    for shards in [1, 3] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_folder(dir.path(), shards);
        check_loaded(dir.path());
    }
}

fn error_for(setup: impl FnOnce(&Path)) -> LoadError {
    let dir = tempfile::tempdir().expect("tempdir");
    write_folder(dir.path(), 1);
    setup(dir.path());
    load_model(dir.path(), false).expect_err("broken folder must not load")
}

fn st(dir: &Path) -> PathBuf {
    dir.join("model.safetensors")
}

#[test]
fn broken_folders_give_errors_naming_file_and_problem() {
    let e = error_for(|d| std::fs::remove_file(d.join("config.json")).expect("rm"));
    assert!(
        matches!(e, LoadError::Missing { .. }) && e.to_string().contains("config.json"),
        "{e}"
    );

    let e = error_for(|d| std::fs::remove_file(d.join("tokenizer.json")).expect("rm"));
    assert!(e.to_string().contains("tokenizer.json"), "{e}");

    let e = error_for(|d| std::fs::remove_file(st(d)).expect("rm"));
    assert!(
        e.to_string().contains("model.safetensors: file not found"),
        "{e}"
    );

    let e = error_for(|d| {
        let bytes = std::fs::read(st(d)).expect("read");
        std::fs::write(st(d), &bytes[..bytes.len() - 10]).expect("truncate");
    });
    assert!(matches!(e, LoadError::Truncated { .. }), "{e}");
    assert!(
        e.to_string().contains("model.safetensors: truncated"),
        "{e}"
    );

    let e = error_for(|d| {
        let bytes = std::fs::read(st(d)).expect("read");
        std::fs::write(st(d), &bytes[..5]).expect("truncate");
    });
    assert!(matches!(e, LoadError::Truncated { .. }), "{e}");

    let e = error_for(|d| std::fs::write(st(d), b"\x10\0\0\0\0\0\0\0garbage garbage!").expect("w"));
    assert!(e.to_string().contains("invalid safetensors"), "{e}");

    let e = error_for(|d| {
        let mut specs: Vec<_> = tensor_specs()
            .into_iter()
            .enumerate()
            .map(|(t, (n, s, dt))| (t, n, s, dt))
            .collect();
        specs[5].2 = vec![32, 31]; // q_proj
        write_safetensors(&st(d), &specs);
    });
    assert!(matches!(e, LoadError::Shape { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("q_proj.weight: shape [32, 31], expected [32, 32]"),
        "{e}"
    );

    let e = error_for(|d| {
        let mut specs: Vec<_> = tensor_specs()
            .into_iter()
            .enumerate()
            .map(|(t, (n, s, dt))| (t, n, s, dt))
            .collect();
        specs[2].3 = Dtype::I32; // model.norm.weight
        write_safetensors(&st(d), &specs);
    });
    assert!(matches!(e, LoadError::Dtype { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("model.norm.weight: unsupported dtype I32"),
        "{e}"
    );

    let e = error_for(|d| {
        let specs: Vec<_> = tensor_specs()
            .into_iter()
            .enumerate()
            .filter(|(_, (n, _, _))| n != "lm_head.weight")
            .map(|(t, (n, s, dt))| (t, n, s, dt))
            .collect();
        write_safetensors(&st(d), &specs);
    });
    assert!(matches!(e, LoadError::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains("lm_head.weight"), "{e}");

    let e = error_for(|d| std::fs::write(d.join("config.json"), "{\"hidden_size\": ").expect("w"));
    assert!(e.to_string().contains("config.json: bad metadata"), "{e}");
}

#[test]
fn sharded_index_naming_a_missing_shard_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_folder(dir.path(), 2);
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).expect("rm");
    let e = load_model(dir.path(), false).expect_err("missing shard");
    assert!(
        e.to_string()
            .contains("model-00002-of-00002.safetensors: file not found"),
        "{e}"
    );
}
