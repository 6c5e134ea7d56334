//! [`grammar_vocab`]: the Hugging Face tokenizer turned into the byte vocabulary a grammar
//! matcher needs ([`GrammarVocab`]: token id -> the bytes it adds to the output).
//!
//! Design (what llguidance's `toktrie_hf_tokenizers` does, written against this workspace's
//! `tokenizers`): the decoder says how a token's spelling maps to bytes.
//! - Byte-level BPE (a `ByteLevel` decoder: GPT-2, SmolLM2, Llama 3): every character of the
//!   spelling stands for one byte through GPT-2's byte-to-unicode table.
//! - SentencePiece (a `ByteFallback`, `Metaspace` or `Replace` decoder: Llama 2): `<0xNN>` is
//!   the byte `NN`, and `▁` is a space.
//!
//! Added tokens flagged special (`<|im_end|>`, `</s>`) are marked special; other added tokens
//! stand for their text as written.

use std::collections::HashMap;

use tokenizers::{DecoderWrapper, Tokenizer};

use crate::engine::constraint::{ConstraintError, GrammarVocab, VocabToken};

/// How the tokenizer spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-unicode table.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` byte tokens.
    SentencePiece,
}

/// SentencePiece's stand-in for a space.
const SP_SPACE: char = '\u{2581}';

/// The byte vocabulary of `tokenizer`, with `eos` the ids that end generation.
pub fn grammar_vocab(tokenizer: &Tokenizer, eos: &[u32]) -> Result<GrammarVocab, ConstraintError> {
    let spelling = tokenizer
        .get_decoder()
        .and_then(spelling_of)
        .ok_or_else(|| {
            ConstraintError::Vocab(
                "the tokenizer's decoder is neither byte-level nor SentencePiece".into(),
            )
        })?;
    let added = tokenizer.get_added_tokens_decoder();
    let unicode_to_byte = unicode_to_byte();
    let size = tokenizer.get_vocab_size(true);
    let mut tokens = Vec::with_capacity(size);
    for id in 0..size as u32 {
        let token = if let Some(a) = added.get(&id) {
            VocabToken {
                bytes: a.content.as_bytes().to_vec(),
                special: a.special,
            }
        } else if let Some(spelled) = tokenizer.id_to_token(id) {
            let bytes = match spelling {
                Spelling::ByteLevel => spelled
                    .chars()
                    .map(|c| unicode_to_byte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| {
                        ConstraintError::Vocab(format!(
                            "token {id} ({spelled:?}) has a character outside GPT-2's byte table"
                        ))
                    })?,
                Spelling::SentencePiece => sentencepiece_bytes(&spelled),
            };
            VocabToken {
                bytes,
                special: false,
            }
        } else {
            VocabToken {
                bytes: Vec::new(),
                special: false,
            }
        };
        tokens.push(token);
    }
    GrammarVocab::new(tokens, eos.to_vec())
}

/// The spelling a decoder (or the first telling decoder of a sequence) implies.
fn spelling_of(d: &DecoderWrapper) -> Option<Spelling> {
    match d {
        DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) | DecoderWrapper::Metaspace(_) => {
            Some(Spelling::SentencePiece)
        }
        DecoderWrapper::Sequence(seq) => {
            let found: Vec<Spelling> = seq.get_decoders().iter().filter_map(spelling_of).collect();
            found.first().copied().or_else(|| {
                // Llama 2's sequence is Replace(▁ -> space), ByteFallback, Fuse, Strip; a
                // sequence with only a Replace is SentencePiece without byte fallback.
                seq.get_decoders()
                    .iter()
                    .any(|d| matches!(d, DecoderWrapper::Replace(_)))
                    .then_some(Spelling::SentencePiece)
            })
        }
        _ => None,
    }
}

/// A SentencePiece piece's bytes: `<0xNN>` is one byte, otherwise the text with `▁` as space.
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
        .filter(|h| h.len() == 2)
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    piece.replace(SP_SPACE, " ").into_bytes()
}

/// GPT-2's `bytes_to_unicode` reversed: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes for U+0100 onwards in byte order.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        if matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}') {
            map.insert(c, b);
        } else {
            if let Some(c) = char::from_u32(next) {
                map.insert(c, b);
            }
            next += 1;
        }
    }
    map
}
