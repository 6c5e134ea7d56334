//! Eager passes launched ahead on CUDA: a pass (a prefill pass in the engine's use) is enqueued
//! with its device-side picks and the download of its ids, and the host returns at once; the ids
//! are read when the engine waits for the pass, by then usually behind the next pass already
//! enqueued (`engine::prefill_ahead`).
//!
//! Design: the same work as the runner's eager `step_pick` (the model's forward pass, greedy ids
//! by `argmax_rows`, drawn rows by `enqueue_draws_at_rows`, one id buffer), but the ids come down
//! with [`CudaBackend::download_u32_staged`] into page-locked rows and an event, never with a
//! synchronous download that would also wait for the pass enqueued after. Two sets of rows are
//! used in turn, so at most two passes are in flight; a set is reused only after its pass was
//! waited for. The pass's buffers (activations, logits, ids) are freed in stream order when the
//! launch returns, so the next pass's allocations take the same memory after this pass ran.

use std::collections::VecDeque;

use crate::backend::cuda::{CudaBackend, DrawRow, PinnedRows};
use crate::backend::{Backend, BackendError, DType};
use crate::engine::forward::{PickedRows, RowPick};
use crate::model::batch::SeqChunk;
use crate::model::{KvCache, LlamaModel, ModelError};

/// Passes in flight at most: one computing, one enqueued behind it.
const MAX_IN_FLIGHT: usize = 2;

/// The passes launched and not yet waited for, and the page-locked rows their ids come down to.
#[derive(Default)]
pub struct PassesAhead {
    /// Page-locked rows for the picked ids, `MAX_IN_FLIGHT` sets used in turn (made at the
    /// first launch; each grows to the widest pass it served).
    io: Vec<PinnedRows>,
    /// Passes launched and not yet waited for, oldest first.
    in_flight: VecDeque<InFlightPass>,
    /// Passes launched so far (picks the set of `io`).
    launches: usize,
}

/// A pass launched and not yet waited for.
struct InFlightPass {
    /// Its set of `PassesAhead::io`.
    set: usize,
    /// `[rows]` whether each row's id is the device's pick (else the row wants no token).
    picked: Vec<bool>,
}

impl PassesAhead {
    /// Enqueues the pass over `chunks` with its picks (`picks`: `Argmax`, `Skip`, or `Draw`
    /// rows drawn on the device as `draws` says) and the download of its ids; returns without
    /// waiting. A launch that fails leaves nothing more in flight.
    pub fn launch(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        kv: &mut KvCache<CudaBackend>,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        draws: &[(usize, DrawRow)],
    ) -> Result<(), ModelError> {
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            return Err(ModelError::InvalidBatch(format!(
                "{MAX_IN_FLIGHT} passes already in flight"
            )));
        }
        let drawn = |row: usize| draws.iter().any(|d| d.0 == row);
        let picked: Vec<bool> = (picks.iter().enumerate()) // [rows]
            .map(|(row, pick)| match pick {
                RowPick::Argmax => true,
                RowPick::Draw(_) => drawn(row),
                RowPick::Skip | RowPick::Logits => false,
            })
            .collect();
        if picks.len() != chunks.len()
            || picks
                .iter()
                .zip(&picked)
                .any(|(p, &on_device)| *p != RowPick::Skip && !on_device)
        {
            return Err(ModelError::InvalidBatch(
                "a pass launched ahead must pick every token on the device".into(),
            ));
        }
        let b = model.backend();
        let rows = chunks.len();
        let vocab = model.config().vocab_size;
        while self.io.len() < MAX_IN_FLIGHT {
            self.io.push(b.pinned_rows(rows, false)?);
        }
        let set = self.launches % MAX_IN_FLIGHT;
        let logits = model.forward_on_backend(kv, chunks)?; // [rows, vocab] f32
        tracing::trace!(target: "sov::pass", "runner: pass enqueued");
        let mut ids = b.alloc(DType::U32, rows)?; // [rows] u32
        if picks.contains(&RowPick::Argmax) {
            b.argmax_rows(&logits, vocab, rows, &mut ids)?;
        }
        b.enqueue_draws_at_rows(&logits, vocab, draws, &mut ids)?;
        b.download_u32_staged(&ids, rows, &mut self.io[set])?;
        self.launches += 1;
        self.in_flight.push_back(InFlightPass { set, picked });
        Ok(())
    }

    /// The picks of the oldest pass launched and not yet waited for, once the device has them:
    /// a token for every row picked on the device, none for the others.
    pub fn wait(&mut self, backend: &CudaBackend) -> Result<PickedRows, ModelError> {
        let Some(pass) = self.in_flight.pop_front() else {
            return Err(BackendError::Device("no pass in flight".into()).into());
        };
        let Some(io) = self.io.get(pass.set) else {
            return Err(BackendError::Device("pass transfer rows missing".into()).into());
        };
        let ids = backend.staged_u32(io)?; // [rows]
        if ids.len() != pass.picked.len() {
            return Err(BackendError::Device(format!(
                "{} ids came back for a pass of {} rows",
                ids.len(),
                pass.picked.len()
            ))
            .into());
        }
        Ok(PickedRows {
            tokens: (pass.picked.iter().zip(ids))
                .map(|(&on_device, &id)| on_device.then_some(id))
                .collect(),
            logits: Vec::new(),
        })
    }
}
