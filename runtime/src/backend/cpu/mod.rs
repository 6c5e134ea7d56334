//! The CPU backend: host-memory buffers, one persistent worker pool ([`pool`]), SIMD kernels
//! chosen at run time with a portable fallback.
//!
//! Design: activations and the KV cache are f32; weights keep their source dtype (f32 stays f32
//! for exact parity with references, f16/bf16 stay 16-bit and GGUF blocks stay quantized,
//! [`qdot`], because decode is bound by memory bandwidth). Every op checks its buffers' dtypes and lengths against the shapes it is given and
//! returns [`BackendError::Shape`] on a mismatch, then runs a slice kernel from [`ops`],
//! [`matmul`] or [`attention`].

pub mod attend;
pub mod attention;
pub mod buffer;
pub mod dense_dot;
pub mod dot;
#[cfg(target_arch = "x86_64")]
mod lanes_x86;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod qdot;
#[cfg(target_arch = "aarch64")]
mod qdot_neon;
#[cfg(target_arch = "x86_64")]
mod qdot_x86;

pub use buffer::CpuBuffer;

use std::sync::Arc;

use half::{bf16, f16};

use crate::backend::{
    AttentionShape, Backend, BackendError, BatchMeta, DType, DeviceBuffer, HeadShape, KvLayer,
    RmsNorm, RopeTables,
};
use crate::loader::gguf::quant::decode_blocks;
use crate::loader::tensor::{HostData, HostTensor};
use attention::AttnBatch;
use matmul::Weights;
use pool::Pool;

/// The CPU backend: a worker pool of its own; every op splits its rows over it.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    pool: Arc<Pool>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A CPU backend with one thread per available core.
    pub fn new() -> Self {
        Self::with_threads(0)
    }

    /// A CPU backend with `threads` threads (0: one per available core). If worker threads
    /// cannot be started, it logs why and runs every op on the calling thread.
    pub fn with_threads(threads: usize) -> Self {
        let pool = Pool::new(threads).unwrap_or_else(|e| {
            tracing::warn!("cannot start CPU threads ({e}); running on one thread");
            Pool::single()
        });
        CpuBackend {
            pool: Arc::new(pool),
        }
    }

    /// Number of threads that run ops (the calling thread included).
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// Byte-level ops address elements, which a quantized buffer does not store one by one.
fn refuse_quant(op: &'static str, buf: &CpuBuffer) -> Result<(), BackendError> {
    if buf.is_quant() {
        return Err(shape_err(op, "buffer holds quantized blocks".into()));
    }
    Ok(())
}

/// A weight matrix view of `need` elements, any float dtype or quantized blocks.
fn weights<'a>(
    op: &'static str,
    buf: &'a CpuBuffer,
    need: usize,
) -> Result<Weights<'a>, BackendError> {
    buf.check_len(op, "weight", need)?;
    match buf {
        CpuBuffer::F32(v) => Ok(Weights::F32(&v[..need])),
        CpuBuffer::F16(v) => Ok(Weights::F16(&v[..need])),
        CpuBuffer::BF16(v) => Ok(Weights::BF16(&v[..need])),
        CpuBuffer::Quant(q) => match q.ty.bytes_for(need) {
            Some(bytes) => Ok(Weights::Quant(q.ty, &q.bytes[..bytes])),
            None => Err(shape_err(
                op,
                format!(
                    "{need} weight elements are not whole {} blocks",
                    q.ty.name()
                ),
            )),
        },
        other => Err(shape_err(
            op,
            format!("weight has dtype {:?}, expected a float", other.dtype()),
        )),
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn upload_weight(&self, tensor: &HostTensor) -> Result<CpuBuffer, BackendError> {
        let numel = tensor.numel();
        let buf = match &tensor.data {
            HostData::F32(v) => CpuBuffer::F32(v.clone()),
            HostData::F16(v) => CpuBuffer::F16(v.clone()),
            HostData::BF16(v) => CpuBuffer::BF16(v.clone()),
            HostData::Quant(q) => CpuBuffer::Quant(q.clone()),
            // No FP8 products on the CPU: the weight-only reading of an FP8 checkpoint.
            HostData::Fp8(q) => CpuBuffer::F32(q.to_f32()),
        };
        if buf.len() != numel {
            return Err(shape_err(
                "upload_weight",
                format!(
                    "tensor of shape {:?} holds {} elements",
                    tensor.shape,
                    buf.len()
                ),
            ));
        }
        Ok(buf)
    }

    fn upload_weight_owned(&self, tensor: HostTensor) -> Result<CpuBuffer, BackendError> {
        let numel = tensor.numel();
        let buf = match tensor.data {
            HostData::F32(v) => CpuBuffer::F32(v),
            HostData::F16(v) => CpuBuffer::F16(v),
            HostData::BF16(v) => CpuBuffer::BF16(v),
            HostData::Quant(q) => CpuBuffer::Quant(q),
            HostData::Fp8(q) => CpuBuffer::F32(q.to_f32()),
        };
        if buf.len() != numel {
            return Err(shape_err(
                "upload_weight_owned",
                format!(
                    "tensor of shape {:?} holds {} elements",
                    tensor.shape,
                    buf.len()
                ),
            ));
        }
        Ok(buf)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CpuBuffer, BackendError> {
        Ok(CpuBuffer::F32(data.to_vec()))
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CpuBuffer, BackendError> {
        Ok(CpuBuffer::U32(data.to_vec()))
    }

    fn upload_i32(&self, data: &[i32]) -> Result<CpuBuffer, BackendError> {
        Ok(CpuBuffer::I32(data.to_vec()))
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CpuBuffer, BackendError> {
        Ok(match dtype {
            DType::F32 => CpuBuffer::F32(vec![0.0; len]),
            DType::F16 => CpuBuffer::F16(vec![f16::ZERO; len]),
            DType::BF16 => CpuBuffer::BF16(vec![bf16::ZERO; len]),
            DType::U32 => CpuBuffer::U32(vec![0; len]),
            DType::I32 => CpuBuffer::I32(vec![0; len]),
            DType::F8E4M3 => return Err(BackendError::Unsupported("FP8 buffers".into())),
        })
    }

    fn download_f32(&self, buf: &CpuBuffer, out: &mut [f32]) -> Result<(), BackendError> {
        out.copy_from_slice(buf.f32s("download_f32", "buffer", out.len())?);
        Ok(())
    }

    fn download_u32(&self, buf: &CpuBuffer, out: &mut [u32]) -> Result<(), BackendError> {
        out.copy_from_slice(buf.u32s("download_u32", "buffer", out.len())?);
        Ok(())
    }

    fn read_bytes(
        &self,
        buf: &CpuBuffer,
        elem_offset: usize,
        n_elems: usize,
    ) -> Result<Vec<u8>, BackendError> {
        refuse_quant("read_bytes", buf)?;
        let size = buf.dtype().size_bytes();
        buf.check_len("read_bytes", "buffer", elem_offset + n_elems)?;
        Ok(buf.bytes()[elem_offset * size..(elem_offset + n_elems) * size].to_vec())
    }

    fn write_bytes(
        &self,
        buf: &mut CpuBuffer,
        elem_offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        refuse_quant("write_bytes", buf)?;
        let size = buf.dtype().size_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(shape_err(
                "write_bytes",
                format!(
                    "{} bytes is not a whole number of {size}-byte elements",
                    bytes.len()
                ),
            ));
        }
        buf.check_len("write_bytes", "buffer", elem_offset + bytes.len() / size)?;
        buf.bytes_mut()[elem_offset * size..elem_offset * size + bytes.len()]
            .copy_from_slice(bytes);
        Ok(())
    }

    fn copy_within(
        &self,
        buf: &mut CpuBuffer,
        src_offset: usize,
        dst_offset: usize,
        n_elems: usize,
    ) -> Result<(), BackendError> {
        refuse_quant("copy_within", buf)?;
        buf.check_len(
            "copy_within",
            "buffer",
            src_offset.max(dst_offset) + n_elems,
        )?;
        let size = buf.dtype().size_bytes();
        let bytes = buf.bytes_mut();
        bytes.copy_within(
            src_offset * size..(src_offset + n_elems) * size,
            dst_offset * size,
        );
        Ok(())
    }

    fn kv_dtype(&self) -> DType {
        DType::F32
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        step()
    }

    fn embedding(
        &self,
        table: &CpuBuffer,
        ids: &CpuBuffer,
        out: &mut CpuBuffer,
        n: usize,
        hidden: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "embedding";
        let ids = ids.u32s(OP, "ids", n)?;
        let out = out.f32s_mut(OP, "out", n * hidden)?;
        let vocab = table.len() / hidden.max(1);
        let table = weights(OP, table, vocab * hidden)?;
        for (row, &id) in out.chunks_mut(hidden.max(1)).zip(ids) {
            let id = id as usize;
            if id >= vocab {
                return Err(shape_err(
                    OP,
                    format!("token id {id} >= vocabulary size {vocab}"),
                ));
            }
            let span = id * hidden..(id + 1) * hidden;
            match table {
                Weights::F32(t) => row.copy_from_slice(&t[span]),
                Weights::F16(t) => {
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(&t[span], row)
                }
                Weights::BF16(t) => {
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(&t[span], row)
                }
                Weights::Quant(ty, t) => {
                    // `hidden` is whole blocks: `weights` checked `vocab * hidden` is.
                    let row_bytes = hidden / ty.block_elems() * ty.block_bytes();
                    decode_blocks(ty, &t[id * row_bytes..(id + 1) * row_bytes], row);
                }
            }
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuBuffer,
        norm: RmsNorm<'_, Self>,
        out: &mut CpuBuffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "rms_norm";
        let x = x.f32s(OP, "x", n * d)?;
        let w = norm.weight.f32s(OP, "weight", d)?;
        let out = out.f32s_mut(OP, "out", n * d)?;
        if d > 0 {
            ops::rms_norm(&self.pool, x, w, out, d, norm.eps);
        }
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: &mut CpuBuffer,
        x: &CpuBuffer,
        norm: RmsNorm<'_, Self>,
        out: &mut CpuBuffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "add_rms_norm";
        let residual = residual.f32s_mut(OP, "residual", n * d)?;
        let x = x.f32s(OP, "x", n * d)?;
        let w = norm.weight.f32s(OP, "weight", d)?;
        let out = out.f32s_mut(OP, "out", n * d)?;
        if d > 0 {
            ops::add_rms_norm(&self.pool, residual, x, w, out, d, norm.eps);
        }
        Ok(())
    }

    fn matmul(
        &self,
        x: &CpuBuffer,
        w: &CpuBuffer,
        out: &mut CpuBuffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "matmul";
        let x = x.f32s(OP, "x", n * k)?;
        let w = weights(OP, w, m * k)?;
        let out = out.f32s_mut(OP, "out", n * m)?;
        matmul::matmul(&self.pool, x, w, out, n, k, m);
        Ok(())
    }

    fn add_bias(
        &self,
        x: &mut CpuBuffer,
        bias: &CpuBuffer,
        n: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "add_bias";
        let x = x.f32s_mut(OP, "x", n * m)?;
        let bias = bias.f32s(OP, "bias", m)?;
        if m > 0 {
            ops::add_bias(x, bias, m);
        }
        Ok(())
    }

    fn rope(
        &self,
        qkv: &mut CpuBuffer,
        positions: &CpuBuffer,
        tables: RopeTables<'_, Self>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        let RopeTables { cos, sin } = tables;
        const OP: &str = "rope";
        let half = heads.head_dim / 2;
        if !heads.head_dim.is_multiple_of(2) {
            return Err(shape_err(OP, format!("head_dim {} is odd", heads.head_dim)));
        }
        let qkv = qkv.f32s_mut(OP, "qkv", n * heads.qkv_width())?;
        let positions = positions.u32s(OP, "positions", n)?;
        let max_pos = cos.len() / half.max(1);
        let cos = cos.f32s(OP, "cos", max_pos * half)?;
        let sin = sin.f32s(OP, "sin", max_pos * half)?;
        if let Some(p) = positions.iter().find(|p| **p as usize >= max_pos) {
            return Err(shape_err(
                OP,
                format!("position {p} beyond the RoPE table ({max_pos} positions)"),
            ));
        }
        if half > 0 {
            ops::rope(&self.pool, qkv, positions, cos, sin, heads);
        }
        Ok(())
    }

    fn kv_write(
        &self,
        qkv: &CpuBuffer,
        slot_mapping: &CpuBuffer,
        kv: KvLayer<&mut CpuBuffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        let KvLayer {
            k: k_cache,
            v: v_cache,
        } = kv;
        const OP: &str = "kv_write";
        let qkv = qkv.f32s(OP, "qkv", n * heads.qkv_width())?;
        let slots = slot_mapping.u32s(OP, "slot_mapping", n)?;
        let kvw = heads.kv_width();
        let num_slots = k_cache.len() / kvw.max(1);
        if v_cache.len() != k_cache.len() {
            return Err(shape_err(OP, "k_cache and v_cache differ in size".into()));
        }
        if let Some(s) = slots.iter().find(|s| **s as usize >= num_slots) {
            return Err(shape_err(
                OP,
                format!("slot {s} beyond the cache ({num_slots} slots)"),
            ));
        }
        let k_cache = k_cache.f32s_mut(OP, "k_cache", num_slots * kvw)?;
        let v_cache = v_cache.f32s_mut(OP, "v_cache", num_slots * kvw)?;
        if kvw > 0 {
            ops::kv_write(qkv, slots, k_cache, v_cache, heads);
        }
        Ok(())
    }

    fn paged_attention(
        &self,
        qkv: &CpuBuffer,
        kv: KvLayer<&CpuBuffer>,
        meta: &BatchMeta<Self>,
        out: &mut CpuBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        const OP: &str = "paged_attention";
        let AttentionShape {
            heads,
            block_size,
            scale,
        } = shape;
        if heads.n_kv_heads == 0
            || !heads.n_heads.is_multiple_of(heads.n_kv_heads)
            || block_size == 0
        {
            return Err(shape_err(
                OP,
                format!("invalid heads {heads:?} or block size {block_size}"),
            ));
        }
        let n = meta.n_tokens;
        let qkv = qkv.f32s(OP, "qkv", n * heads.qkv_width())?;
        let slot_elems = block_size * heads.kv_width();
        let num_blocks = kv.k.len() / slot_elems.max(1);
        let cache = KvLayer {
            k: kv.k.f32s(OP, "k_cache", num_blocks * slot_elems)?,
            v: kv.v.f32s(OP, "v_cache", num_blocks * slot_elems)?,
        };
        let batch = AttnBatch {
            q_starts: meta.q_starts.u32s(OP, "q_starts", meta.n_seqs + 1)?,
            ctx_lens: meta.ctx_lens.u32s(OP, "ctx_lens", meta.n_seqs)?,
            block_tables: meta.block_tables.u32s(
                OP,
                "block_tables",
                meta.n_seqs * meta.max_blocks_per_seq,
            )?,
            max_blocks_per_seq: meta.max_blocks_per_seq,
            block_size,
            num_blocks,
        };
        let rows = attention::token_positions(&batch, n)?;
        let out = out.f32s_mut(OP, "out", n * heads.q_width())?;
        if heads.head_dim > 0 {
            attention::paged_attention(&self.pool, qkv, cache, &batch, &rows, out, heads, scale);
        }
        Ok(())
    }

    fn silu_mul(
        &self,
        gate_up: &CpuBuffer,
        out: &mut CpuBuffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "silu_mul";
        let gate_up = gate_up.f32s(OP, "gate_up", n * 2 * f)?;
        let out = out.f32s_mut(OP, "out", n * f)?;
        if f > 0 {
            ops::silu_mul(&self.pool, gate_up, out, f);
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &CpuBuffer,
        rows: &CpuBuffer,
        out: &mut CpuBuffer,
        r: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "gather_rows";
        let n = x.len() / d.max(1);
        let x = x.f32s(OP, "x", n * d)?;
        let rows = rows.u32s(OP, "rows", r)?;
        let out = out.f32s_mut(OP, "out", r * d)?;
        for (o, &row) in out.chunks_mut(d.max(1)).zip(rows) {
            let row = row as usize;
            if row >= n {
                return Err(shape_err(OP, format!("row {row} >= {n} rows")));
            }
            o.copy_from_slice(&x[row * d..(row + 1) * d]);
        }
        Ok(())
    }
}
