//! Turning a [`Request`] into a [`Sequence`]: validation, tokenization and the limits that need the
//! model (context length, KV cache size, vocabulary). Runs on the caller's thread, so a bad request
//! is refused before it reaches the engine and never disturbs running ones.

use std::sync::mpsc::Sender;
use std::time::Instant;

use super::codec::TextCodec;
use super::constraint::{Grammar, GrammarSupport};
use super::error::EngineError;
use super::output::Output;
use super::request::{Prompt, Request};
use super::rng::SampleRng;
use super::sequence::Sequence;
use super::text::TextStream;

/// Limits a request is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntakeLimits {
    /// The model's context length in tokens (prompt plus at least one new token must fit).
    pub context_len: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Blocks in the KV cache (a prompt needing more is refused).
    pub num_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Upper bound on a request's `max_tokens` (the machine's `max_tokens` constant).
    pub max_tokens_cap: usize,
}

/// Validates and tokenizes `req`, producing the sequence the engine will run.
pub fn build_sequence(
    id: u64,
    req: Request,
    codec: &dyn TextCodec,
    limits: &IntakeLimits,
    tx: Sender<Output>,
) -> Result<Sequence, EngineError> {
    let arrival = Instant::now();
    req.validate()?;
    if req.grammar.is_some() {
        // The handle binds grammars ([`bind_grammar`]); a plain intake has no compiler.
        return Err(EngineError::InvalidGrammar(
            "this engine has no structured-output support".into(),
        ));
    }
    let prompt = match req.prompt {
        Prompt::Text(t) => codec.encode(&t).map_err(EngineError::Tokenizer)?,
        Prompt::Tokens(t) => t,
    };
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if let Some(&token) = prompt.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(EngineError::TokenOutOfVocab {
            token,
            vocab_size: limits.vocab_size,
        });
    }
    if let Some(&(token, _)) = req
        .sampling
        .logit_bias
        .iter()
        .find(|(t, _)| *t as usize >= limits.vocab_size)
    {
        return Err(EngineError::TokenOutOfVocab {
            token,
            vocab_size: limits.vocab_size,
        });
    }
    // The cache is checked first: the engine's context length is capped by the cache's size, and
    // "the whole KV cache" says why better than "the context".
    let needed = (prompt.len() + 1).div_ceil(limits.block_size);
    if needed > limits.num_blocks {
        return Err(EngineError::PromptExceedsCache {
            needed,
            total: limits.num_blocks,
        });
    }
    if prompt.len() + 1 > limits.context_len {
        return Err(EngineError::PromptTooLong {
            prompt_tokens: prompt.len(),
            context_len: limits.context_len,
        });
    }
    let seed = req.sampling.seed.unwrap_or_else(rand::random);
    let text = TextStream::new(&prompt, req.stop);
    Ok(Sequence {
        id,
        prompt_len: prompt.len(),
        tokens: prompt,
        computed: 0,
        prefilled: false,
        block_table: Vec::new(),
        max_tokens: req.max_tokens.min(limits.max_tokens_cap),
        rng: SampleRng::new(seed),
        sampling: req.sampling,
        ignore_eos: req.ignore_eos,
        text,
        tx,
        arrival,
        first_token_at: None,
        last_token_at: None,
        inter_token: Vec::new(),
        preemptions: 0,
        draft: Vec::new(),
        tag: req.tag,
        constraint: None,
        prefix: Default::default(),
    })
}

/// Gives `seq` a matcher for `grammar` (compiled here, on the caller's thread: a bad schema is
/// refused before anything is journaled or queued).
pub fn bind_grammar(
    seq: &mut Sequence,
    grammar: Grammar,
    support: Option<&GrammarSupport>,
) -> Result<(), EngineError> {
    let support = support.ok_or_else(|| {
        EngineError::InvalidGrammar(
            "structured output needs the model's tokenizer; this engine has none".into(),
        )
    })?;
    let bound = support
        .bind(grammar)
        .map_err(|e| EngineError::InvalidGrammar(e.to_string()))?;
    seq.constraint = Some(bound);
    Ok(())
}
