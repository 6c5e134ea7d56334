//! The one call the engine makes into a model: a forward pass over a batch of sequence chunks on a
//! paged KV cache the model owns. [`crate::model::LlamaModel`] implements it on every backend; tests
//! of scheduling logic use [`super::fake::FakeModel`].

use crate::checkpoint::driver::KvBlockIo;
use crate::model::batch::SeqChunk;

/// A model plus its paged KV cache, driven by the engine's block tables.
pub trait ForwardModel: Send {
    /// Size of the logits row of one chunk.
    fn vocab_size(&self) -> usize;
    /// Runs `chunks` (prefill chunks and decode tokens mixed) and returns the logits of the last
    /// token of each chunk, `[chunks.len(), vocab_size]` row-major.
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String>;
    /// Block-level access to the KV cache, for checkpoints that store KV (`KvMode::Blocks`);
    /// None when the model keeps no KV the engine can read (then only `Recompute` mode works).
    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        None
    }
}

impl<T: ForwardModel + ?Sized> ForwardModel for Box<T> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        (**self).forward(chunks)
    }
    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        (**self).kv_io()
    }
}
