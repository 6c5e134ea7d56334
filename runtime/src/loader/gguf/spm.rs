//! The `tokenizers` model of a SentencePiece GGUF vocabulary (`tokenizer.ggml.model = "llama"`:
//! Llama 2, Mistral, TinyLlama and most older GGUFs).
//!
//! Design: what Hugging Face's `LlamaConverter` (transformers' convert_slow_tokenizer.py) builds
//! from a `tokenizer.model`, so the result is the `tokenizer.json` those models ship:
//! - a BPE model with `byte_fallback` (a character outside the vocabulary becomes its UTF-8
//!   bytes as `<0xNN>` tokens) and `fuse_unk`, whose merges are derived from the scores the way
//!   `SentencePieceExtractor` does: every split of a piece into two vocabulary pieces is a merge,
//!   ranked by the merged piece's score (higher first), ties by the merged piece's id, then the
//!   parts' ids. SentencePiece's
//!   BPE encoder merges the adjacent pair whose concatenation scores highest, leftmost first;
//!   with this ranking the two agree (checked against `sentencepiece` on the fixture);
//! - a normalizer that prepends `▁` (when `tokenizer.ggml.add_space_prefix`, default true) and
//!   turns every space into `▁`; applied per run of text between special tokens, which is what
//!   llama.cpp's SPM tokenizer does too (a space prefix after every special token);
//! - a decoder `▁` -> space, byte tokens reassembled into UTF-8 (invalid sequences become
//!   U+FFFD), fused, and the one leading space of the prefix stripped.
//!
//! Pieces of type control (3) and unknown (2) become special added tokens (`<s>` in a prompt
//! encodes to its id), user-defined (4) non-special added tokens; byte (6) and unused (5) pieces
//! stay in the vocabulary, but only normal, user-defined and unused pieces are merge results.

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence};
use tokenizers::{AddedToken, Tokenizer};

/// SentencePiece's stand-in for a space.
const SPACE: &str = "\u{2581}";

/// llama.cpp's token types (`llama_token_type`).
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_UNUSED: i64 = 5;
const TYPE_NORMAL: i64 = 1;

/// A SentencePiece vocabulary as GGUF stores it.
pub struct SpmVocab<'a> {
    /// `tokenizer.ggml.tokens`: the pieces, `▁` for a space.
    pub tokens: &'a [&'a str],
    /// `tokenizer.ggml.scores`: merge priority (higher merges first).
    pub scores: &'a [f32],
    /// `tokenizer.ggml.token_type`.
    pub types: &'a [i64],
    /// `tokenizer.ggml.unknown_token_id`, if set.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_space_prefix`: prepend `▁` to the text.
    pub add_space_prefix: bool,
}

/// Builds the tokenizer of `v`; the error says what in the metadata is wrong.
pub fn spm_tokenizer(v: &SpmVocab<'_>) -> Result<Tokenizer, String> {
    if v.scores.len() != v.tokens.len() || v.types.len() != v.tokens.len() {
        return Err(format!(
            "{} tokens but {} scores and {} token types",
            v.tokens.len(),
            v.scores.len(),
            v.types.len()
        ));
    }
    let mut vocab = Vocab::default();
    for (i, t) in v.tokens.iter().enumerate() {
        // A duplicated piece keeps its first id, as SentencePiece refuses duplicates and
        // llama.cpp's token_to_id map keeps the first.
        vocab.entry(t.to_string()).or_insert(i as u32);
    }
    let merges = merges(v, &vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.unk {
        let piece = v
            .tokens
            .get(unk as usize)
            .ok_or_else(|| format!("unknown token id {unk} is outside the vocabulary"))?;
        builder = builder.unk_token(piece.to_string());
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("building the BPE model: {e}"))?;

    let mut inner = Tokenizer::new(bpe);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| format!("replace {from:?} -> {to:?}: {e}"))
    };
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if v.add_space_prefix {
        normalizers.push(Prepend::new(SPACE.into()).into());
    }
    normalizers.push(replace(" ", SPACE)?.into());
    inner.with_normalizer(Some(Sequence::new(normalizers)));
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace(SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if v.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));

    let added: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(v.types)
        .filter_map(|(t, &ty)| match ty {
            TYPE_CONTROL | TYPE_UNKNOWN => Some(AddedToken::from(t.to_string(), true)),
            TYPE_USER_DEFINED => Some(AddedToken::from(t.to_string(), false)),
            _ => None,
        })
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}

/// The BPE merges SentencePiece's scores imply (`SentencePieceExtractor.extract` with scores):
/// each split of a mergeable piece into two vocabulary pieces, best merged score first, ties by
/// the merged piece's id, then the parts' ids.
fn merges(v: &SpmVocab<'_>, vocab: &Vocab) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, usize, u32, u32, &str, &str)> = Vec::new();
    for (id, ((piece, &score), &ty)) in v.tokens.iter().zip(v.scores).zip(v.types).enumerate() {
        if !matches!(ty, TYPE_NORMAL | TYPE_USER_DEFINED | TYPE_UNUSED) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((score, id, l, r, left, right));
            }
        }
    }
    // Stable sort on the score alone, over a list in (piece id, left id, right id) order.
    ranked.sort_by_key(|a| (a.1, a.2, a.3));
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
        .into_iter()
        .map(|(_, _, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}
