//! The online benchmark's requests: vLLM's "random" dataset. Each prompt is `input_len` random
//! token ids (special tokens excluded) of the served model's tokenizer, each output `output_len`
//! tokens; with `--random-range-ratio r` both vary uniformly in `[len * (1 - r), len * (1 + r)]`.
//!
//! Design: prompts go to `/v1/completions` as token-id lists (exact input lengths on every server
//! that accepts them, as the OpenAI API does) or, for chat and `--prompt-format text`, as the ids'
//! decoded text (the server re-tokenizes it, so the input length is then only close; the report
//! uses the server's `usage.prompt_tokens` when it sends it). The tokenizer is read from a
//! `tokenizer.json`, a Hugging Face folder or a GGUF file's metadata, never from the server.

use std::path::Path;

use anyhow::Context;
use rand::Rng;

use crate::loader::Tokenizer;
use crate::loader::gguf::reader::Gguf;
use crate::loader::gguf::tokenizer::tokenizer_from_gguf;

/// How a prompt is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptFormat {
    /// A list of token ids (completions only).
    Ids,
    /// The decoded text of the ids.
    Text,
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The prompt as text (set for text prompts).
    pub text: Option<String>,
    /// Tokens to generate (`max_tokens`, with `ignore_eos`).
    pub output_len: usize,
}

/// Reads the tokenizer at `path`: a `tokenizer.json`, a folder holding one, or a `.gguf` file.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    if path.is_dir() {
        return Ok(Tokenizer::from_file(&path.join("tokenizer.json"))?);
    }
    if path.extension().is_some_and(|e| e == "gguf") {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let g = Gguf::parse(&bytes, path)?;
        return Ok(tokenizer_from_gguf(&g)?.0);
    }
    Ok(Tokenizer::from_file(path)?)
}

/// Token ids a random prompt may use: the vocabulary less its special (added, control) tokens.
pub fn ordinary_ids(tokenizer: &Tokenizer) -> Vec<u32> {
    let special: std::collections::HashSet<u32> = tokenizer
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    (0..tokenizer.vocab_size() as u32)
        .filter(|id| !special.contains(id))
        .collect()
}

/// A length drawn uniformly from `[len * (1 - r), len * (1 + r)]` (at least 1).
pub fn vary(len: usize, ratio: f64, rng: &mut impl Rng) -> usize {
    let r = ratio.clamp(0.0, 1.0);
    let lo = ((len as f64) * (1.0 - r)).round().max(1.0) as usize;
    let hi = ((len as f64) * (1.0 + r)).round().max(lo as f64) as usize;
    rng.gen_range(lo..=hi)
}

/// Shape of the workload.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadShape {
    /// Requests.
    pub num_prompts: usize,
    /// Prompt tokens per request (before variation).
    pub input_len: usize,
    /// Generated tokens per request (before variation).
    pub output_len: usize,
    /// Relative variation of both lengths (vLLM's `--random-range-ratio`).
    pub range_ratio: f64,
}

/// Draws the workload; `vocab` are the ids a prompt may use (non-empty).
pub fn build(
    shape: WorkloadShape,
    vocab: &[u32],
    text_from: Option<&Tokenizer>,
    rng: &mut impl Rng,
) -> anyhow::Result<Vec<WorkItem>> {
    anyhow::ensure!(!vocab.is_empty(), "the tokenizer has no ordinary tokens");
    (0..shape.num_prompts)
        .map(|_| {
            let n_in = vary(shape.input_len, shape.range_ratio, rng);
            let output_len = vary(shape.output_len, shape.range_ratio, rng);
            let ids: Vec<u32> = (0..n_in)
                .map(|_| vocab[rng.gen_range(0..vocab.len())])
                .collect();
            let text = match text_from {
                Some(t) => Some(t.decode_skip_special(&ids)?),
                None => None,
            };
            Ok(WorkItem {
                ids,
                text,
                output_len,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn lengths_stay_in_range_and_seed_repeats() {
        let vocab: Vec<u32> = (10..20).collect();
        let shape = WorkloadShape {
            num_prompts: 50,
            input_len: 100,
            output_len: 10,
            range_ratio: 0.5,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let w = build(shape, &vocab, None, &mut rng).unwrap();
        assert_eq!(w.len(), 50);
        assert!(w.iter().all(|i| (50..=150).contains(&i.ids.len())));
        assert!(w.iter().all(|i| (5..=15).contains(&i.output_len)));
        assert!(w.iter().flat_map(|i| &i.ids).all(|id| vocab.contains(id)));
        // Lengths do vary, and the same seed gives the same workload.
        assert!(w.iter().any(|i| i.ids.len() != w[0].ids.len()));
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        assert_eq!(build(shape, &vocab, None, &mut rng).unwrap(), w);
        let fixed = WorkloadShape {
            range_ratio: 0.0,
            ..shape
        };
        let w = build(fixed, &vocab, None, &mut rng).unwrap();
        assert!(w.iter().all(|i| i.ids.len() == 100 && i.output_len == 10));
    }
}
