//! Perplexity of a model over a token stream (`sov perplexity`): how well the model predicts a
//! fixed text, the number to compare precisions and quantizations by (FP8 against bf16, Q4 against
//! F16).
//!
//! Design: llama.cpp's `llama-perplexity` without its half-window scoring. The tokens are cut into
//! windows of `window` tokens; each window runs as one prompt from position 0 through the model's
//! forward pass ([`LlamaModel::forward_all_logits`], a fresh context each time) and every token
//! after the window's first is scored by the negative log-likelihood the logits one position
//! earlier give it (a log-softmax in f64). Perplexity is `exp` of the mean over every scored
//! token. Nothing here knows the backend: [`perplexity`] opens the one the options name, as an
//! engine start does.

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaTuning};
use crate::engine::EngineError;
use crate::model::batch::SeqChunk;
use crate::model::{LlamaModel, ModelError};

use super::options::{Device, ModelParts};

/// Tokens a KV block holds in the cache a window runs in.
const BLOCK: usize = 16;

/// What [`perplexity_on`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perplexity {
    /// Tokens scored (each window's tokens but its first).
    pub scored: usize,
    /// Windows run.
    pub windows: usize,
    /// Mean negative log-likelihood of the scored tokens, in nats.
    pub mean_nll: f64,
}

impl Perplexity {
    /// `exp(mean_nll)`.
    pub fn value(&self) -> f64 {
        self.mean_nll.exp()
    }
}

/// `-log softmax(row)[target]`, in f64; None when `target` is outside the row or the row holds no
/// finite maximum.
pub fn token_nll(row: &[f32], target: u32) -> Option<f64> {
    let hit = f64::from(*row.get(target as usize)?);
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let max = f64::from(max);
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    Some(max + sum.ln() - hit)
}

/// Perplexity of `model` over `tokens` in windows of `window` tokens (the last window may be
/// shorter; one of a single token scores nothing). Errors when `window` is below 2, longer than
/// the model's positions, or no token gets scored.
pub fn perplexity_on<B: Backend>(
    model: &LlamaModel<B>,
    tokens: &[u32],
    window: usize,
) -> Result<Perplexity, ModelError> {
    let positions = model.config().max_position_embeddings;
    if window < 2 || window > positions {
        return Err(ModelError::InvalidBatch(format!(
            "a perplexity window of {window} tokens (expected 2..={positions})"
        )));
    }
    let vocab = model.config().vocab_size;
    let blocks = window.div_ceil(BLOCK);
    let mut kv = model.new_kv_cache(blocks, BLOCK)?;
    let table: Vec<u32> = (0..blocks as u32).collect(); // [blocks]
    let (mut nll, mut scored, mut windows) = (0f64, 0usize, 0usize);
    for part in tokens.chunks(window).filter(|p| p.len() >= 2) {
        let chunk = SeqChunk {
            tokens: part,
            start_pos: 0,
            block_table: &table,
        };
        let logits = model.forward_all_logits(&mut kv, &[chunk])?; // [part.len(), vocab]
        for (row, &next) in logits.chunks_exact(vocab.max(1)).zip(&part[1..]) {
            nll += token_nll(row, next).ok_or_else(|| {
                ModelError::InvalidBatch(format!(
                    "token {next} has no finite log-likelihood (vocabulary {vocab})"
                ))
            })?;
            scored += 1;
        }
        windows += 1;
    }
    if scored == 0 {
        return Err(ModelError::InvalidBatch(
            "no token to score: the text needs at least 2 tokens".into(),
        ));
    }
    Ok(Perplexity {
        scored,
        windows,
        mean_nll: nll / scored as f64,
    })
}

/// [`perplexity_on`] for `parts` on `device`: the CPU, or a GPU opened with `cuda_tuning` (FP8
/// included) and in f32 when `precise`, as an engine start opens it.
pub fn perplexity(
    parts: ModelParts,
    device: Device,
    precise: bool,
    cuda_tuning: &CudaTuning,
    tokens: &[u32],
    window: usize,
) -> Result<Perplexity, EngineError> {
    let fwd = |e: ModelError| EngineError::Forward(e.to_string());
    match device {
        Device::Cpu => {
            let model = LlamaModel::from_tensors(CpuBackend::new(), &parts.config, parts.tensors)
                .map_err(fwd)?;
            perplexity_on(&model, tokens, window).map_err(fwd)
        }
        Device::Cuda(n) => {
            let backend = CudaBackend::with_tuning(n, cuda_tuning.clone())
                .map_err(|e| EngineError::Forward(format!("device cuda:{n}: {e}")))?
                .with_precise(precise);
            let model =
                LlamaModel::from_tensors(backend, &parts.config, parts.tensors).map_err(fwd)?;
            perplexity_on(&model, tokens, window).map_err(fwd)
        }
    }
}
