//! Binds the real model to the engine: [`LlamaRunner`] (a [`LlamaModel`] plus the paged
//! [`KvCache`] it owns) implements [`ForwardModel`], and [`TokenizerCodec`] adapts the loader's
//! tokenizer to [`TextCodec`].
//!
//! On the CUDA backend, decode steps (one new token per sequence) run through
//! [`DecodeGraphs`]: CUDA graphs replayed per batch bucket, the greedy token chosen on the GPU,
//! logits rows downloaded only for sequences the host samples. The backend is found at run time
//! (`Any` downcast), so the runner stays generic over [`Backend`].

use std::any::Any;

use crate::backend::Backend;
use crate::backend::cuda::{CudaBackend, DecodeGraphs};
use crate::checkpoint::driver::KvBlockIo;
use crate::loader::Tokenizer;
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

use super::codec::TextCodec;
use super::forward::{ForwardModel, PickedRows, RowPick, pick_on_host};

/// A model and its KV cache: what the engine thread owns.
pub struct LlamaRunner<B: Backend> {
    pub model: LlamaModel<B>,
    pub kv: KvCache<B>,
    /// Decode graphs, when the backend is CUDA (created at the first decode step).
    decode_graphs: Option<DecodeGraphs>,
}

impl<B: Backend> LlamaRunner<B> {
    /// Allocates a cache of `num_blocks` blocks of `block_size` tokens for `model`.
    pub fn new(
        model: LlamaModel<B>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(Self {
            model,
            kv,
            decode_graphs: None,
        })
    }

    /// A decode step on the CUDA backend through [`DecodeGraphs`]; None when the backend is not
    /// CUDA or `chunks` is not a pure decode step.
    fn pick_on_cuda(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, String>> {
        let model = (&self.model as &dyn Any).downcast_ref::<LlamaModel<CudaBackend>>()?;
        let kv = (&mut self.kv as &mut dyn Any).downcast_mut::<KvCache<CudaBackend>>()?;
        if !DecodeGraphs::accepts(chunks) || picks.len() != chunks.len() {
            return None;
        }
        let graphs = self.decode_graphs.get_or_insert_with(DecodeGraphs::new);
        let mut run = || -> Result<PickedRows, String> {
            let ids = graphs.step(model, kv, chunks).map_err(|e| e.to_string())?;
            let vocab = model.config().vocab_size;
            let mut out = PickedRows::default();
            for (row, (pick, id)) in picks.iter().zip(ids).enumerate() {
                out.tokens.push((*pick == RowPick::Argmax).then_some(id));
                if *pick == RowPick::Logits {
                    let start = out.logits.len();
                    out.logits.resize(start + vocab, 0.0);
                    graphs
                        .download_logits_row(model.backend(), row, &mut out.logits[start..])
                        .map_err(|e| e.to_string())?;
                }
            }
            Ok(out)
        };
        Some(run())
    }
}

impl<B: Backend> ForwardModel for LlamaRunner<B> {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.model
            .forward(&mut self.kv, chunks)
            .map_err(|e| e.to_string())
    }

    fn forward_pick(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        if let Some(out) = self.pick_on_cuda(chunks, picks) {
            return out;
        }
        pick_on_host(self.vocab_size(), self.forward(chunks)?, picks)
    }

    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        Some(self)
    }
}

/// The loader's tokenizer as the engine's codec. `add_special` adds the model's BOS (when it uses
/// one) in front of every prompt, as `transformers` does for plain completion prompts.
pub struct TokenizerCodec {
    pub tokenizer: Tokenizer,
    pub add_special: bool,
}

impl TextCodec for TokenizerCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, self.add_special)
            .map_err(|e| e.to_string())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer
            .decode_skip_special(ids)
            .map_err(|e| e.to_string())
    }
}
