//! Structured output: constrained decoding of a request's tokens against a [`Grammar`] (a JSON
//! schema, any JSON object, a regex or a Lark grammar).
//!
//! Design (the llguidance integration used by vLLM and SGLang): one [`GrammarCompiler`] per
//! engine holds the model's byte vocabulary ([`GrammarVocab`], built by the runner from its
//! tokenizer) as a token trie; each constrained request gets a [`TokenConstraint`], a matcher
//! that, before every sampling step, sets the logits of the tokens its grammar forbids next to
//! `-inf` ([`TokenConstraint::mask_logits`]) and after it advances by the sampled token
//! ([`TokenConstraint::commit`]). The grammar travels in the journal as text
//! ([`Grammar::to_record`]); a resumed request rebuilds its matcher by replaying its output
//! ([`TokenConstraint::replay`]). Everything that names llguidance lives in `llg.rs`, so another
//! matcher crate could replace it behind the same types.

mod error;
mod grammar;
mod llg;
mod support;
mod vocab;

pub use error::ConstraintError;
pub use grammar::Grammar;
pub use llg::{GrammarCompiler, TokenConstraint};
pub use support::{Constrained, GrammarSupport};
pub use vocab::{GrammarVocab, VocabToken};

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
