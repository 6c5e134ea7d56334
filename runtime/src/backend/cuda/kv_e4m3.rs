//! The e4m3 KV cache (`sov --kv-dtype fp8`, [`super::CudaTuning::kv_e4m3`]): which element the
//! attention units are compiled for, the row width, and the write of new K/V rows.
//!
//! Design: each slot of one layer's K (or V) cache owns `KVH * D` e4m3 codes and one f32 scale
//! per head, padded to 16 bytes (`sov_kernels::kv_e4m3_row_bytes`), laid out in groups of 16 slots
//! head-major (`[KVH][16][D]` codes, then `[KVH][16]` scales: `common.cuh`), so a head's codes of
//! 16 consecutive tokens are one contiguous run the decode kernel reads whole. A block is whole
//! groups (block sizes must be multiples of 16, `Backend::kv_block_multiple`), so it is still one
//! contiguous range of bytes and every path that moves blocks (swap, checkpoints, copy-on-write)
//! moves them as it moves bf16 blocks; a checkpoint's partial block keeps the byte ranges of its
//! first slots (`sov_kernels::kv_e4m3_tail_ranges`). Each head of each token gets its own scale, `amax / 448`,
//! when it is written (`rope_kv_write_e4m3` in `rope_kv.cu`; the fused write of the tensor-core
//! decode kernel applies the same arithmetic, so both store the same bytes): no calibration, and
//! an outlier in one token costs no other token precision. Only the tensor-core attention units
//! read it (`-DKV_FP8`, f16 operands), so it needs head_dim 64, 128 or 256 and compute capability
//! 8.9 (the e4m3 conversions); precise mode keeps its f32 cache.

use sov_kernels::{KernelId, KvElement};

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::ops::to_i32;
use super::pdl::arg;
use crate::backend::{BackendError, DType, HeadShape, KvLayer, RopeTables};

/// Threads a CTA of `rope_kv_write_e4m3`: 8 warps, one (token, head) each per pass.
const WRITE_THREADS: u32 = 256;
/// Most CTAs a write launches (the kernel strides over the rest).
const WRITE_MAX_CTAS: usize = 4096;

impl CudaBackend {
    /// What this backend's KV cache holds.
    pub(super) fn kv_element(&self) -> KvElement {
        if self.precise {
            KvElement::F32
        } else if self.tuning.kv_e4m3 {
            KvElement::E4m3
        } else {
            KvElement::Bf16
        }
    }

    /// The dtype of this backend's KV cache buffers (an e4m3 cache's slots are bytes: codes and
    /// scales).
    pub(super) fn kv_dtype_impl(&self) -> DType {
        match self.kv_element() {
            KvElement::F32 => DType::F32,
            KvElement::Bf16 => DType::BF16,
            KvElement::E4m3 => DType::F8E4M3,
        }
    }

    /// Elements of one token's K (or V) row in one layer: `KVH * D`, or an e4m3 row's bytes.
    pub(super) fn kv_row_elems_impl(&self, heads: HeadShape) -> usize {
        match self.kv_element() {
            KvElement::E4m3 => sov_kernels::kv_e4m3_row_bytes(heads.n_kv_heads, heads.head_dim),
            _ => heads.kv_width(),
        }
    }

    /// Writes the k and v heads of `n` tokens of `qkv` (`[n, qkv width]` f32) into an e4m3 cache
    /// at `slots` (`[n]` u32, `u32::MAX` skips a token), each head with its own scale. With
    /// `rope` (positions `[n]` u32 and the tables) the q and k heads of `qkv` are rotated in place
    /// first, as `rope_kv_write` rotates them. The caller checked the buffers.
    pub(super) fn write_kv_e4m3(
        &self,
        qkv: &CudaBuffer,
        slots: &CudaBuffer,
        rope: Option<(&CudaBuffer, RopeTables<'_, CudaBackend>)>,
        kv: KvLayer<&mut CudaBuffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        if heads.head_dim > 256 || !heads.head_dim.is_multiple_of(16) {
            return Err(BackendError::Unsupported(format!(
                "an FP8 KV cache needs head_dim a multiple of 16 up to 256, not {}",
                heads.head_dim
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let f = self
            .modules
            .function(KernelId::RopeKv, None, "rope_kv_write_e4m3")?;
        let visited = if rope.is_some() {
            heads.n_heads + 2 * heads.n_kv_heads
        } else {
            2 * heads.n_kv_heads
        };
        let warps = n * visited;
        let ctas = warps
            .div_ceil(WRITE_THREADS as usize / 32)
            .clamp(1, WRITE_MAX_CTAS);
        let (ni, hi, kvi, di, si) = (
            to_i32(n, "n")?,
            to_i32(heads.n_heads, "heads")?,
            to_i32(heads.n_kv_heads, "kv heads")?,
            to_i32(heads.head_dim, "head_dim")?,
            to_i32(heads.qkv_width(), "qkv width")?,
        );
        let (p, c, s) = match rope {
            Some((positions, tables)) => (positions.ptr(), tables.cos.ptr(), tables.sin.ptr()),
            None => (0, 0, 0),
        };
        let (q, kc, vc, sl) = (qkv.ptr(), kv.k.ptr(), kv.v.ptr(), slots.ptr());
        let mut params = [
            arg(&q),
            arg(&kc),
            arg(&vc),
            arg(&p),
            arg(&c),
            arg(&s),
            arg(&sl),
            arg(&ni),
            arg(&hi),
            arg(&kvi),
            arg(&di),
            arg(&si),
        ];
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (ctas as u32, 1, 1),
            block_dim: (WRITE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the parameters are `rope_kv_write_e4m3`'s list in order; the caller checked
        // qkv, the slots and the caches (rows of `kv_e4m3_row_bytes`), and with `rope` the
        // positions and tables (whose rows the model sizes to its max position); slots are
        // allocated by the engine inside the cache; null tables skip the rotation and the q
        // heads. The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }?;
        Ok(())
    }
}
