//! Paged attention launches: split-K decode when every sequence brings one new token -- on tensor
//! cores (`decode_attention_mma.cu`) for a bf16 cache with head_dim 64/128/256, else on CUDA cores
//! (`decode_attention.cu`) -- and the tiled causal kernel otherwise, on tensor cores
//! (`prefill_attention_mma.cu`) for the same shapes, else on CUDA cores (`prefill_attention.cu`);
//! the two prefill kernels take the same arguments and grid.
//!
//! Split-K planning: one CTA per (split, kv head, sequence). The context is cut into splits of a
//! multiple of 64 tokens: with few sequences, enough of them that about
//! [`super::CudaTuning::decode_ctas_per_sm`] (default 2) CTAs per SM are in flight; with many, one
//! split per sequence unless [`super::CudaTuning::decode_max_split_tokens`] caps the split length
//! (uncapped measured fastest). The
//! split count depends only on the batch size and the longest context, so a captured decode graph
//! stays valid while contexts stay in its range. Where one split per sequence leaves at least
//! [`super::CudaTuning::decode_warp_items_per_sm`] (sequence, kv head) items per SM, each item is
//! one warp's instead of one CTA's ([`CudaBackend::warp_items`]).
//!
//! Decode steps of the model come through [`CudaBackend::rope_kv_attention_impl`]: with the
//! tensor-core kernel the RoPE and the KV write of the new token happen inside the attention
//! launch (one kernel fewer per layer), otherwise `rope_kv_write` runs first. The tensor-core
//! kernel has three entry points, for grids of at most one CTA per SM, for wider ones and for
//! warp items, so each gets its own shared-memory carveout ([`super::DecodeCarveout`]).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::{HeadConfig, KernelId, KvElement};

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use super::ops::to_i32;
use super::pdl::arg;
use crate::backend::{
    AttentionShape, BackendError, BatchMeta, DType, HeadShape, KvLayer, NewTokens, RopeTables,
    check_buffer,
};

/// Granularity of split lengths (tokens).
const DECODE_TILE: usize = 64;
/// Most splits the decode kernel's merge handles (`MAX_SPLITS` in `decode_attention.cu`).
const MAX_SPLITS: usize = 256;
/// Threads per CTA of both attention kernels.
const THREADS: u32 = 128;
/// Warps per CTA (`NWARPS` in the decode kernels).
const WARPS: usize = THREADS as usize / 32;

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

/// The rows of a decode-attention launch at raw device addresses: a step's sequences, or
/// (deterministic prefill, `attention_rows.rs`) a prefill's query tokens.
#[derive(Clone, Copy)]
pub(super) struct DecodeRows {
    /// Queries, `[rows, qkv width]` f32 (the qkv activation).
    pub(super) q: u64,
    /// Output, `[rows, q width]` f32, or bf16 when `out_bf16`.
    pub(super) out: u64,
    /// Whether `out` is bf16 (the f32 results rounded as `cast_f32_bf16` rounds).
    pub(super) out_bf16: bool,
    /// `[rows, max_blocks]` u32.
    pub(super) block_tables: u64,
    /// `[rows]` u32.
    pub(super) ctx_lens: u64,
    pub(super) rows: usize,
    pub(super) max_blocks: usize,
    /// Longest context among the rows.
    pub(super) max_ctx: usize,
    /// Launch with programmatic dependent launch (the tables were uploaded before the step).
    pub(super) overlap: bool,
}

/// The fused RoPE + KV write of a decode launch (see `decode_attention_mma.cu`): the step's
/// positions and slots (`[batch]` u32) and the model's rotation tables (`[max_pos, D/2]` f32).
#[derive(Clone, Copy)]
pub(super) struct FusedRope<'a> {
    tokens: NewTokens<'a, CudaBackend>,
    tables: RopeTables<'a, CudaBackend>,
}

impl CudaBackend {
    /// `rope_kv_write` then `paged_attention`; fused into the tensor-core decode kernel for decode
    /// steps where it applies (head_dim 64/128/256; batch-1 step 4.11 ms fused vs 4.13-4.14
    /// unfused on the H200) and either of at most
    /// [`super::CudaTuning::decode_fused_rope_max_rows`] rows or launched as warp items
    /// ([`super::CudaTuning::decode_warp_fused_rope`]).
    pub(super) fn rope_kv_attention_impl(
        &self,
        qkv: &mut CudaBuffer,
        tables: RopeTables<'_, CudaBackend>,
        kv: KvLayer<&mut CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "rope_kv_attention";
        let (n, heads) = (meta.n_tokens, shape.heads);
        let cfg = self.attention_config(heads)?;
        let decode_on_tensor_cores = self.tuning.decode_tensor_cores
            && KernelId::DecodeAttentionMma.supports(Some(cfg))
            && n > 0
            && meta.max_q_len == 1
            && n == meta.n_seqs;
        let fused = decode_on_tensor_cores
            && (n <= self.tuning.decode_fused_rope_max_rows
                || self.tuning.decode_warp_fused_rope
                    && self.warp_items(
                        n,
                        heads.n_kv_heads,
                        self.decode_plan(n, heads.n_kv_heads, meta.max_ctx_len),
                    ));
        if !fused {
            return crate::backend::rope_kv_then_attention(self, qkv, tables, kv, meta, out, shape);
        }
        let tokens = meta.new_tokens();
        super::ops::check_rope_args(OP, qkv, tokens.positions, tables, n, heads)?;
        self.check_kv_write_args(OP, tokens.slots, kv.as_shared(), n, heads)?;
        self.check_attention_args(OP, qkv, kv.as_shared(), meta, out, shape)?;
        let rope = FusedRope { tokens, tables };
        self.decode_attention(qkv, kv.as_shared(), meta, out, shape, Some(rope))
    }

    /// The kernel configuration of `heads` in this backend's mode.
    fn attention_config(&self, heads: HeadShape) -> Result<HeadConfig, BackendError> {
        if heads.n_kv_heads == 0 || !heads.n_heads.is_multiple_of(heads.n_kv_heads) {
            return Err(BackendError::Shape {
                op: "paged_attention",
                detail: format!("{heads:?}"),
            });
        }
        let cfg = HeadConfig {
            head_dim: heads.head_dim,
            group: heads.n_heads / heads.n_kv_heads,
            kv: self.kv_element(),
        }
        .validate()
        .map_err(|e| BackendError::Unsupported(e.to_string()))?;
        if cfg.kv == KvElement::E4m3 && !KernelId::DecodeAttentionMma.supports(Some(cfg)) {
            return Err(BackendError::Unsupported(format!(
                "an FP8 KV cache is read by the tensor-core attention only, which needs head_dim \
                 64, 128 or 256 (this model's is {})",
                heads.head_dim
            )));
        }
        Ok(cfg)
    }

    pub(super) fn paged_attention_impl(
        &self,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        self.attention_config(shape.heads)?;
        self.check_attention_args("paged_attention", qkv, kv, meta, out, shape)?;
        let n = meta.n_tokens;
        if n == 0 || meta.n_seqs == 0 {
            return Ok(());
        }
        if meta.max_q_len == 1 && n == meta.n_seqs {
            self.decode_attention(qkv, kv, meta, out, shape, None)
        } else if self.tuning.deterministic {
            self.prefill_as_decode_rows(qkv, kv, meta, out, shape)
        } else {
            self.prefill_attention(qkv, kv, meta, out, shape)
        }
    }

    /// Buffer checks of an attention call.
    fn check_attention_args(
        &self,
        op: &'static str,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        let AttentionShape {
            heads, block_size, ..
        } = shape;
        let kv_dtype = self.kv_dtype_impl();
        // The output in f32, or in bf16 for an output projection that multiplies in bf16
        // (`matmul_input_dtype`; never in precise mode, whose products keep f32 inputs).
        let out_dtype = if out.dtype == DType::BF16 && !self.precise {
            DType::BF16
        } else {
            DType::F32
        };
        let n = meta.n_tokens;
        check_buffer(op, "qkv", qkv, DType::F32, n * heads.qkv_width())?;
        check_buffer(op, "out", out, out_dtype, n * heads.q_width())?;
        let multiple = crate::backend::Backend::kv_block_multiple(self);
        if !block_size.is_multiple_of(multiple) {
            return Err(BackendError::Unsupported(format!(
                "{op}: this KV cache needs a block size that is a multiple of {multiple}, not {block_size}"
            )));
        }
        let row = self.kv_row_elems_impl(heads);
        check_buffer(op, "k_cache", kv.k, kv_dtype, block_size * row)?;
        check_buffer(op, "v_cache", kv.v, kv_dtype, kv.k.len)?;
        check_buffer(op, "ctx_lens", &meta.ctx_lens, DType::U32, meta.n_seqs)?;
        check_buffer(op, "q_starts", &meta.q_starts, DType::U32, meta.n_seqs + 1)?;
        check_buffer(
            op,
            "block_tables",
            &meta.block_tables,
            DType::U32,
            meta.n_seqs * meta.max_blocks_per_seq,
        )?;
        Ok(())
    }

    /// How a decode launch of `seqs` sequences of up to `max_ctx` tokens is split: planned for
    /// the GPU's occupancy ([`plan_splits`]), or in deterministic mode splits of exactly
    /// [`super::CudaTuning::deterministic_split_tokens`], so a row's splits -- and with them its
    /// rounding -- depend on its own context length only.
    pub(super) fn decode_plan(&self, seqs: usize, kv_heads: usize, max_ctx: usize) -> SplitPlan {
        if self.tuning.deterministic {
            let split_tokens = self.tuning.deterministic_split_tokens;
            return SplitPlan {
                splits: max_ctx.div_ceil(split_tokens).max(1),
                split_tokens,
            };
        }
        plan_splits(
            seqs,
            kv_heads,
            max_ctx,
            self.split_target_ctas,
            self.split_max_tokens,
            self.split_min_tokens,
        )
    }

    /// Whether a tensor-core decode launch of `seqs` sequences under `plan` (RoPE not fused)
    /// gives each (sequence, kv head) a warp of its own (`paged_decode_attention_mma_warps`):
    /// outside deterministic mode, with one split per sequence, and at least
    /// [`super::CudaTuning::decode_warp_items_per_sm`] items per SM.
    pub(super) fn warp_items(&self, seqs: usize, kv_heads: usize, plan: SplitPlan) -> bool {
        let per_sm = self.tuning.decode_warp_items_per_sm;
        !self.tuning.deterministic
            && plan.splits == 1
            && per_sm > 0
            && seqs * kv_heads >= per_sm * self.sm_count
    }

    /// The split-K decode launch (one new token per sequence), with the fused RoPE + KV write
    /// when `rope` is given (tensor-core kernel only).
    fn decode_attention(
        &self,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
        rope: Option<FusedRope<'_>>,
    ) -> Result<(), BackendError> {
        let rows = DecodeRows {
            q: qkv.ptr(),
            out: out.ptr(),
            out_bf16: out.dtype == DType::BF16,
            block_tables: meta.block_tables.ptr(),
            ctx_lens: meta.ctx_lens.ptr(),
            rows: meta.n_seqs,
            max_blocks: meta.max_blocks_per_seq,
            max_ctx: meta.max_ctx_len,
            overlap: true,
        };
        // SAFETY: the caller checked the buffers against `meta` (check_attention_args).
        unsafe { self.decode_rows(kv, rows, shape, rope) }
    }

    /// The split-K decode launch over `rows` (see [`DecodeRows`]).
    ///
    /// # Safety
    /// `rows` must describe live device buffers: q `[rows, qkv width]` f32, out `[rows, q width]`
    /// f32, block tables `[rows, max_blocks]` and context lengths `[rows]` u32 (each at most
    /// `max_ctx`) naming blocks inside `kv`. With `overlap`, the block tables and context lengths
    /// must not be written by the kernel before this launch.
    pub(super) unsafe fn decode_rows(
        &self,
        kv: KvLayer<&CudaBuffer>,
        rows: DecodeRows,
        shape: AttentionShape,
        rope: Option<FusedRope<'_>>,
    ) -> Result<(), BackendError> {
        let AttentionShape {
            heads,
            block_size,
            scale,
        } = shape;
        let cfg = self.attention_config(heads)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let seqs = rows.rows;
        let plan = self.decode_plan(seqs, heads.n_kv_heads, rows.max_ctx);
        if plan.splits > MAX_SPLITS {
            return Err(BackendError::Unsupported(format!(
                "a context of {} tokens needs {} splits of {} tokens (at most {MAX_SPLITS})",
                rows.max_ctx, plan.splits, plan.split_tokens
            )));
        }
        let mma =
            self.tuning.decode_tensor_cores && KernelId::DecodeAttentionMma.supports(Some(cfg));
        if rope.is_some() && !mma {
            return Err(BackendError::Unsupported(
                "the fused RoPE needs the tensor-core decode kernel".into(),
            ));
        }
        let ctas = plan.splits * heads.n_kv_heads * seqs;
        let warp_items = mma
            && (rope.is_none() || self.tuning.decode_warp_fused_rope)
            && self.warp_items(seqs, heads.n_kv_heads, plan);
        let (f, shared_mem_bytes) = if mma {
            // Three entry points of one kernel, each with its own shared-memory carveout
            // (`DecodeCarveout`).
            let name = if warp_items {
                "paged_decode_attention_mma_warps"
            } else if ctas <= self.sm_count {
                "paged_decode_attention_mma_few"
            } else {
                "paged_decode_attention_mma"
            };
            let f = self
                .modules
                .function(KernelId::DecodeAttentionMma, Some(cfg), name)?;
            let stages = self.tuning.kernels.decode_stages;
            (
                f,
                sov_kernels::decode_mma_shared_bytes(cfg.head_dim, stages, cfg.kv) as u32,
            )
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
        self.grow_decode_scratch(&mut scratch, seqs, heads, plan.splits)?;
        let (Some(po), Some(pml), Some(cnt)) =
            (&scratch.part_o, &scratch.part_ml, &scratch.counters)
        else {
            return Err(BackendError::Device("decode scratch missing".into()));
        };
        let (out_stride, q_stride) = (
            to_i32(heads.q_width(), "q width")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let out_bf16 = i32::from(rows.out_bf16);
        let max_blocks = to_i32(rows.max_blocks, "max blocks")?;
        let kvh = to_i32(heads.n_kv_heads, "kv heads")?;
        let bs = to_i32(block_size, "block size")?;
        let split_tokens = to_i32(plan.split_tokens, "split tokens")?;
        let max_splits = to_i32(plan.splits, "splits")?;
        let ptrs = [
            rows.out,
            rows.q,
            k_cache.ptr(),
            v_cache.ptr(),
            rows.block_tables,
            rows.ctx_lens,
            po.ptr(),
            pml.ptr(),
            cnt.ptr(),
        ];
        // Warp items: a CTA is WARPS kv heads of one sequence (`decode_attention_warp_item`).
        let grid_dim = if warp_items {
            (heads.n_kv_heads.div_ceil(WARPS) as u32, 1, seqs as u32)
        } else {
            (plan.splits as u32, heads.n_kv_heads as u32, seqs as u32)
        };
        let launch = LaunchConfig {
            grid_dim,
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes,
        };
        let [o, q, kc, vc, bt, cl, po, pml, cnt] = ptrs;
        // The fused RoPE's buffers, or null pointers (the tensor-core kernel's last four
        // parameters; the CUDA-core kernel has none of them).
        let [pos, slots, cos, sin] = match rope {
            Some(r) => [
                r.tokens.positions.ptr(),
                r.tokens.slots.ptr(),
                r.tables.cos.ptr(),
                r.tables.sin.ptr(),
            ],
            None => [0; 4],
        };
        let mut params = [
            arg(&o),
            arg(&out_stride),
            arg(&out_bf16),
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
            arg(&pos),
            arg(&slots),
            arg(&cos),
            arg(&sin),
        ];
        let params = if mma {
            &mut params[..]
        } else {
            &mut params[..18]
        };
        // SAFETY: the parameters are the chosen kernel's list in order (18 for the CUDA-core
        // kernel, 22 for the tensor-core one), `out` of the dtype `out_bf16` names; buffers checked by the caller (with the fused RoPE
        // also positions, slots and tables, whose rows the model sizes to its max position),
        // scratch sized for this plan above; block tables and slots reference blocks inside the
        // cache by the engine's contract; the tensor-core unit's dynamic shared memory limit was
        // raised to `shared_mem_bytes` when it loaded. Before their prerequisites have finished
        // the kernels read only what no kernel of the step writes (decode_attention_mma.cu); a
        // launch whose tables were just written (`overlap` false) waits for the kernel before it.
        if rows.overlap {
            // SAFETY: as above; the caller promised tables not written by the kernel before.
            unsafe { self.launch_overlapping(&f, launch, params) }?;
        } else {
            // SAFETY: as above; an ordinary launch, so the tables may have just been written.
            unsafe { self.launch_serial(&f, launch, params) }?;
        }
        Ok(())
    }

    /// The tiled causal launch (prefill chunks, or decode mixed with them).
    fn prefill_attention(
        &self,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<CudaBackend>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        let AttentionShape {
            heads,
            block_size,
            scale,
        } = shape;
        let cfg = self.attention_config(heads)?;
        let (k_cache, v_cache) = (kv.k, kv.v);
        let mma =
            self.tuning.prefill_tensor_cores && KernelId::PrefillAttentionMma.supports(Some(cfg));
        let (f, shared_mem_bytes) = if mma {
            let f = self.modules.function(
                KernelId::PrefillAttentionMma,
                Some(cfg),
                "prefill_attention_mma",
            )?;
            (
                f,
                sov_kernels::prefill_mma_shared_bytes(cfg.head_dim, cfg.kv),
            )
        } else {
            let f = self.modules.function(
                KernelId::PrefillAttention,
                Some(cfg),
                "prefill_attention",
            )?;
            (f, sov_kernels::prefill_shared_bytes(cfg.head_dim))
        };
        let q_tile = 64 / cfg.group;
        let (out_stride, q_stride) = (
            to_i32(heads.q_width(), "q width")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let max_blocks = to_i32(meta.max_blocks_per_seq, "max blocks")?;
        let kvh = to_i32(heads.n_kv_heads, "kv heads")?;
        let bs = to_i32(block_size, "block size")?;
        let out_bf16 = i32::from(out.dtype == DType::BF16);
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
            shared_mem_bytes: shared_mem_bytes as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ptrs[0])
            .arg(&out_stride)
            .arg(&out_bf16)
            .arg(&ptrs[1])
            .arg(&q_stride);
        b.arg(&ptrs[2]).arg(&ptrs[3]).arg(&ptrs[4]).arg(&max_blocks);
        b.arg(&ptrs[5]).arg(&ptrs[6]).arg(&kvh).arg(&bs).arg(&scale);
        // SAFETY: both kernels take these arguments in this order (the cache as bf16 or e4m3 rows
        // for the tensor-core one, as compiled for `cfg.kv`; `validate` keeps an e4m3 cache off
        // the CUDA-core one); buffers checked by the caller;
        // the dynamic shared memory limit was raised to this size when the unit loaded.
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
