//! [`GrammarSupport`]: an engine's structured-output capability, built on first use, and
//! [`Constrained`]: one request's grammar with its matcher.
//!
//! Design: building the compiler (the byte vocabulary's token trie and llguidance's factory) costs
//! a fraction of a second on a 49K-token vocabulary, so an engine pays it only when the first
//! constrained request arrives (or a resumed run holds one), never at start-up. The vocabulary
//! comes from a closure the application provides (the runner owns the tokenizer).

use std::sync::{Arc, OnceLock};

use super::{ConstraintError, Grammar, GrammarCompiler, GrammarVocab, TokenConstraint};

/// Builds the vocabulary when first needed.
type VocabSource = Box<dyn Fn() -> Result<GrammarVocab, ConstraintError> + Send + Sync>;

/// Structured output for one engine: the compiler, built once, on first use.
pub struct GrammarSupport {
    vocab: VocabSource,
    compiler: OnceLock<Result<Arc<GrammarCompiler>, ConstraintError>>,
}

impl std::fmt::Debug for GrammarSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarSupport")
            .field("built", &self.compiler.get().is_some())
            .finish_non_exhaustive()
    }
}

impl GrammarSupport {
    /// Support whose vocabulary `vocab` builds (called at most once).
    pub fn new(
        vocab: impl Fn() -> Result<GrammarVocab, ConstraintError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            vocab: Box::new(vocab),
            compiler: OnceLock::new(),
        }
    }

    /// The compiler, built on the first call (an error then is returned every time).
    pub fn compiler(&self) -> Result<&GrammarCompiler, ConstraintError> {
        match self
            .compiler
            .get_or_init(|| (self.vocab)().and_then(GrammarCompiler::new).map(Arc::new))
        {
            Ok(c) => Ok(c),
            Err(e) => Err(e.clone()),
        }
    }

    /// A fresh matcher for `grammar` (an invalid grammar is an error, never a panic).
    pub fn bind(&self, grammar: Grammar) -> Result<Constrained, ConstraintError> {
        let matcher = self.compiler()?.compile(&grammar)?;
        Ok(Constrained { grammar, matcher })
    }

    /// The matcher of a restored request: `grammar` with its `output` so far replayed.
    pub fn rebind(&self, grammar: Grammar, output: &[u32]) -> Result<Constrained, ConstraintError> {
        let matcher = TokenConstraint::replay(self.compiler()?, &grammar, output)?;
        Ok(Constrained { grammar, matcher })
    }
}

/// A request's grammar and the matcher that follows its output.
#[derive(Debug)]
pub struct Constrained {
    /// What the output must match (journaled as [`Grammar::to_record`]).
    pub grammar: Grammar,
    /// Where the output stands in it.
    pub matcher: TokenConstraint,
}
