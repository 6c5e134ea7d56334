//! Deterministic prefill attention: every query token of a prefill (or of a step mixing prefill
//! and decode) is attended by the split-K decode kernel as if it were a decode step.
//!
//! Design (the deterministic mode of `kernels/docs/deterministic.md`): the tiled prefill kernel and
//! the decode kernel reduce over the context in different orders, so a KV cache rebuilt by a
//! prefill (a recompute resume, a replay) gives attention outputs -- and then K/V of later layers
//! -- that differ in their last bits from those the decode steps produced. Here a prefill's token
//! `t` of sequence `s` becomes one row of the decode launch, with `s`'s block table and a context
//! of `t`'s position + 1: causal attention, in exactly the decode kernel's split and merge order
//! (splits of a fixed token count in deterministic mode). `expand_decode_rows` (elementwise.cu)
//! writes the per-row tables; rows go in launches of at most [`ROW_SCRATCH_BYTES`] of split
//! partials. It re-reads each sequence's prefix once per query token (mostly from L2), so long
//! prefills cost more than with the tiled kernel: the price of equality with decode.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::attention::DecodeRows;
use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use super::ops::to_i32;
use crate::backend::{AttentionShape, BackendError, BatchMeta, DType, KvLayer};

/// Most bytes of split partials one launch of rows may need.
const ROW_SCRATCH_BYTES: usize = 64 << 20;

impl CudaBackend {
    /// Causal attention of `meta`'s query tokens through the decode kernel, one row per token.
    /// The caller checked the buffers (`check_attention_args`).
    pub(super) fn prefill_as_decode_rows(
        &self,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        let heads = shape.heads;
        let n = meta.n_tokens;
        let max_blocks = meta.max_blocks_per_seq.max(1);
        let plan = self.decode_plan(n, heads.n_kv_heads, meta.max_ctx_len);
        let per_row = heads.n_heads * heads.head_dim * plan.splits * 4;
        let chunk = (ROW_SCRATCH_BYTES / per_row.max(1)).clamp(1, n);
        let (tables, ctx) = self.row_tables(chunk, max_blocks)?;
        let f = self
            .modules
            .function(KernelId::Elementwise, None, "expand_decode_rows")?;
        let n_seqs = to_i32(meta.n_seqs, "sequences")?;
        let mb = to_i32(max_blocks, "max blocks")?;
        let (bt, qs, cl) = (
            meta.block_tables.ptr(),
            meta.q_starts.ptr(),
            meta.ctx_lens.ptr(),
        );
        for row0 in (0..n).step_by(chunk) {
            let rows = chunk.min(n - row0);
            let r0 = to_i32(row0, "row")?;
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(&tables).arg(&ctx).arg(&bt).arg(&qs).arg(&cl);
            b.arg(&n_seqs).arg(&mb).arg(&r0);
            // SAFETY: row_tables/row_ctx hold >= chunk rows of max_blocks / 1 u32; the meta
            // buffers were checked against n_seqs and max_blocks; row0 + rows <= n_tokens, the
            // last q_starts entry, so every row finds its sequence.
            unsafe { b.launch(cfg) }.map_err(driver_err)?;
            let rows = DecodeRows {
                q: qkv.ptr() + (row0 * heads.qkv_width() * 4) as u64,
                out: out.ptr_at(row0 * heads.q_width()),
                out_bf16: out.dtype == DType::BF16,
                block_tables: tables,
                ctx_lens: ctx,
                rows,
                max_blocks,
                max_ctx: meta.max_ctx_len,
                overlap: false,
            };
            // SAFETY: q and out rows row0.. lie inside the checked qkv and out buffers; the row
            // tables were written just before (hence no overlap) from the sequence's own, and each
            // row's context is at most its sequence's, at most max_ctx_len.
            unsafe { self.decode_rows(kv, rows, shape, None) }?;
        }
        Ok(())
    }

    /// Device addresses of the per-row block tables (`rows * max_blocks` u32) and context lengths
    /// (`rows` u32), grown as needed. Stream order keeps a later launch from overwriting them
    /// before the attention that reads them has run.
    fn row_tables(&self, rows: usize, max_blocks: usize) -> Result<(u64, u64), BackendError> {
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        if scratch
            .row_tables
            .as_ref()
            .is_none_or(|b| b.len < rows * max_blocks)
        {
            let len = (rows * max_blocks).next_power_of_two();
            scratch.row_tables = Some(self.alloc_zeroed(DType::U32, len)?);
        }
        if scratch.row_ctx.as_ref().is_none_or(|b| b.len < rows) {
            scratch.row_ctx = Some(self.alloc_zeroed(DType::U32, rows.next_power_of_two())?);
        }
        match (&scratch.row_tables, &scratch.row_ctx) {
            (Some(t), Some(c)) => Ok((t.ptr(), c.ptr())),
            _ => Err(BackendError::Device("row table scratch missing".into())),
        }
    }
}
