//! GGUF tests against fixtures written by the reference implementation (`gguf` 0.19.0, see
//! `../fixtures/make_gguf_fixtures.py`), plus malformed-file cases.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value;

use super::reader::{Gguf, MetaValue};
use super::types::GgmlType;
use super::{dequant, load_gguf};
use crate::loader::error::LoadError;
use crate::loader::tensor::HostData;
use crate::loader::{ChatMessage, load_model};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/loader/fixtures")
        .join(name)
}

fn read_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).expect("fixture json readable");
    serde_json::from_str(&text).expect("fixture json valid")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// `data` equals the reference values after storing them in `data`'s element type (quantized
/// blocks are decoded in f32 with gguf-py's arithmetic, so they must equal it exactly).
fn assert_same(name: &str, data: &HostData, expected: &[f32]) {
    match data {
        HostData::F32(v) => assert_eq!(v.as_slice(), expected, "{name}"),
        HostData::F16(v) => {
            let want: Vec<f16> = expected.iter().map(|&x| f16::from_f32(x)).collect();
            assert_eq!(v.as_slice(), want.as_slice(), "{name}");
        }
        HostData::BF16(v) => {
            let want: Vec<bf16> = expected.iter().map(|&x| bf16::from_f32(x)).collect();
            assert_eq!(v.as_slice(), want.as_slice(), "{name}");
        }
        HostData::Quant(q) => {
            let got = q.to_f32();
            assert_eq!(&got[..expected.len()], expected, "{name}");
        }
        HostData::Fp8(_) => panic!("{name}: GGUF has no FP8 tensors"),
    }
}

#[test]
fn dequantizes_every_supported_type_like_the_reference() {
    let path = fixture("dequant.gguf");
    let bytes = std::fs::read(&path).expect("fixture readable");
    let g = Gguf::parse(&bytes, &path).expect("fixture parses");
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    let expected = read_json("dequant.json");
    let want = expected["tensors"].as_object().expect("tensors object");
    assert_eq!(g.tensors.len(), 9);
    for t in &g.tensors {
        let e = &want[&t.name];
        assert_eq!(
            t.ggml_type.name(),
            e["type"].as_str().expect("type"),
            "{}",
            t.name
        );
        let shape: Vec<usize> = e["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(t.shape(), shape, "{}", t.name);
        let numel = t.numel() as usize;
        let data = dequant::dequantize(t.ggml_type, g.tensor_bytes(t).expect("in bounds"), numel)
            .expect("supported");
        let kind = match &data {
            HostData::F32(_) => "F32",
            HostData::F16(_) => "F16",
            HostData::BF16(_) => "BF16",
            HostData::Quant(q) => q.ty.name(),
            HostData::Fp8(_) => "FP8",
        };
        assert_eq!(kind, t.ggml_type.name(), "{}: every type is kept", t.name);
        assert_same(&t.name, &data, &floats(&e["values"]));
    }
}

#[test]
fn reads_metadata_of_every_value_type() {
    let path = fixture("dequant.gguf");
    let bytes = std::fs::read(&path).expect("fixture readable");
    let g = Gguf::parse(&bytes, &path).expect("fixture parses");
    let get = |k: &str| g.get(k).cloned().expect(k);
    assert_eq!(
        get("general.architecture"),
        MetaValue::String("test".into())
    );
    assert_eq!(get("t.u8"), MetaValue::U8(200));
    assert_eq!(get("t.i8"), MetaValue::I8(-100));
    assert_eq!(get("t.u16"), MetaValue::U16(60000));
    assert_eq!(get("t.i16"), MetaValue::I16(-30000));
    assert_eq!(get("t.u32"), MetaValue::U32(4_000_000_000));
    assert_eq!(get("t.i32"), MetaValue::I32(-2_000_000_000));
    assert_eq!(get("t.u64"), MetaValue::U64((1 << 63) + 5));
    assert_eq!(get("t.i64"), MetaValue::I64(-(1 << 62)));
    assert_eq!(get("t.f32"), MetaValue::F32(1.5));
    assert_eq!(get("t.f64"), MetaValue::F64(-2.25));
    assert_eq!(get("t.bool"), MetaValue::Bool(true));
    assert_eq!(get("t.str"), MetaValue::String("héllo ✓".into()));
    assert_eq!(
        get("t.arr_i32"),
        MetaValue::Array(vec![
            MetaValue::I32(1),
            MetaValue::I32(-2),
            MetaValue::I32(3)
        ])
    );
    assert_eq!(
        get("t.arr_str"),
        MetaValue::Array(vec![
            MetaValue::String("a".into()),
            MetaValue::String(String::new()),
            MetaValue::String("ç".into()),
        ])
    );
    let nested = get("t.arr_nested");
    let inner: Vec<Vec<i64>> = nested
        .as_array()
        .expect("outer array")
        .iter()
        .map(|a| {
            a.as_array()
                .expect("inner array")
                .iter()
                .map(|x| x.as_i64().expect("int"))
                .collect()
        })
        .collect();
    assert_eq!(inner, vec![vec![1, 2], vec![3]]);
}

#[test]
fn tiny_llama_loads_with_hf_names_unpermuted_qk_and_config() {
    let m = load_model(&fixture("tiny_llama.gguf"), false).expect("tiny llama loads");
    let e = read_json("tiny_llama.json");
    let want_config: crate::loader::config::LlamaConfig =
        serde_json::from_value(e["config"].clone()).expect("config json");
    assert_eq!(m.config, want_config);
    assert_eq!(m.name, "tiny-llama-fixture");
    assert!(
        !m.tensors.contains_key("lm_head.weight"),
        "tied head has no lm_head"
    );

    let tensors = e["tensors"].as_object().expect("tensors");
    assert_eq!(m.tensors.len(), tensors.len());
    for (name, t) in tensors {
        let got = m
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} loaded"));
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(got.shape, shape, "{name}");
        let want = floats(&t["values"]);
        let prefix = match &got.data {
            HostData::F32(v) => HostData::F32(v[..want.len()].to_vec()),
            HostData::F16(v) => HostData::F16(v[..want.len()].to_vec()),
            HostData::BF16(v) => HostData::BF16(v[..want.len()].to_vec()),
            HostData::Quant(q) => HostData::Quant(q.clone()),
            HostData::Fp8(_) => panic!("{name}: GGUF has no FP8 tensors"),
        };
        assert_same(name, &prefix, &want);
    }

    for case in e["encodings"].as_array().expect("encodings") {
        let text = case["text"].as_str().expect("text");
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(
            m.tokenizer.encode(text, true).expect("encodes"),
            ids,
            "{text:?}"
        );
        assert_eq!(m.tokenizer.decode(&ids).expect("decodes"), text);
    }
    assert_eq!(m.eos_token_ids, vec![2]);
    assert_eq!(m.bos_token_id, Some(1));
    assert!(!m.add_bos);
    let chat = m.chat_template.as_ref().expect("template present");
    let rendered = chat
        .apply(&[ChatMessage::new("user", "hi")], true)
        .expect("renders");
    assert_eq!(rendered, e["chat"]["rendered"].as_str().expect("rendered"));
}

#[test]
fn missing_file_is_reported_by_name() {
    let err = load_model(Path::new("/nonexistent/model.gguf"), false).unwrap_err();
    assert!(matches!(err, LoadError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
}

/// Writes `bytes` to a temp file and loads it.
fn load_bytes(bytes: &[u8]) -> Result<(), LoadError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, bytes).expect("write");
    load_gguf(&path, false).map(|_| ())
}

#[test]
fn every_truncation_of_a_model_is_an_error_not_a_panic() {
    let bytes = std::fs::read(fixture("tiny_llama.gguf")).expect("fixture readable");
    assert!(load_bytes(&bytes).is_ok());
    // Every cut inside the header and a stride through the data.
    let header_end = Gguf::parse(&bytes, Path::new("x"))
        .expect("parses")
        .data_offset as usize;
    let cuts = (0..header_end)
        .step_by(3)
        .chain((header_end..bytes.len()).step_by(97));
    for cut in cuts {
        let err = load_bytes(&bytes[..cut]).expect_err("a truncated file must not load");
        let msg = err.to_string();
        assert!(msg.contains("m.gguf"), "cut {cut}: {msg}");
        if cut >= 24 {
            assert!(
                matches!(err, LoadError::Truncated { .. }),
                "cut {cut}: expected Truncated, got {msg}"
            );
        }
    }
    // One byte short of the last tensor's data (the writer pads the file end to the alignment).
    let g = Gguf::parse(&bytes, Path::new("x")).expect("parses");
    let data_end = g
        .tensors
        .iter()
        .map(|t| g.data_offset + t.offset + t.ggml_type.byte_size(&t.ne).expect("size"))
        .max()
        .expect("tensors") as usize;
    let err = load_bytes(&bytes[..data_end - 1]).expect_err("one byte short");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn garbage_and_corrupted_headers_are_errors_not_panics() {
    let err = load_bytes(b"").expect_err("empty");
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    let err = load_bytes(b"PK\x03\x04 this is a zip, not a gguf").expect_err("zip");
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    let mut v1 = b"GGUF".to_vec();
    v1.extend(1u32.to_le_bytes());
    v1.extend([0u8; 16]);
    let err = load_bytes(&v1).expect_err("version 1");
    assert!(err.to_string().contains("version 1"), "{err}");

    // Flip each header byte to a few values; whatever happens, no panic and no huge allocation.
    let bytes = std::fs::read(fixture("tiny_llama.gguf")).expect("fixture readable");
    let header_end = Gguf::parse(&bytes, Path::new("x"))
        .expect("parses")
        .data_offset as usize;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in (0..header_end).step_by(7) {
        for _ in 0..2 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut bad = bytes.clone();
            bad[i] = (rng & 0xff) as u8;
            let _ = load_bytes(&bad);
        }
    }
}

#[test]
fn unsupported_tensor_type_is_named() {
    // Rewrite the type id of token_embd (Q4_0 = 2) in the header: to F32 the data no longer fits
    // the file, to an unknown id the type is refused; either way an error naming the tensor.
    let bytes = std::fs::read(fixture("tiny_llama.gguf")).expect("fixture readable");
    let name = b"token_embd.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("name in header");
    // name, n_dims u32, 2 x u64 dims, then the u32 type.
    let type_at = at + name.len() + 4 + 16;
    assert_eq!(&bytes[type_at..type_at + 4], &2u32.to_le_bytes());
    let mut bad = bytes.clone();
    bad[type_at..type_at + 4].copy_from_slice(&0u32.to_le_bytes()); // F32: 4 bytes per element
    let err = load_bytes(&bad).expect_err("size no longer fits");
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
    bad[type_at..type_at + 4].copy_from_slice(&77u32.to_le_bytes());
    let err = load_bytes(&bad).expect_err("unknown type id");
    assert!(matches!(err, LoadError::Dtype { .. }), "{err}");
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
    assert!(!GgmlType::from_id(11).expect("Q3_K").is_supported());
}

#[test]
fn non_llama_metadata_is_a_metadata_error() {
    // dequant.gguf is a valid GGUF whose architecture is "test" and has no llama.* keys.
    let err = load_model(&fixture("dequant.gguf"), false).expect_err("not a llama model");
    assert!(matches!(err, LoadError::Metadata { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("dequant.gguf: bad metadata: architecture \"test\""),
        "{err}"
    );
}
