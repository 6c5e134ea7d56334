//! The model runner: the real model bound to the engine. [`LlamaRunner`] (a [`LlamaModel`], the
//! paged [`KvCache`] it owns and the backend's decode fast path) implements
//! [`ForwardModel`]; [`TokenizerCodec`] adapts the loader's tokenizer to
//! [`crate::engine::TextCodec`].
//!
//! Design (nano-vllm's `ModelRunner`, which owns its CUDA graphs): the model is written once over
//! the [`Backend`] ops, and the runner decides how each step runs. Prefill and mixed steps go
//! through [`LlamaModel::forward`]'s pass, their greedy ids chosen on the device where the backend
//! can ([`RunnerBackend::step_pick`]); a pure decode step (one new token per sequence) goes through
//! the backend's fast path where it has one: on CUDA, [`DecodeGraphs`] replays the model's own
//! layer stack from CUDA graphs per batch bucket and chooses greedy tokens on the device. The path
//! is picked by the backend type at compile time ([`RunnerBackend`]), not by a run-time downcast,
//! and the backends know nothing of the model: the runner drives the CUDA backend through its
//! public graph and buffer interface (`capture`, `replay`, `scratch_generation`,
//! `upload_u32_staged`, `download_u32_staged`, `download_f32_at`, `argmax_rows`). A decode step
//! can also be launched and waited for apart ([`RunnerBackend::decode_launch`],
//! [`RunnerBackend::decode_wait`]), so the engine can enqueue step N + 1 before step N's tokens
//! come back (`engine::ahead`), and so can an eager pass ([`RunnerBackend::pass_launch`],
//! [`RunnerBackend::pass_wait`]: prefill pass N + 1 enqueued before pass N's tokens come back,
//! `engine::prefill_ahead`).
//!
//! Dependencies point one way: `runner` -> `model`, `backend`, and the engine's
//! [`ForwardModel`] contract.

mod cuda;
pub mod decode_graphs;
#[cfg(test)]
mod deterministic_tests;
pub mod grammar_vocab;
#[cfg(test)]
mod grammar_vocab_tests;
mod kv_io;
mod llama_runner;
mod passes_ahead;
pub mod tensor_parallel;
#[cfg(test)]
mod text_cost_tests;
mod tokenizer_codec;

pub use decode_graphs::DecodeGraphs;
pub use llama_runner::LlamaRunner;
pub use tensor_parallel::TensorParallelRunner;
pub use tokenizer_codec::TokenizerCodec;

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::engine::forward::{HostWork, PickedRows, RowPick};
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

#[cfg(doc)]
use crate::engine::ForwardModel;

/// How the runner runs decode steps, where the backend gives it a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerOptions {
    /// On CUDA: capture each decode step once per batch bucket and replay it as a CUDA graph
    /// (default). Off: the same fixed buffers, launched eagerly every step (what the graphs save
    /// is the difference).
    pub cuda_graphs: bool,
    /// On CUDA: draw the tokens of plain sampled rows on the device (`draw_tokens`, the host's
    /// `draw` bit for bit), so only their ids come back; off: their logits rows are downloaded
    /// and drawn on the host, the same tokens at a far higher cost (default on; checked by
    /// `draw_rows_match_the_engine_draw` and `kernels/bench/gpu-device-draw.sh`).
    pub device_draw: bool,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            cuda_graphs: true,
            device_draw: true,
        }
    }
}

/// A backend the runner can drive: the [`Backend`] ops, plus the backend's own way of running a
/// pure decode step, if it has one.
pub trait RunnerBackend: Backend + crate::backend::kv_stage::KvStager {
    /// State of the decode fast path, kept by the runner across steps (`()` where there is
    /// none).
    type Decode: Send;

    /// State of the eager passes launched ahead ([`RunnerBackend::pass_launch`]), kept by the
    /// runner across passes (`()` where the backend launches none).
    type Passes: Send;

    /// The decode fast path's initial state under `options`.
    fn new_decode(options: &RunnerOptions) -> Self::Decode;

    /// The initial state of the passes launched ahead: none in flight.
    fn new_passes() -> Self::Passes;

    /// Runs `chunks` (a decode step: every chunk one new token, one pick per chunk) through the
    /// fast path and returns what `picks` asks of each row; None when this backend has no fast
    /// path for the step, and the runner then runs [`LlamaModel::forward`] and picks on the
    /// host.
    fn decode_pick(
        decode: &mut Self::Decode,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>>;

    /// [`RunnerBackend::decode_pick`], running `host` between launching the step and waiting for
    /// its answer where the backend computes asynchronously (a GPU). The default runs the step as
    /// `decode_pick` does and leaves `host` to the runner, which runs it after the step.
    fn decode_pick_overlapped(
        decode: &mut Self::Decode,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Option<Result<PickedRows, ModelError>> {
        let _ = host;
        Self::decode_pick(decode, model, kv, chunks, picks)
    }

    /// Whether [`RunnerBackend::decode_launch`] takes a decode step with these picks on a model
    /// of `vocab` tokens. Default: no, the backend answers each step before the next.
    fn decode_launches(decode: &Self::Decode, vocab: usize, picks: &[RowPick]) -> bool {
        let _ = (decode, vocab, picks);
        false
    }

    /// Enqueues a decode step through the fast path without waiting for it
    /// ([`ForwardModel::launch_decode`]'s contract, `fed` included); its picks come back from
    /// [`RunnerBackend::decode_wait`]. The default has no such path.
    fn decode_launch(
        decode: &mut Self::Decode,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), ModelError> {
        let _ = (decode, model, kv, chunks, picks, fed);
        Err(ModelError::InvalidBatch(
            "this backend does not launch decode steps ahead".into(),
        ))
    }

    /// The picks of the oldest step [`RunnerBackend::decode_launch`] enqueued, once it is done.
    fn decode_wait(
        decode: &mut Self::Decode,
        model: &LlamaModel<Self>,
    ) -> Result<PickedRows, ModelError> {
        let _ = (decode, model);
        Err(ModelError::InvalidBatch(
            "no decode step is in flight".into(),
        ))
    }

    /// Whether [`RunnerBackend::pass_launch`] takes a pass with these picks on a model of
    /// `vocab` tokens. Default: no, the backend answers each pass before the next.
    fn pass_launches(decode: &Self::Decode, vocab: usize, picks: &[RowPick]) -> bool {
        let _ = (decode, vocab, picks);
        false
    }

    /// Enqueues an eager pass ([`RunnerBackend::step_pick`]'s, a prefill pass in the engine's
    /// use) without waiting for it ([`ForwardModel::launch_pass`]'s contract); its picks come
    /// back from [`RunnerBackend::pass_wait`]. The default has no such path.
    fn pass_launch(
        decode: &Self::Decode,
        passes: &mut Self::Passes,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<(), ModelError> {
        let _ = (decode, passes, model, kv, chunks, picks);
        Err(ModelError::InvalidBatch(
            "this backend does not launch passes ahead".into(),
        ))
    }

    /// The picks of the oldest pass [`RunnerBackend::pass_launch`] enqueued, once it is done.
    fn pass_wait(
        passes: &mut Self::Passes,
        model: &LlamaModel<Self>,
    ) -> Result<PickedRows, ModelError> {
        let _ = (passes, model);
        Err(ModelError::InvalidBatch("no pass is in flight".into()))
    }

    /// Runs any other step (a prefill, a mixed step; one pick per chunk) through
    /// [`LlamaModel::forward`]'s pass and returns what `picks` asks of each row, choosing the
    /// greedy ids where the logits are so only the ids and the sampled rows travel; None when
    /// the backend gains nothing over downloading every row (the runner then picks on the host),
    /// which is the default.
    fn step_pick(
        decode: &Self::Decode,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>> {
        let _ = (decode, model, kv, chunks, picks);
        None
    }
}

/// The CPU runs every step through [`LlamaModel::forward`] and picks on the host: a host backend
/// has no launch cost a graph would save and no device round trip an on-device argmax would.
impl RunnerBackend for CpuBackend {
    type Decode = ();
    type Passes = ();

    fn new_decode(_options: &RunnerOptions) {}

    fn new_passes() {}

    fn decode_pick(
        _decode: &mut (),
        _model: &LlamaModel<Self>,
        _kv: &mut KvCache<Self>,
        _chunks: &[SeqChunk<'_>],
        _picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>> {
        None
    }
}
