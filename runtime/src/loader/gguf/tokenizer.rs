//! A [`Tokenizer`] built from GGUF tokenizer metadata (`tokenizer.ggml.*`).
//!
//! Design: two model types. `llama` (SentencePiece: Llama 2, Mistral, TinyLlama) is built by
//! [`super::spm`]. `gpt2` (byte-level BPE, used by Llama 3, SmolLM, Qwen, ...): the vocabulary
//! (`tokens`) and `merges` build a `tokenizers` BPE model; the
//! pre-tokenizer is chosen from `tokenizer.ggml.pre` to match what llama.cpp does for that name
//! (llama-vocab.cpp) and what the model's own tokenizer.json does:
//! - `smollm`: single digits split first, then the GPT-2 regex (`Digits(individual_digits)` +
//!   `ByteLevel(use_regex)`, exactly SmolLM2's tokenizer.json);
//! - `gpt-2` / `default`: the GPT-2 regex (`ByteLevel(use_regex)`);
//! - `llama-bpe`: Llama 3's regex (`Split` + `ByteLevel` without regex, `ignore_merges`).
//!
//! Tokens of type 3 (control) become special added tokens (so `<|im_start|>` in a chat prompt
//! encodes to its id and never to its spelling), type 4 (user defined) non-special added tokens.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::reader::{Gguf, MetaValue};
use crate::loader::error::LoadError;
use crate::loader::tokenizer::Tokenizer;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer regex (its tokenizer.json `Split` pattern, llama.cpp `LLAMA3`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special-token ids and flags read alongside the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id`, if set.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, if set.
    pub eos: Option<u32>,
    /// Whether prompts get the BOS token prepended (`tokenizer.ggml.add_bos_token`; default:
    /// yes when there is a BOS token).
    pub add_bos: bool,
    /// Whether prompts get the EOS token appended (`tokenizer.ggml.add_eos_token`; default no).
    pub add_eos: bool,
}

/// Builds the tokenizer described by `g`'s metadata.
pub fn tokenizer_from_gguf(g: &Gguf<'_>) -> Result<(Tokenizer, SpecialTokens), LoadError> {
    let err = |message: String| LoadError::Tokenizer {
        path: g.path.clone(),
        message,
    };
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| err("missing tokenizer.ggml.model".into()))?;
    let spm = match model {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(err(format!(
                "tokenizer model {other:?} is not supported (only \"gpt2\", byte-level BPE, and \
                 \"llama\", SentencePiece)"
            )));
        }
    };
    let tokens = string_array(g, "tokenizer.ggml.tokens").map_err(err)?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(MetaValue::as_i64).collect::<Option<Vec<_>>>())
            .filter(|t| t.len() == tokens.len())
            .ok_or_else(|| {
                err("tokenizer.ggml.token_type is not an integer array as long as tokens".into())
            })?,
    };
    let id = |key: &str| -> Result<Option<u32>, LoadError> {
        match g.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|v| u32::try_from(v).ok()) {
                Some(id) if (id as usize) < tokens.len() => Ok(Some(id)),
                _ => Err(err(format!("{key} = {v:?} is not a token id"))),
            },
        }
    };
    // llama.cpp's defaults for a SentencePiece vocabulary without the keys: <unk>, <s>, </s> =
    // 0, 1, 2 (llama-vocab.cpp, `load`), when the vocabulary is that large.
    let default_id = |spm_id: u32| (spm && (spm_id as usize) < tokens.len()).then_some(spm_id);
    let bos = id("tokenizer.ggml.bos_token_id")?.or(default_id(1));
    let eos = id("tokenizer.ggml.eos_token_id")?.or(default_id(2));
    let flag = |key: &str| g.get(key).and_then(MetaValue::as_bool);

    let inner = if spm {
        let scores = float_array(g, "tokenizer.ggml.scores").map_err(err)?;
        let vocab = super::spm::SpmVocab {
            tokens: &tokens,
            scores: &scores,
            types: &types,
            unk: id("tokenizer.ggml.unknown_token_id")?.or(default_id(0)),
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix").unwrap_or(true),
        };
        super::spm::spm_tokenizer(&vocab).map_err(err)?
    } else {
        byte_level_bpe(g, &tokens, &types).map_err(err)?
    };

    // llama.cpp's default when the flag is absent is to add BOS (both vocabulary types) and not
    // EOS.
    let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(bos.is_some()) && bos.is_some();
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false) && eos.is_some();
    let special = SpecialTokens {
        bos,
        eos,
        add_bos,
        add_eos,
    };
    let prepend = if add_bos { bos } else { None };
    let append = if add_eos { eos } else { None };
    Ok((
        Tokenizer::from_inner(inner, prepend).with_eos_appended(append),
        special,
    ))
}

/// The byte-level BPE tokenizer of a `gpt2` vocabulary.
fn byte_level_bpe(
    g: &Gguf<'_>,
    tokens: &[&str],
    types: &[i64],
) -> Result<tokenizers::Tokenizer, String> {
    let merges = string_array(g, "tokenizer.ggml.merges")?;
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(MetaValue::as_str)
        .unwrap_or("default");

    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| format!("merge {m:?} is not two tokens separated by a space"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre == "llama-bpe")
        .build()
        .map_err(|e| format!("building the BPE model: {e}"))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter_map(|(t, &ty)| match ty {
            TOKEN_TYPE_CONTROL => Some(AddedToken::from(t.to_string(), true)),
            TOKEN_TYPE_USER_DEFINED => Some(AddedToken::from(t.to_string(), false)),
            _ => None,
        })
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}

/// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` = `pre`.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, String> {
    let byte_level =
        |use_regex: bool| -> PreTokenizerWrapper { ByteLevel::new(false, true, use_regex).into() };
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" => byte_level(true),
        "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into(),
        "llama-bpe" | "llama3" => {
            let split = Split::new(
                SplitPattern::Regex(LLAMA3_REGEX.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| format!("Llama 3 pre-tokenizer regex: {e}"))?;
            Sequence::new(vec![split.into(), byte_level(false)]).into()
        }
        other => {
            return Err(format!(
                "pre-tokenizer {other:?} (tokenizer.ggml.pre) is not supported; known: default, \
                 gpt-2, smollm, llama-bpe"
            ));
        }
    })
}

/// The string array at `key`.
fn string_array<'g>(g: &'g Gguf<'_>, key: &str) -> Result<Vec<&'g str>, String> {
    g.get(key)
        .and_then(MetaValue::as_array)
        .and_then(|a| a.iter().map(MetaValue::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("{key} is missing or not a string array"))
}

/// The number array at `key`, as f32 (`tokenizer.ggml.scores`).
fn float_array(g: &Gguf<'_>, key: &str) -> Result<Vec<f32>, String> {
    g.get(key)
        .and_then(MetaValue::as_array)
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| format!("{key} is missing or not a number array"))
}
