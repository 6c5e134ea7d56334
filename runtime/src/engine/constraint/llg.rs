//! The llguidance matcher behind [`GrammarCompiler`] and [`TokenConstraint`]; the only file
//! of the engine that names llguidance or toktrie.
//!
//! Design (llguidance's server-side `ParserFactory` + `Matcher` API, as vLLM uses it): the
//! compiler turns the [`GrammarVocab`] into a `TokTrie` (special tokens marked with toktrie's
//! `0xFF` prefix, so grammars never match them as text) inside a tokenizer environment that
//! tokenizes greedily over the trie and says it is not canonical, so llguidance never forces
//! tokens on its own; a request's constraint is a `Matcher` over a parser the factory compiled.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::json;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::error::ConstraintError;
use super::grammar::Grammar;
use super::vocab::GrammarVocab;

/// The vocabulary as llguidance's tokenizer environment: the trie, with greedy tokenization
/// over it (llguidance tokenizes only to force tokens, which a non-canonical environment turns
/// off).
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Built once per engine from the model's vocabulary (Send + Sync, shared by Arc).
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
}

impl fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Builds the token trie of `vocab` and llguidance's parser factory over it.
    pub fn new(vocab: GrammarVocab) -> Result<Self, ConstraintError> {
        let words: Vec<Vec<u8>> = vocab
            .tokens()
            .iter()
            .map(|t| {
                if t.special && !t.bytes.is_empty() {
                    let mut w = Vec::with_capacity(t.bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(&t.bytes);
                    w
                } else {
                    t.bytes.clone()
                }
            })
            .collect();
        let vocab_size = words.len();
        let info = TokRxInfo::new(vocab_size as u32, vocab.eos()[0]);
        let trie = catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(vocab.eos()))
            .map_err(|_| ConstraintError::Vocab("the token trie could not be built".into()))?;
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocab(format!("parser factory: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            vocab_size,
        })
    }

    /// Number of token ids the grammar knows (the tokenizer's vocabulary).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A fresh matcher for `grammar`. A bad schema is an error here (the server turns it into
    /// HTTP 400): validated fully, no panic.
    pub fn compile(&self, grammar: &Grammar) -> Result<TokenConstraint, ConstraintError> {
        let top = match grammar {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(json!({ "type": "object" })),
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(top)))
            .map_err(|_| ConstraintError::InvalidGrammar("the grammar compiler panicked".into()))?
            .map_err(|e| ConstraintError::InvalidGrammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::InvalidGrammar(e));
        }
        Ok(TokenConstraint {
            matcher,
            vocab_size: self.vocab_size,
            committed: 0,
        })
    }
}

/// One request's matcher state (Send; Debug).
pub struct TokenConstraint {
    matcher: Matcher,
    vocab_size: usize,
    committed: usize,
}

impl fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("committed", &self.committed)
            .field("stop_reason", &self.matcher.stop_reason())
            .finish_non_exhaustive()
    }
}

impl TokenConstraint {
    /// Sets to `f32::NEG_INFINITY` the logits of tokens the grammar forbids next. `logits:
    /// [model_vocab]` (the model's vocab may be larger than the tokenizer's: ids beyond it are
    /// forbidden). Once [`TokenConstraint::is_finished`], only end-of-sequence is allowed. An
    /// error when the grammar allows no token at all.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let mask = self.mask()?;
        let known = logits.len().min(self.vocab_size);
        let mut allowed = 0usize;
        for (id, l) in logits[..known].iter_mut().enumerate() {
            if mask.is_allowed(id as TokenId) {
                allowed += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        logits[known..].fill(f32::NEG_INFINITY);
        if allowed == 0 {
            return Err(ConstraintError::DeadEnd);
        }
        Ok(())
    }

    /// The allowed next tokens as one flag per id of the tokenizer's vocabulary.
    pub fn allowed_tokens(&mut self) -> Result<Vec<bool>, ConstraintError> {
        let mask = self.mask()?;
        Ok((0..self.vocab_size)
            .map(|id| mask.is_allowed(id as TokenId))
            .collect())
    }

    fn mask(&mut self) -> Result<SimpleVob, ConstraintError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Matcher(e.to_string()))
    }

    /// Advances by the sampled token (an error if the grammar forbids it; the matcher is then
    /// unchanged).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if token as usize >= self.vocab_size {
            return Err(ConstraintError::Forbidden { token });
        }
        if self.is_finished() {
            // Finished: only end-of-sequence may follow, and it changes nothing.
            return match self.matcher.tok_env() {
                Ok(env) if env.tok_trie().eos_tokens().contains(&token) => Ok(()),
                _ => Err(ConstraintError::Forbidden { token }),
            };
        }
        let taken = self
            .matcher
            .try_consume_tokens(&[token])
            .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
        if taken != 1 {
            return Err(ConstraintError::Forbidden { token });
        }
        self.committed += 1;
        Ok(())
    }

    /// The grammar is complete and allows only end-of-sequence: the engine stops (reason stop).
    pub fn is_finished(&self) -> bool {
        matches!(
            self.matcher.stop_reason(),
            StopReason::NoExtension | StopReason::EndOfSentence
        )
    }

    /// Rebuilds after a resume: compiles, then commits each output token in order.
    pub fn replay(
        compiler: &GrammarCompiler,
        grammar: &Grammar,
        output: &[u32],
    ) -> Result<Self, ConstraintError> {
        let mut c = compiler.compile(grammar)?;
        for &t in output {
            c.commit(t)?;
        }
        Ok(c)
    }
}

/// The engine shares one compiler across threads and moves a constraint with its request.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<GrammarCompiler>();
    send::<TokenConstraint>();
};
