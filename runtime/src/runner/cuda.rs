//! The CUDA backend's fast paths: a decode step through [`DecodeGraphs`] (graph replay, greedy
//! ids chosen on the device), then the logits rows of the sequences the host samples; a decode
//! step whose every row is picked on the device may also be launched without waiting for it
//! (`decode_launch`, its ids fed from the step before it, and `decode_wait`); any other
//! step (a prefill pass, a mixed step) eagerly through the model's forward pass with the same
//! device-side choice ([`step_pick`]), so a mixed step of a thousand decode rows downloads a
//! thousand ids, not a thousand vocabulary-wide rows (128256 x 4 bytes each at Llama-3's size);
//! such a pass whose every row is picked on the device (or needs no token) may also be launched
//! without waiting for it ([`PassesAhead`]: prefill pass N + 1 before pass N's tokens return).

use super::decode_graphs::DecodeGraphs;
use super::passes_ahead::PassesAhead;
use super::{RunnerBackend, RunnerOptions};
use crate::backend::cuda::{CudaBackend, CudaBuffer, DrawRow, MAX_DRAW_VOCAB};
use crate::backend::{Backend, DType};
use crate::engine::forward::{HostWork, PickedRows, RowPick};
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

impl RunnerBackend for CudaBackend {
    type Decode = DecodeGraphs;
    type Passes = PassesAhead;

    fn new_decode(options: &RunnerOptions) -> DecodeGraphs {
        DecodeGraphs::with_graphs(options.cuda_graphs).drawing_on_device(options.device_draw)
    }

    fn new_passes() -> PassesAhead {
        PassesAhead::default()
    }

    fn decode_pick(
        graphs: &mut DecodeGraphs,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>> {
        Self::decode_pick_overlapped(graphs, model, kv, chunks, picks, &mut HostWork::none())
    }

    /// The step is enqueued (graph replay or eager launches), `host` runs while the GPU computes,
    /// then the greedy ids come back (the download waits for the step).
    fn decode_pick_overlapped(
        graphs: &mut DecodeGraphs,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Option<Result<PickedRows, ModelError>> {
        if !DecodeGraphs::accepts(chunks) || picks.len() != chunks.len() {
            return None;
        }
        let vocab = model.config().vocab_size;
        let device_draws = device_draws(picks, vocab, graphs.device_draw());
        let mut run = || -> Result<PickedRows, ModelError> {
            let ids = graphs.step_overlapped(model, kv, chunks, &device_draws, host)?;
            let mut out = PickedRows::default();
            for (row, (pick, id)) in picks.iter().zip(ids).enumerate() {
                let on_device = match pick {
                    RowPick::Argmax => true,
                    RowPick::Draw(_) => !device_draws.is_empty(),
                    _ => false,
                };
                out.tokens.push(on_device.then_some(id));
                if *pick == RowPick::Logits {
                    let start = out.logits.len();
                    out.logits.resize(start + vocab, 0.0);
                    graphs.download_logits_row(model.backend(), row, &mut out.logits[start..])?;
                }
            }
            if device_draws.is_empty()
                && let Some(logits) = graphs.logits()
            {
                draw_on_host(model.backend(), logits, vocab, picks, &mut out.tokens)?;
            }
            Ok(out)
        };
        Some(run())
    }

    /// Argmax rows, and drawn rows where the device draws them: rows whose ids alone come back.
    fn decode_launches(graphs: &DecodeGraphs, vocab: usize, picks: &[RowPick]) -> bool {
        picked_on_device(graphs, vocab, picks, false)
    }

    fn decode_launch(
        graphs: &mut DecodeGraphs,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), ModelError> {
        let vocab = model.config().vocab_size;
        if picks.len() != chunks.len() || !Self::decode_launches(graphs, vocab, picks) {
            return Err(ModelError::InvalidBatch(
                "a launched decode step's rows must all be picked on the device".into(),
            ));
        }
        let draws = device_draws(picks, vocab, graphs.device_draw());
        graphs.launch(model, kv, chunks, &draws, fed)
    }

    fn decode_wait(
        graphs: &mut DecodeGraphs,
        model: &LlamaModel<Self>,
    ) -> Result<PickedRows, ModelError> {
        let ids = graphs.wait(model.backend())?;
        Ok(PickedRows {
            tokens: ids.into_iter().map(Some).collect(),
            logits: Vec::new(),
        })
    }

    /// The rows `decode_launches` takes, plus prompt chunks that need no token.
    fn pass_launches(graphs: &DecodeGraphs, vocab: usize, picks: &[RowPick]) -> bool {
        picked_on_device(graphs, vocab, picks, true)
    }

    fn pass_launch(
        graphs: &DecodeGraphs,
        passes: &mut PassesAhead,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<(), ModelError> {
        let vocab = model.config().vocab_size;
        if picks.len() != chunks.len() || !Self::pass_launches(graphs, vocab, picks) {
            return Err(ModelError::InvalidBatch(
                "a pass launched ahead must pick its tokens on the device".into(),
            ));
        }
        let draws = device_draws(picks, vocab, graphs.device_draw());
        passes.launch(model, kv, chunks, picks, &draws)
    }

    fn pass_wait(
        passes: &mut PassesAhead,
        model: &LlamaModel<Self>,
    ) -> Result<PickedRows, ModelError> {
        passes.wait(model.backend())
    }

    fn step_pick(
        graphs: &DecodeGraphs,
        model: &LlamaModel<Self>,
        kv: &mut KvCache<Self>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Option<Result<PickedRows, ModelError>> {
        (picks.len() == chunks.len())
            .then(|| step_pick(model, kv, chunks, picks, graphs.device_draw()))
    }
}

/// One eager step whose logits stay on the device: the greedy id of every `Argmax` row chosen
/// there ([`CudaBackend::argmax_rows`], the host `argmax`'s rule), the `Draw` rows drawn as
/// [`draw_rows`] says, the rows the host samples downloaded, nothing of the `Skip` rows (prompt
/// chunks that do not end their prompt).
fn step_pick(
    model: &LlamaModel<CudaBackend>,
    kv: &mut KvCache<CudaBackend>,
    chunks: &[SeqChunk<'_>],
    picks: &[RowPick],
    device_draw: bool,
) -> Result<PickedRows, ModelError> {
    let b = model.backend();
    let vocab = model.config().vocab_size;
    let rows = chunks.len();
    let logits = model.forward_on_backend(kv, chunks)?; // [rows, vocab] f32
    tracing::trace!(target: "sov::pass", "runner: step enqueued");
    let mut out = PickedRows {
        tokens: vec![None; rows],
        logits: Vec::new(),
    };
    let draws = device_draws(picks, vocab, device_draw);
    if picks.contains(&RowPick::Argmax) || !draws.is_empty() {
        // Greedy ids and device draws land in one buffer, each at its row: one download.
        let mut ids_dev = b.alloc(DType::U32, rows)?; // [rows] u32
        if picks.contains(&RowPick::Argmax) {
            b.argmax_rows(&logits, vocab, rows, &mut ids_dev)?;
        }
        b.enqueue_draws_at_rows(&logits, vocab, &draws, &mut ids_dev)?;
        let mut ids = vec![0u32; rows]; // [rows]
        b.download_u32(&ids_dev, &mut ids)?;
        tracing::trace!(target: "sov::pass", "runner: picks downloaded");
        for ((token, pick), id) in out.tokens.iter_mut().zip(picks).zip(ids) {
            let on_device = match pick {
                RowPick::Argmax => true,
                RowPick::Draw(_) => !draws.is_empty(),
                _ => false,
            };
            *token = on_device.then_some(id);
        }
    }
    if draws.is_empty() {
        draw_on_host(b, &logits, vocab, picks, &mut out.tokens)?;
    }
    let sampled = picks.iter().filter(|p| **p == RowPick::Logits).count();
    if sampled == rows {
        out.logits = vec![0.0; rows * vocab]; // [rows, vocab]
        b.download_f32(&logits, &mut out.logits)?;
    } else if sampled > 0 {
        out.logits = vec![0.0; sampled * vocab]; // [sampled rows, vocab]
        let mut dst = out.logits.chunks_exact_mut(vocab.max(1));
        for (row, _) in picks
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == RowPick::Logits)
        {
            if let Some(dst) = dst.next() {
                b.download_f32_at(&logits, row * vocab, dst)?;
            }
        }
    }
    Ok(out)
}

/// Whether `picks` (at least one) are all answered by ids alone: argmax rows, drawn rows where
/// the device draws them, and with `skips` rows that want no token.
fn picked_on_device(graphs: &DecodeGraphs, vocab: usize, picks: &[RowPick], skips: bool) -> bool {
    let draws_on_device = graphs.device_draw() && vocab <= MAX_DRAW_VOCAB;
    !picks.is_empty()
        && picks.iter().all(|p| match p {
            RowPick::Argmax => true,
            RowPick::Skip => skips,
            RowPick::Draw(_) => draws_on_device,
            RowPick::Logits => false,
        })
}

/// The `Draw` rows of `picks` as the device draws them (`(row, draw)`), or none when `on_device`
/// is off or the vocabulary is too wide for `draw_tokens` (then [`draw_on_host`] draws them).
fn device_draws(picks: &[RowPick], vocab: usize, on_device: bool) -> Vec<(usize, DrawRow)> {
    if !on_device || vocab > MAX_DRAW_VOCAB {
        return Vec::new();
    }
    picks
        .iter()
        .enumerate()
        .filter_map(|(row, pick)| match pick {
            RowPick::Draw(d) => Some((
                row,
                DrawRow {
                    temperature: d.temperature,
                    top_k: d.top_k,
                    top_p: d.top_p,
                    min_p: d.min_p,
                    bits: d.bits,
                },
            )),
            _ => None,
        })
        .collect()
}

/// Sets `tokens[r]` for every `Draw` row `r` of `picks` by downloading row `r` of `logits`
/// (`[rows, vocab]` f32 on the device) and drawing it on the host: the same token as the device
/// draw, at the cost of a vocabulary-wide download a row.
fn draw_on_host(
    b: &CudaBackend,
    logits: &CudaBuffer,
    vocab: usize,
    picks: &[RowPick],
    tokens: &mut [Option<u32>],
) -> Result<(), ModelError> {
    let mut row_logits = vec![0.0f32; vocab]; // [vocab], a drawn row's
    for (row, pick) in picks.iter().enumerate() {
        if let RowPick::Draw(_) = pick {
            b.download_f32_at(logits, row * vocab, &mut row_logits)?;
            tokens[row] = pick.token_on_host(&row_logits);
        }
    }
    Ok(())
}
