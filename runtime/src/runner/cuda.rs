//! The CUDA backend's decode fast path: a decode step through [`DecodeGraphs`] (graph replay,
//! greedy ids chosen on the device), then the logits rows of the sequences the host samples.

use super::decode_graphs::DecodeGraphs;
use super::{RunnerBackend, RunnerOptions};
use crate::backend::cuda::CudaBackend;
use crate::engine::forward::{PickedRows, RowPick};
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

impl RunnerBackend for CudaBackend {
    type Decode = DecodeGraphs;

    fn new_decode(options: &RunnerOptions) -> DecodeGraphs {
        DecodeGraphs::with_graphs(options.cuda_graphs)
    }

    fn decode_pick(
        graphs: &mut DecodeGraphs,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>> {
        if !DecodeGraphs::accepts(chunks) || picks.len() != chunks.len() {
            return None;
        }
        let mut run = || -> Result<PickedRows, ModelError> {
            let ids = graphs.step(model, kv, chunks)?;
            let vocab = model.config().vocab_size;
            let mut out = PickedRows::default();
            for (row, (pick, id)) in picks.iter().zip(ids).enumerate() {
                out.tokens.push((*pick == RowPick::Argmax).then_some(id));
                if *pick == RowPick::Logits {
                    let start = out.logits.len();
                    out.logits.resize(start + vocab, 0.0);
                    graphs.download_logits_row(model.backend(), row, &mut out.logits[start..])?;
                }
            }
            Ok(out)
        };
        Some(run())
    }
}
