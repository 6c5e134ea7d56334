//! Errors of constrained decoding: a grammar that cannot be compiled (the server's HTTP 400), a
//! vocabulary that cannot be used, and a token the grammar forbids. `thiserror` types; nothing on
//! user input panics.

use thiserror::Error;

/// Why a grammar, a vocabulary or a matcher step was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConstraintError {
    /// The grammar (JSON schema, regex, Lark) is invalid or unsupported; holds the matcher's
    /// message.
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
    /// A journaled grammar record could not be read back.
    #[error("unreadable grammar record: {0}")]
    Record(String),
    /// The byte vocabulary cannot be built or used; holds why.
    #[error("grammar vocabulary: {0}")]
    Vocab(String),
    /// The sampled token is not one the grammar allows next.
    #[error("token {token} is not allowed by the grammar here")]
    Forbidden {
        /// The refused token id.
        token: u32,
    },
    /// The grammar allows no token of the model's vocabulary, and is not finished.
    #[error("the grammar allows no token of the vocabulary here")]
    DeadEnd,
    /// The matcher itself failed (it is unusable from then on); holds its message.
    #[error("grammar matcher: {0}")]
    Matcher(String),
}
