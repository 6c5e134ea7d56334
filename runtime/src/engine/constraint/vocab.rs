//! [`GrammarVocab`]: the model's vocabulary as the bytes each token stands for, which is what a
//! grammar matcher walks. The runner builds it from its tokenizer (`runner::grammar_vocab`); the
//! engine sees only bytes.

use super::error::ConstraintError;

/// One token of the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabToken {
    /// The bytes the token adds to the output (for a special token: its spelling, e.g.
    /// `<|im_end|>`). Empty for an id with no text; such a token is never allowed.
    pub bytes: Vec<u8>,
    /// A special (control) token: never part of text a grammar matches, only allowed where it
    /// ends the sequence.
    pub special: bool,
}

/// Token id -> bytes for every id of the tokenizer, plus the ids that end a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarVocab {
    tokens: Vec<VocabToken>,
    eos: Vec<u32>,
}

impl GrammarVocab {
    /// `tokens[id]` is token `id`; `eos` the ids that end generation (at least one, each an id
    /// of `tokens`).
    pub fn new(tokens: Vec<VocabToken>, eos: Vec<u32>) -> Result<Self, ConstraintError> {
        if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
            return Err(ConstraintError::Vocab(format!(
                "{} tokens: a vocabulary has 1 to 2^32 - 1 tokens",
                tokens.len()
            )));
        }
        if eos.is_empty() {
            return Err(ConstraintError::Vocab(
                "no end-of-sequence token given".into(),
            ));
        }
        if let Some(&bad) = eos.iter().find(|&&e| e as usize >= tokens.len()) {
            return Err(ConstraintError::Vocab(format!(
                "end-of-sequence id {bad} is outside the vocabulary (size {})",
                tokens.len()
            )));
        }
        Ok(GrammarVocab { tokens, eos })
    }

    /// The tokens, indexed by id.
    pub fn tokens(&self) -> &[VocabToken] {
        &self.tokens
    }

    /// The ids that end generation.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Number of token ids.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false (a vocabulary has at least one token); here for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The bytes of `ids` in order, special tokens left out (what a matcher has seen).
    pub fn text_bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .filter_map(|&id| self.tokens.get(id as usize))
            .filter(|t| !t.special)
            .flat_map(|t| t.bytes.iter().copied())
            .collect()
    }
}
