//! [`LlamaRunner`]: a [`LlamaModel`] and the paged [`KvCache`] it owns, as the engine's
//! [`ForwardModel`]. Decode steps take the backend's fast path ([`RunnerBackend::decode_pick`])
//! where it has one; every other step runs [`LlamaModel::forward`]'s pass and picks where the
//! backend says ([`RunnerBackend::step_pick`]: on a GPU, on the device), else on the host.

use super::{RunnerBackend, RunnerOptions};
use crate::checkpoint::driver::KvBlockIo;
use crate::engine::forward::{ForwardModel, HostWork, PickedRows, RowPick, pick_on_host};
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

/// A model and its KV cache: what the engine thread owns.
pub struct LlamaRunner<B: RunnerBackend> {
    /// The model's weights on the backend.
    pub model: LlamaModel<B>,
    /// The paged KV cache.
    pub kv: KvCache<B>,
    /// The backend's decode fast path (the CUDA decode graphs), created empty.
    decode: B::Decode,
    /// The eager passes launched ahead and not yet waited for.
    passes: B::Passes,
}

impl<B: RunnerBackend> LlamaRunner<B> {
    /// Allocates a cache of `num_blocks` blocks of `block_size` tokens for `model`, with the
    /// backend's default decode path.
    pub fn new(
        model: LlamaModel<B>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        Self::with_decode(
            model,
            num_blocks,
            block_size,
            B::new_decode(&RunnerOptions::default()),
        )
    }

    /// As [`Self::new`], with the decode path's state given (e.g. CUDA decode graphs with replay
    /// off: [`super::DecodeGraphs::with_graphs`]).
    pub fn with_decode(
        model: LlamaModel<B>,
        num_blocks: usize,
        block_size: usize,
        decode: B::Decode,
    ) -> Result<Self, ModelError> {
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(Self {
            model,
            kv,
            decode,
            passes: B::new_passes(),
        })
    }
}

impl<B: RunnerBackend> LlamaRunner<B> {
    /// A decode step through the backend's fast path (`host` run while it computes where the
    /// backend overlaps), else the backend's step pick, else the forward pass picked on the host.
    fn pick_with(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        if is_decode_step(chunks, picks)
            && let Some(out) = B::decode_pick_overlapped(
                &mut self.decode,
                &self.model,
                &mut self.kv,
                chunks,
                picks,
                host,
            )
        {
            return out.map_err(|e| e.to_string());
        }
        if let Some(out) = B::step_pick(&self.decode, &self.model, &mut self.kv, chunks, picks) {
            return out.map_err(|e| e.to_string());
        }
        pick_on_host(self.vocab_size(), self.forward(chunks)?, picks)
    }
}

/// Whether `chunks` with `picks` is a decode step a fast path may take: one new token per
/// sequence and one pick per sequence.
fn is_decode_step(chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> bool {
    !chunks.is_empty() && picks.len() == chunks.len() && chunks.iter().all(|c| c.tokens.len() == 1)
}

impl<B: RunnerBackend> ForwardModel for LlamaRunner<B> {
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
        self.pick_with(chunks, picks, &mut HostWork::none())
    }

    /// A decode step through the backend's overlapped fast path (on a GPU `host` runs while the
    /// step computes); any other step as [`ForwardModel::forward_pick`], then `host`.
    fn forward_pick_overlapped(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        let picked = self.pick_with(chunks, picks, host);
        host.run();
        picked
    }

    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        Some(self)
    }

    fn launches_decode(&self, picks: &[RowPick]) -> bool {
        B::decode_launches(&self.decode, self.vocab_size(), picks)
    }

    fn launch_decode(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), String> {
        if !is_decode_step(chunks, picks) {
            return Err("a launched step must be a decode step with a pick a row".into());
        }
        B::decode_launch(
            &mut self.decode,
            &self.model,
            &mut self.kv,
            chunks,
            picks,
            fed,
        )
        .map_err(|e| e.to_string())
    }

    fn wait_decode(&mut self) -> Result<PickedRows, String> {
        B::decode_wait(&mut self.decode, &self.model).map_err(|e| e.to_string())
    }

    fn launches_pass(&self, picks: &[RowPick]) -> bool {
        B::pass_launches(&self.decode, self.vocab_size(), picks)
    }

    fn launch_pass(&mut self, chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> Result<(), String> {
        B::pass_launch(
            &self.decode,
            &mut self.passes,
            &self.model,
            &mut self.kv,
            chunks,
            picks,
        )
        .map_err(|e| e.to_string())
    }

    fn wait_pass(&mut self) -> Result<PickedRows, String> {
        B::pass_wait(&mut self.passes, &self.model).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_token_per_sequence_with_a_pick_each_is_a_decode_step() {
        let (one, two) = ([1u32], [1u32, 2]);
        let chunk = |tokens| SeqChunk {
            tokens,
            start_pos: 3,
            block_table: &[0],
        };
        let argmax = [RowPick::Argmax, RowPick::Logits];
        assert!(is_decode_step(&[chunk(&one), chunk(&one)], &argmax));
        assert!(!is_decode_step(&[chunk(&one), chunk(&two)], &argmax));
        assert!(!is_decode_step(&[chunk(&one)], &argmax));
        assert!(!is_decode_step(&[], &[]));
    }
}
