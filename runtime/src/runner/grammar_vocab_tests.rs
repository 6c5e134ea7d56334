//! Tests of [`grammar_vocab`] and of constrained decoding over real vocabularies: the default
//! model's (SmolLM2-135M-Instruct, byte-level BPE, 49152 tokens; skipped with a printed reason
//! when it is not in sov's cache) and a small SentencePiece tokenizer built here in Llama 2's
//! `tokenizer.json` layout. The independent references: the `tokenizers` crate's own `decode`
//! for the bytes, `serde_json` for the generated JSON, and the schema's rules checked field by
//! field.

use std::time::Instant;

use serde_json::{Value, json};
use tokenizers::Tokenizer;

use super::grammar_vocab::grammar_vocab;
use crate::engine::constraint::testing::drive_random;
use crate::engine::constraint::{Grammar, GrammarCompiler, GrammarVocab, TokenConstraint};
use crate::loader::cached_default_model;
use crate::loader::gguf::reader::Gguf;
use crate::loader::gguf::tokenizer::tokenizer_from_gguf;

/// The default model's tokenizer and end-of-sequence ids, or None (printed) when not cached.
fn default_tokenizer() -> Option<(Tokenizer, Vec<u32>)> {
    let dirs = crate::app::SovDirs::from_process_env().ok();
    let Some(path) = dirs.as_ref().and_then(|d| cached_default_model(&d.cache)) else {
        eprintln!(
            "SKIPPED: default model not in sov's cache; `sov::loader::resolve_model(None)` \
             fetches it"
        );
        return None;
    };
    let bytes = std::fs::read(&path).expect("cached model readable");
    let g = Gguf::parse(&bytes, &path).expect("cached model parses");
    let (tok, special) = tokenizer_from_gguf(&g).expect("tokenizer builds");
    let eos: Vec<u32> = special.eos.into_iter().collect();
    assert!(!eos.is_empty(), "the default model names its EOS token");
    Some((tok.inner().clone(), eos))
}

const SAMPLES: &[&str] = &[
    "Hello world",
    "12345 apples",
    "héllo 你好 😀",
    "def f(x):\n    return x**2",
    "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"x\", \"y\"]}\n\n\t  ",
    "  leading spaces and trailing  ",
];

/// decode(ids) == concat(bytes(id)) against the tokenizer's own decode, on text whose tokens
/// include partial UTF-8 sequences (the emoji and CJK split into byte tokens).
fn assert_round_trips(tok: &Tokenizer, vocab: &GrammarVocab, strip_one_leading_space: bool) {
    for s in SAMPLES {
        let ids = tok.encode(*s, false).expect("encodes").get_ids().to_vec();
        let want = tok.decode(&ids, false).expect("decodes");
        let mut got = vocab.text_bytes(&ids);
        if strip_one_leading_space && got.first() == Some(&b' ') {
            got.remove(0);
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            want,
            "{s:?} -> {ids:?}: the byte vocabulary disagrees with the tokenizer's decode"
        );
    }
}

#[test]
fn default_model_byte_vocabulary_round_trips() {
    let Some((tok, eos)) = default_tokenizer() else {
        return;
    };
    let vocab = grammar_vocab(&tok, &eos).expect("vocabulary builds");
    assert_eq!(vocab.len(), 49152);
    assert_round_trips(&tok, &vocab, false);
    // `<|im_end|>` (2, the model card's EOS) is special and spelled as written.
    let im_end = &vocab.tokens()[2];
    assert!(im_end.special);
    assert_eq!(im_end.bytes, b"<|im_end|>");
    // Special tokens are left out of the text, as `decode(_, skip_special = true)` does.
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false)
        .expect("encodes")
        .get_ids()
        .to_vec();
    assert_eq!(
        String::from_utf8_lossy(&vocab.text_bytes(&ids)),
        tok.decode(&ids, true).expect("decodes")
    );
}

/// A Llama-2-layout SentencePiece tokenizer (BPE with byte fallback, `▁` for spaces, a
/// `Prepend("▁")` normalizer and a `Strip` decoder), small enough to write out here.
fn sentencepiece_tokenizer() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    let mut add = |t: String| {
        let id = vocab.len();
        vocab.insert(t, json!(id));
    };
    for t in ["<unk>", "<s>", "</s>"] {
        add(t.to_string());
    }
    for b in 0..=255u8 {
        add(format!("<0x{b:02X}>"));
    }
    for c in "▁abcdefghijklmnopqrstuvwxyz0123456789{}[]\":,.-_()*\n"
        .chars()
        .chain(['\t'])
    {
        add(c.to_string());
    }
    for t in ["ll", "▁h", "▁he", "▁hell", "▁hello", "▁w", "\":", "▁\""] {
        add(t.to_string());
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab,
            "merges": ["l l", "▁ h", "▁h e", "▁he ll", "▁hell o", "▁ w", "\" :", "▁ \""]
        }
    });
    Tokenizer::from_bytes(json.to_string()).expect("the SentencePiece test tokenizer builds")
}

#[test]
fn sentencepiece_byte_vocabulary_round_trips() {
    let tok = sentencepiece_tokenizer();
    let vocab = grammar_vocab(&tok, &[2]).expect("vocabulary builds");
    assert_eq!(vocab.tokens()[3 + 0xC3].bytes, [0xC3]);
    assert_eq!(
        vocab.tokens()[tok.token_to_id("▁hello").expect("merged") as usize].bytes,
        b" hello"
    );
    assert!(vocab.tokens()[2].special);
    // The Strip decoder drops the space the normalizer prepended; the vocabulary keeps it.
    assert_round_trips(&tok, &vocab, true);

    // A JSON object generated over this vocabulary parses.
    let compiler = GrammarCompiler::new(vocab).expect("compiler builds");
    for seed in 0..4 {
        let mut c = compiler.compile(&Grammar::JsonObject).expect("compiles");
        let run = drive_random(
            &mut c,
            tok.get_vocab_size(true),
            &[2],
            seed,
            4000,
            &|_| 0.0,
            false,
        )
        .expect("the constraint runs");
        assert!(run.finished, "seed {seed}: not finished in 4000 tokens");
        let text = tok.decode(&run.tokens, true).expect("decodes");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text:?}");
    }
}

/// The schema of the JSON-schema tests, and its rules checked by hand.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "role", "tags", "active"],
        "additionalProperties": false
    })
}

fn check_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["active", "age", "name", "role", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 12 {
        return Err(format!("name {name:?} is longer than 12"));
    }
    match o["age"].as_i64() {
        Some(a) if (0..=150).contains(&a) => {}
        _ => return Err(format!("age {} is not an integer in 0..=150", o["age"])),
    }
    if !matches!(o["role"].as_str(), Some("admin" | "user" | "guest")) {
        return Err(format!("role {}", o["role"]));
    }
    let tags = o["tags"].as_array().ok_or("tags is not an array")?;
    if tags.len() > 3
        || !tags
            .iter()
            .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 8))
    {
        return Err(format!("tags {}", o["tags"]));
    }
    if !o["active"].is_boolean() {
        return Err("active is not a boolean".into());
    }
    Ok(())
}

#[test]
fn hand_check_of_the_schema_can_fail() {
    let good = json!({"name": "Ada", "age": 36, "role": "admin", "tags": ["x"], "active": true});
    assert_eq!(check_person(&good), Ok(()));
    for (key, bad) in [
        ("name", json!("a name far too long")),
        ("age", json!(151)),
        ("age", json!(3.5)),
        ("role", json!("root")),
        ("tags", json!(["a", "b", "c", "d"])),
        ("active", json!("yes")),
    ] {
        let mut v = good.clone();
        v[key] = bad;
        assert!(check_person(&v).is_err(), "{v}");
    }
    let mut extra = good.clone();
    extra["extra"] = json!(1);
    assert!(check_person(&extra).is_err());
}

/// The default model's compiler, vocabulary size, EOS ids and tokenizer.
fn default_compiler() -> Option<(GrammarCompiler, Tokenizer, Vec<u32>)> {
    let (tok, eos) = default_tokenizer()?;
    let compiler = GrammarCompiler::new(grammar_vocab(&tok, &eos).expect("vocabulary builds"))
        .expect("compiler builds");
    Some((compiler, tok, eos))
}

/// A seeded random run of `grammar` to its end. Uniform picks among the allowed tokens nest
/// free-form JSON and grow its strings without bound, so tokens holding a `"` or a `}` get
/// `close_bias` (0 for none).
fn generate(
    compiler: &GrammarCompiler,
    tok: &Tokenizer,
    eos: &[u32],
    grammar: &Grammar,
    seed: u64,
    close_bias: f32,
) -> (String, Vec<u32>) {
    let closes: Vec<bool> = (0..tok.get_vocab_size(true) as u32)
        .map(|id| tok.id_to_token(id).is_some_and(|t| t.contains(['"', '}'])))
        .collect();
    let bias = |id: u32| if closes[id as usize] { close_bias } else { 0.0 };
    let mut c = compiler.compile(grammar).expect("compiles");
    let run = drive_random(
        &mut c,
        tok.get_vocab_size(true),
        eos,
        seed,
        3000,
        &bias,
        false,
    )
    .expect("the constraint runs");
    assert!(run.finished, "seed {seed}: not finished in 3000 tokens");
    (tok.decode(&run.tokens, true).expect("decodes"), run.tokens)
}

#[test]
fn default_model_json_schema_runs_parse_and_validate() {
    let Some((compiler, tok, eos)) = default_compiler() else {
        return;
    };
    let grammar = Grammar::JsonSchema(person_schema());
    for seed in 0..8 {
        let (text, _) = generate(&compiler, &tok, &eos, &grammar, seed, 0.0);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        if let Err(e) = check_person(&v) {
            panic!("seed {seed}: {text:?} breaks the schema: {e}");
        }
    }
}

#[test]
fn default_model_json_object_runs_are_objects() {
    let Some((compiler, tok, eos)) = default_compiler() else {
        return;
    };
    for seed in 0..4 {
        let (text, _) = generate(&compiler, &tok, &eos, &Grammar::JsonObject, seed, 0.01);
        eprintln!("seed {seed}: {} bytes: {text}", text.len());
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "seed {seed}: {text:?}");
    }
}

#[test]
fn default_model_replay_of_a_prefix_gives_the_live_mask() {
    let Some((compiler, tok, eos)) = default_compiler() else {
        return;
    };
    let grammar = Grammar::JsonSchema(person_schema());
    let mut live = compiler.compile(&grammar).expect("compiles");
    let run = drive_random(
        &mut live,
        tok.get_vocab_size(true),
        &eos,
        7,
        3000,
        &|_| 0.0,
        true,
    )
    .expect("the constraint runs");
    let n = run.tokens.len();
    assert!(n > 4, "run too short to test: {n}");
    for k in [0, 1, n / 3, n / 2, n - 1] {
        let mut replayed =
            TokenConstraint::replay(&compiler, &grammar, &run.tokens[..k]).expect("replays");
        assert_eq!(
            replayed.allowed_tokens().expect("mask"),
            run.masks[k],
            "mask after replaying {k} of {n} tokens differs from the live one"
        );
    }
    // A replay of the whole output is finished, as the live matcher was.
    let whole = TokenConstraint::replay(&compiler, &grammar, &run.tokens).expect("replays");
    assert!(whole.is_finished() || eos.contains(&run.tokens[n - 1]));
}

#[test]
fn default_model_bad_schema_is_an_error() {
    let Some((compiler, _, _)) = default_compiler() else {
        return;
    };
    let err = compiler
        .compile(&Grammar::JsonSchema(json!({"type": "strng"})))
        .expect_err("an unknown type is refused");
    assert!(err.to_string().starts_with("invalid grammar"), "{err}");
}

/// Mask time per token on the default model's vocabulary. `cargo test --release -p sov --lib
/// grammar_vocab::tests::bench_mask_time -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark: prints the mask time per token"]
fn bench_mask_time() {
    let Some((tok, eos)) = default_tokenizer() else {
        return;
    };
    let t0 = Instant::now();
    let byte_vocab = grammar_vocab(&tok, &eos).expect("vocabulary builds");
    let vocab_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    let compiler = GrammarCompiler::new(byte_vocab).expect("compiler builds");
    println!(
        "grammar_vocab {vocab_ms:.1} ms, GrammarCompiler::new {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let vocab = tok.get_vocab_size(true);
    for (name, grammar, close_bias) in [
        ("json_schema", Grammar::JsonSchema(person_schema()), 0.0),
        ("json_object", Grammar::JsonObject, 0.01),
    ] {
        let mut times = Vec::new();
        let mut compile_us = Vec::new();
        for seed in 0..8 {
            let (_, tokens) = generate(&compiler, &tok, &eos, &grammar, seed, close_bias);
            let t0 = Instant::now();
            let mut c = compiler.compile(&grammar).expect("compiles");
            compile_us.push(t0.elapsed().as_secs_f64() * 1e6);
            let mut logits = vec![0f32; vocab];
            for &t in &tokens {
                logits.fill(0.0);
                let t0 = Instant::now();
                c.mask_logits(&mut logits).expect("masks");
                times.push(t0.elapsed().as_secs_f64() * 1e6);
                c.commit(t).expect("commits");
            }
        }
        times.sort_by(f64::total_cmp);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let p = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        let compile = compile_us.iter().sum::<f64>() / compile_us.len() as f64;
        println!(
            "{name}: mask_logits over {vocab} tokens: {} steps, mean {mean:.1} us, p50 {:.1} us, \
             p90 {:.1} us, p99 {:.1} us, max {:.1} us; compile mean {compile:.0} us",
            times.len(),
            p(0.5),
            p(0.9),
            p(0.99),
            p(1.0)
        );
    }
}
