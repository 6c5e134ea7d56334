//! Binds the real model to the engine: [`LlamaRunner`] (a [`LlamaModel`] plus the paged
//! [`KvCache`] it owns) implements [`ForwardModel`], and [`TokenizerCodec`] adapts the loader's
//! tokenizer to [`TextCodec`].

use crate::backend::Backend;
use crate::checkpoint::driver::KvBlockIo;
use crate::loader::Tokenizer;
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

use super::codec::TextCodec;
use super::forward::ForwardModel;

/// A model and its KV cache: what the engine thread owns.
pub struct LlamaRunner<B: Backend> {
    pub model: LlamaModel<B>,
    pub kv: KvCache<B>,
}

impl<B: Backend> LlamaRunner<B> {
    /// Allocates a cache of `num_blocks` blocks of `block_size` tokens for `model`.
    pub fn new(
        model: LlamaModel<B>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(Self { model, kv })
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
