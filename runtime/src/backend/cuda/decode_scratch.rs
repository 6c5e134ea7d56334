//! Scratch of the split-K decode attention: the partial outputs, (max, sum) pairs and arrival
//! counters of `decode_merge.cuh`, grown on demand and reserved up front for an engine's largest
//! step ([`crate::backend::Backend::reserve_scratch`]), since a reallocation drops the captured
//! decode graphs (their generation changes).

use super::device::{CudaBackend, Scratch};
use crate::backend::{BackendError, DType, HeadShape};

impl CudaBackend {
    /// Grows the decode partials and arrival counters for a launch of `seqs` sequences of
    /// `heads` in `splits` splits, bumping the scratch generation when one reallocates.
    pub(super) fn grow_decode_scratch(
        &self,
        scratch: &mut Scratch,
        seqs: usize,
        heads: HeadShape,
        splits: usize,
    ) -> Result<(), BackendError> {
        let group = heads.n_heads / heads.n_kv_heads.max(1);
        let rows = seqs * heads.n_kv_heads * splits * group;
        let d = heads.head_dim;
        if scratch.part_o.as_ref().is_none_or(|b| b.len < rows * d) {
            scratch.part_o = Some(self.alloc_zeroed(DType::F32, (rows * d).next_power_of_two())?);
            scratch.generation += 1;
        }
        if scratch.part_ml.as_ref().is_none_or(|b| b.len < rows * 2) {
            scratch.part_ml = Some(self.alloc_zeroed(DType::F32, (rows * 2).next_power_of_two())?);
            scratch.generation += 1;
        }
        let seq_heads = seqs * heads.n_kv_heads;
        if scratch.counters.as_ref().is_none_or(|b| b.len < seq_heads) {
            scratch.counters = Some(self.alloc_zeroed(DType::U32, seq_heads.next_power_of_two())?);
            scratch.generation += 1;
        }
        Ok(())
    }

    /// Sizes the decode scratch for any launch of up to `max_seqs` sequences of up to
    /// `max_context` tokens (the largest split plan among them).
    pub(super) fn reserve_decode_scratch(
        &self,
        max_seqs: usize,
        max_context: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        if heads.n_kv_heads == 0 || max_seqs == 0 {
            return Ok(());
        }
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        // The plan's splits shrink as sequences grow in number, so the largest rows count can
        // come from any batch size up to the maximum. Decode graphs plan for the context rounded
        // up to a power of two.
        let ctx_bucket = max_context.max(1).next_power_of_two();
        let (seqs, splits) = (1..=max_seqs)
            .map(|s| {
                let plan = self.decode_plan(s, heads.n_kv_heads, ctx_bucket);
                (s, plan.splits)
            })
            .max_by_key(|&(s, splits)| s * splits)
            .unwrap_or((1, 1));
        self.grow_decode_scratch(&mut scratch, seqs, heads, splits)?;
        // And the most sequences, for the counters.
        self.grow_decode_scratch(&mut scratch, max_seqs, heads, 1)
    }
}
