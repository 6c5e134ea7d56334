//! Paged attention launches: split-K decode when every sequence brings one new token -- on tensor
//! cores (`decode_attention_mma.cu`) for a bf16 cache with head_dim 64/128/256, else on CUDA cores
//! (`decode_attention.cu`) -- and the tiled causal kernel (`prefill_attention.cu`) otherwise.
//!
//! Split-K planning: one CTA per (split, kv head, sequence). The context is cut into splits of a
//! multiple of 64 tokens: with few sequences, enough of them that about `SOV_DECODE_CTAS_PER_SM`
//! (default 2) CTAs per SM are in flight; with many, one split per sequence unless
//! `SOV_DECODE_SPLIT_TOKENS` caps the split length (a tuning knob; uncapped measured fastest). The
//! split count depends only on the batch size and the longest context, so a captured decode graph
//! stays valid while contexts stay in its range.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::{HeadConfig, KernelId};

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, driver_err};
use super::ops::to_i32;
use super::pdl::arg;
use crate::backend::{BackendError, BatchMeta, DType, HeadShape, check_buffer};

/// Granularity of split lengths (tokens).
const DECODE_TILE: usize = 64;
/// Most splits the decode kernel's merge handles (`MAX_SPLITS` in `decode_attention.cu`).
const MAX_SPLITS: usize = 256;
/// Threads per CTA of both attention kernels.
const THREADS: u32 = 128;

/// How a decode launch cuts the contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SplitPlan {
    pub(super) splits: usize,
    pub(super) split_tokens: usize,
}

/// Split-K plan for `seqs` sequences of up to `max_ctx` tokens, aiming at about `target_ctas`
/// CTAs in flight and splits of at most `max_split_tokens` and, where the context allows, at least
/// `min_split_tokens` (see [`CudaBackend::split_target_ctas`], [`CudaBackend::split_max_tokens`]
/// and [`CudaBackend::split_min_tokens`]).
pub(super) fn plan_splits(
    seqs: usize,
    kv_heads: usize,
    max_ctx: usize,
    target_ctas: usize,
    max_split_tokens: usize,
    min_split_tokens: usize,
) -> SplitPlan {
    let ctas = (seqs * kv_heads).max(1);
    let target = target_ctas.max(1);
    let max_tiles = max_ctx.div_ceil(min_split_tokens.max(DECODE_TILE)).max(1);
    let splits = target
        .div_ceil(ctas)
        .max(max_ctx.div_ceil(max_split_tokens.max(1)))
        .clamp(1, max_tiles.min(MAX_SPLITS));
    let split_tokens = max_ctx.div_ceil(splits).div_ceil(DECODE_TILE).max(1) * DECODE_TILE;
    SplitPlan {
        splits: max_ctx.div_ceil(split_tokens).max(1),
        split_tokens,
    }
}

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn paged_attention_impl(
        &self,
        qkv: &CudaBuffer,
        k_cache: &CudaBuffer,
        v_cache: &CudaBuffer,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        heads: HeadShape,
        block_size: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        const OP: &str = "paged_attention";
        if heads.n_kv_heads == 0 || !heads.n_heads.is_multiple_of(heads.n_kv_heads) {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!("{heads:?}"),
            });
        }
        let kv_dtype = if self.precise {
            DType::F32
        } else {
            DType::BF16
        };
        let cfg = HeadConfig {
            head_dim: heads.head_dim,
            group: heads.n_heads / heads.n_kv_heads,
            kv_f32: self.precise,
        }
        .validate()
        .map_err(|e| BackendError::Unsupported(e.to_string()))?;
        let n = meta.n_tokens;
        check_buffer(OP, "qkv", qkv, DType::F32, n * heads.qkv_width())?;
        check_buffer(OP, "out", out, DType::F32, n * heads.q_width())?;
        check_buffer(
            OP,
            "k_cache",
            k_cache,
            kv_dtype,
            block_size * heads.kv_width(),
        )?;
        check_buffer(OP, "v_cache", v_cache, kv_dtype, k_cache.len)?;
        check_buffer(OP, "ctx_lens", &meta.ctx_lens, DType::U32, meta.n_seqs)?;
        check_buffer(OP, "q_starts", &meta.q_starts, DType::U32, meta.n_seqs + 1)?;
        check_buffer(
            OP,
            "block_tables",
            &meta.block_tables,
            DType::U32,
            meta.n_seqs * meta.max_blocks_per_seq,
        )?;
        if n == 0 || meta.n_seqs == 0 {
            return Ok(());
        }
        if meta.max_q_len == 1 && n == meta.n_seqs {
            self.decode_attention(
                qkv, k_cache, v_cache, meta, out, heads, cfg, block_size, scale,
            )
        } else {
            self.prefill_attention(
                qkv, k_cache, v_cache, meta, out, heads, cfg, block_size, scale,
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn decode_attention(
        &self,
        qkv: &CudaBuffer,
        k_cache: &CudaBuffer,
        v_cache: &CudaBuffer,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        heads: HeadShape,
        cfg: HeadConfig,
        block_size: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        let seqs = meta.n_seqs;
        let plan = plan_splits(
            seqs,
            heads.n_kv_heads,
            meta.max_ctx_len,
            self.split_target_ctas,
            self.split_max_tokens,
            self.split_min_tokens,
        );
        let mma = self.decode_mma && KernelId::DecodeAttentionMma.supports(Some(cfg));
        let (f, shared_mem_bytes) = if mma {
            let f = self.modules.function(
                KernelId::DecodeAttentionMma,
                Some(cfg),
                "paged_decode_attention_mma",
            )?;
            (f, sov_kernels::decode_mma_shared_bytes(cfg.head_dim) as u32)
        } else {
            let f = self.modules.function(
                KernelId::DecodeAttention,
                Some(cfg),
                "paged_decode_attention",
            )?;
            (f, 0)
        };
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| BackendError::Device("scratch lock poisoned".into()))?;
        let rows = seqs * heads.n_kv_heads * plan.splits * cfg.group;
        if scratch
            .part_o
            .as_ref()
            .is_none_or(|b| b.len < rows * cfg.head_dim)
        {
            scratch.part_o =
                Some(self.alloc_zeroed(DType::F32, (rows * cfg.head_dim).next_power_of_two())?);
            scratch.generation += 1;
        }
        if scratch.part_ml.as_ref().is_none_or(|b| b.len < rows * 2) {
            scratch.part_ml = Some(self.alloc_zeroed(DType::F32, (rows * 2).next_power_of_two())?);
            scratch.generation += 1;
        }
        if scratch
            .counters
            .as_ref()
            .is_none_or(|b| b.len < seqs * heads.n_kv_heads)
        {
            scratch.counters =
                Some(self.alloc_zeroed(DType::U32, (seqs * heads.n_kv_heads).next_power_of_two())?);
            scratch.generation += 1;
        }
        let (Some(po), Some(pml), Some(cnt)) =
            (&scratch.part_o, &scratch.part_ml, &scratch.counters)
        else {
            return Err(BackendError::Device("decode scratch missing".into()));
        };
        let (out_stride, q_stride) = (
            to_i32(heads.q_width(), "q width")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let max_blocks = to_i32(meta.max_blocks_per_seq, "max blocks")?;
        let kvh = to_i32(heads.n_kv_heads, "kv heads")?;
        let bs = to_i32(block_size, "block size")?;
        let split_tokens = to_i32(plan.split_tokens, "split tokens")?;
        let max_splits = to_i32(plan.splits, "splits")?;
        let ptrs = [
            out.ptr(),
            qkv.ptr(),
            k_cache.ptr(),
            v_cache.ptr(),
            meta.block_tables.ptr(),
            meta.ctx_lens.ptr(),
            po.ptr(),
            pml.ptr(),
            cnt.ptr(),
        ];
        let launch = LaunchConfig {
            grid_dim: (plan.splits as u32, heads.n_kv_heads as u32, seqs as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes,
        };
        let [o, q, kc, vc, bt, cl, po, pml, cnt] = ptrs;
        let mut params = [
            arg(&o),
            arg(&out_stride),
            arg(&q),
            arg(&q_stride),
            arg(&kc),
            arg(&vc),
            arg(&bt),
            arg(&max_blocks),
            arg(&cl),
            arg(&po),
            arg(&pml),
            arg(&cnt),
            arg(&kvh),
            arg(&bs),
            arg(&split_tokens),
            arg(&max_splits),
            arg(&scale),
        ];
        // SAFETY: the parameters are the decode kernels' list in order; buffers checked by the
        // caller, scratch sized for this plan above; block tables reference blocks inside the
        // cache by the engine's contract; the tensor-core unit's dynamic shared memory limit was
        // raised to `shared_mem_bytes` when it loaded. Both kernels wait for their prerequisites
        // before touching any buffer (super::pdl).
        unsafe { self.launch_overlapping(&f, launch, &mut params) }?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn prefill_attention(
        &self,
        qkv: &CudaBuffer,
        k_cache: &CudaBuffer,
        v_cache: &CudaBuffer,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        heads: HeadShape,
        cfg: HeadConfig,
        block_size: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        let f =
            self.modules
                .function(KernelId::PrefillAttention, Some(cfg), "prefill_attention")?;
        let q_tile = 64 / cfg.group;
        let (out_stride, q_stride) = (
            to_i32(heads.q_width(), "q width")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let max_blocks = to_i32(meta.max_blocks_per_seq, "max blocks")?;
        let kvh = to_i32(heads.n_kv_heads, "kv heads")?;
        let bs = to_i32(block_size, "block size")?;
        let ptrs = [
            out.ptr(),
            qkv.ptr(),
            k_cache.ptr(),
            v_cache.ptr(),
            meta.block_tables.ptr(),
            meta.q_starts.ptr(),
            meta.ctx_lens.ptr(),
        ];
        let launch = LaunchConfig {
            grid_dim: (
                meta.max_q_len.div_ceil(q_tile) as u32,
                heads.n_kv_heads as u32,
                meta.n_seqs as u32,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: sov_kernels::prefill_shared_bytes(cfg.head_dim) as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ptrs[0])
            .arg(&out_stride)
            .arg(&ptrs[1])
            .arg(&q_stride);
        b.arg(&ptrs[2]).arg(&ptrs[3]).arg(&ptrs[4]).arg(&max_blocks);
        b.arg(&ptrs[5]).arg(&ptrs[6]).arg(&kvh).arg(&bs).arg(&scale);
        // SAFETY: as for decode; the dynamic shared memory limit was raised when the unit loaded.
        unsafe { b.launch(launch) }.map_err(driver_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_plans_fill_the_gpu_and_cover_the_context() {
        // One sequence, long context: many splits of whole tiles.
        let p = plan_splits(1, 8, 4096, 4 * 132, usize::MAX, 64);
        assert_eq!(p.split_tokens % DECODE_TILE, 0);
        assert!(p.splits * p.split_tokens >= 4096);
        assert!(p.splits * 8 >= 4 * 132 / 2, "{p:?}");
        // Many sequences: one split, unless splits are capped.
        assert_eq!(plan_splits(256, 8, 1024, 4 * 132, usize::MAX, 64).splits, 1);
        let p = plan_splits(256, 8, 1024, 4 * 132, 512, 64);
        assert_eq!((p.splits, p.split_tokens), (2, 512));
        let p = plan_splits(64, 8, 2000, 4 * 132, 512, 64);
        assert!(
            p.split_tokens <= 512 && p.splits * p.split_tokens >= 2000,
            "{p:?}"
        );
        // A minimum split length caps the splits of short contexts (one split up to it).
        assert_eq!(plan_splits(1, 8, 256, 264, usize::MAX, 256).splits, 1);
        let p = plan_splits(1, 8, 1000, 264, usize::MAX, 256);
        assert!(p.splits == 4 && p.split_tokens >= 250, "{p:?}");
        // Short context never asks for more splits than tiles.
        let p = plan_splits(1, 1, 10, 4 * 132, 512, 64);
        assert_eq!((p.splits, p.split_tokens), (1, 64));
        // Never more splits than the kernel's merge holds.
        assert!(plan_splits(1, 1, 1 << 20, 4000, 64, 64).splits <= MAX_SPLITS);
    }
}
