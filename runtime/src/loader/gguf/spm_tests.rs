//! SentencePiece GGUF tokenizers against the `sentencepiece` reference: token ids and decoded
//! text of fixtures/spm_reference.json (written by fixtures/make_spm_fixture.py with
//! sentencepiece 0.2.1 and gguf 0.19.0), plus the flags and the errors.

use std::path::{Path, PathBuf};

use super::reader::{Gguf, MetaValue};
use super::tokenizer::tokenizer_from_gguf;
use crate::loader::Tokenizer;
use crate::loader::error::LoadError;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/loader/gguf/fixtures")
        .join(name)
}

/// The tokenizer of the GGUF at `path`, with its metadata changed by `edit` first.
fn load_with(path: &Path, edit: impl FnOnce(&mut Gguf<'_>)) -> Result<Tokenizer, LoadError> {
    let bytes = std::fs::read(path).expect("the GGUF exists");
    let mut g = Gguf::parse(&bytes, path).expect("the GGUF parses");
    edit(&mut g);
    tokenizer_from_gguf(&g).map(|(t, _)| t)
}

/// The tokenizer of the fixture, with its metadata changed by `edit` first.
fn tokenizer_with(edit: impl FnOnce(&mut Gguf<'_>)) -> Result<Tokenizer, LoadError> {
    load_with(&fixture("spm_tokenizer.gguf"), edit)
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("the reference exists");
    serde_json::from_str(&text).expect("the reference is JSON")
}

fn reference() -> serde_json::Value {
    read_json(&fixture("spm_reference.json"))
}

/// Mismatches of `t` against reference `r`: ids of `encode(text, true)` and decoded text.
fn mismatches(t: &Tokenizer, r: &serde_json::Value) -> Vec<String> {
    assert_eq!(
        t.vocab_size() as u64,
        r["vocab_size"].as_u64().expect("size")
    );
    let mut failures = Vec::new();
    for case in r["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want = ids_of(case);
        let got = t.encode(text, true).expect("encodes");
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, sentencepiece {want:?}"));
        }
        let decoded = t.decode_skip_special(&want).expect("decodes");
        if decoded != case["decoded"].as_str().expect("decoded") {
            failures.push(format!("{text:?}: decodes to {decoded:?}"));
        }
    }
    failures
}

fn ids_of(case: &serde_json::Value) -> Vec<u32> {
    case["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Every reference string encodes to sentencepiece's ids (BOS in front: add_bos_token is true)
/// and those ids decode to sentencepiece's text.
#[test]
fn ids_and_text_match_sentencepiece() {
    let t = tokenizer_with(|_| {}).expect("loads");
    let failures = mismatches(&t, &reference());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A real 32000-piece vocabulary (Mistral 7B v0.1's, the format of Llama 2's and TinyLlama's)
/// against sentencepiece: run fixtures/check_real_spm.py first (it writes target/spm-real/).
#[test]
#[ignore = "needs target/spm-real/ from fixtures/check_real_spm.py"]
fn real_vocabulary_matches_sentencepiece() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/spm-real");
    let t = load_with(&dir.join("tokenizer.gguf"), |_| {}).expect("loads");
    let r = read_json(&dir.join("reference.json"));
    let failures = mismatches(&t, &r);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The cases exercise what they claim: byte fallback (`<0xNN>` ids) and merged pieces.
#[test]
fn fixture_covers_byte_fallback_and_merges() {
    let t = tokenizer_with(|_| {}).expect("loads");
    let r = reference();
    let cases = r["cases"].as_array().expect("cases");
    let emoji = cases
        .iter()
        .find(|c| c["text"] == "👍")
        .expect("emoji case");
    let pieces: Vec<String> = ids_of(emoji)
        .iter()
        .filter_map(|&i| t.id_to_token(i))
        .collect();
    assert_eq!(pieces[2..], ["<0xF0>", "<0x9F>", "<0x91>", "<0x8D>"]);
    let long = t
        .encode("Once upon a time", false)
        .expect("encodes")
        .iter()
        .filter_map(|&i| t.id_to_token(i))
        .filter(|p| p.chars().count() > 2)
        .count();
    assert!(
        long > 0,
        "no merged piece in the fixture vocabulary is used"
    );
}

/// Without add_special no BOS; an empty prompt is BOS alone; add_eos_token appends EOS.
#[test]
fn bos_and_eos_flags() {
    let t = tokenizer_with(|_| {}).expect("loads");
    let r = reference();
    let (bos, eos) = (
        r["bos"].as_u64().expect("bos") as u32,
        r["eos"].as_u64().expect("eos") as u32,
    );
    assert_eq!(t.encode("", true).expect("encodes"), [bos]);
    assert_eq!(t.encode("", false).expect("encodes"), Vec::<u32>::new());
    let hello = t.encode("hello", true).expect("encodes");
    assert_eq!(t.encode("hello", false).expect("encodes"), hello[1..]);

    let t = tokenizer_with(|g| {
        g.metadata
            .insert("tokenizer.ggml.add_eos_token".into(), MetaValue::Bool(true));
        g.metadata.insert(
            "tokenizer.ggml.add_bos_token".into(),
            MetaValue::Bool(false),
        );
    })
    .expect("loads");
    let mut want = hello[1..].to_vec();
    want.push(eos);
    assert_eq!(t.encode("hello", true).expect("encodes"), want);
}

/// A control token written in the text encodes to its id, and the text after it gets the space
/// prefix again (llama.cpp's SPM tokenizer: a `▁` after every special token).
#[test]
fn control_token_in_text_is_its_id() {
    let t = tokenizer_with(|_| {}).expect("loads");
    let hello = t.encode("hello", false).expect("encodes");
    let mut want = vec![2];
    want.extend(&hello);
    assert_eq!(t.encode("</s>hello", false).expect("encodes"), want);
}

/// add_space_prefix = false: no `▁` in front, and decoding keeps a leading space as written.
#[test]
fn without_space_prefix() {
    let t = tokenizer_with(|g| {
        g.metadata.insert(
            "tokenizer.ggml.add_space_prefix".into(),
            MetaValue::Bool(false),
        );
    })
    .expect("loads");
    let ids = t.encode("hello world", false).expect("encodes");
    let first = t.id_to_token(ids[0]).expect("a piece");
    assert!(!first.starts_with('\u{2581}'), "{first:?}");
    assert_eq!(t.decode(&ids).expect("decodes"), "hello world");
    let ids = t.encode(" hello", false).expect("encodes");
    assert_eq!(t.decode(&ids).expect("decodes"), " hello");
}

/// Metadata a SentencePiece GGUF cannot be built from is an error naming the problem.
#[test]
fn bad_metadata_is_an_error() {
    let err = tokenizer_with(|g| {
        g.metadata.remove("tokenizer.ggml.scores");
    })
    .expect_err("no scores");
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");

    let err = tokenizer_with(|g| {
        g.metadata.insert(
            "tokenizer.ggml.scores".into(),
            MetaValue::Array(vec![MetaValue::F32(0.0)]),
        );
    })
    .expect_err("short scores");
    assert!(err.to_string().contains("scores"), "{err}");

    let err = tokenizer_with(|g| {
        g.metadata.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("t5".into()),
        );
    })
    .expect_err("t5");
    assert!(err.to_string().contains("\"t5\" is not supported"), "{err}");

    let err = tokenizer_with(|g| {
        g.metadata.insert(
            "tokenizer.ggml.unknown_token_id".into(),
            MetaValue::U32(1 << 30),
        );
    })
    .expect_err("unk out of range");
    assert!(err.to_string().contains("unknown_token_id"), "{err}");
}

/// A token's text inside a generated text (logprobs' `token` strings) is its piece as the GGUF's
/// `tokenizer.ggml.tokens` spells it, `▁` read as a space: `▁upon` is " upon", though decoding
/// `▁upon` alone gives "upon" (the decoder strips a text's leading space). Byte and control
/// pieces are left out; every case's ids are checked, and the concatenated texts of a case's
/// tokens are its decoded text with the space prefix in front.
#[test]
fn token_text_keeps_the_space_marker() {
    let path = fixture("spm_tokenizer.gguf");
    let bytes = std::fs::read(&path).expect("the GGUF exists");
    let g = Gguf::parse(&bytes, &path).expect("the GGUF parses");
    let pieces: Vec<&str> = g
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .expect("tokens")
        .iter()
        .map(|p| p.as_str().expect("a string"))
        .collect();
    let t = tokenizer_with(|_| {}).expect("loads");
    let mut spaced = 0;
    for case in reference()["cases"].as_array().expect("cases") {
        let ids = ids_of(case);
        let plain = |&&i: &&u32| {
            let p = pieces[i as usize];
            !(p.starts_with("<0x") || p.starts_with('<') && p.ends_with('>'))
        };
        for &id in ids.iter().filter(plain) {
            let want = pieces[id as usize].replace('\u{2581}', " ");
            spaced += usize::from(want.starts_with(' '));
            assert_eq!(t.token_text(id).expect("decodes"), want, "id {id}");
        }
        if ids[1..].iter().all(|i| plain(&i)) && !ids[1..].is_empty() {
            let joined: String = ids[1..]
                .iter()
                .map(|&i| t.token_text(i).expect("decodes"))
                .collect();
            let decoded = case["decoded"].as_str().expect("decoded");
            assert_eq!(joined, format!(" {decoded}"), "{:?}", case["text"]);
        }
    }
    assert!(spaced > 3, "the cases hold pieces with a space marker");
}
