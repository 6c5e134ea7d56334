//! `impl Backend for CudaBackend`: argument checks and dispatch to the launch code.

use half::bf16;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::{
    AttentionShape, Backend, BackendError, BatchMeta, DType, HeadShape, InputProducer, KvLayer,
    NewTokens, ProjectionSite, RmsNorm, RopeTables, SwiGluShape, check_buffer,
};
use crate::loader::tensor::{HostData, HostTensor};

fn range_err(op: &'static str, what: &str, end: usize, len: usize) -> BackendError {
    BackendError::Shape {
        op,
        detail: format!("{what} ends at element {end}, buffer holds {len}"),
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn upload_weight(&self, tensor: &HostTensor) -> Result<CudaBuffer, BackendError> {
        let data: Vec<bf16> = match &tensor.data {
            HostData::BF16(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| bf16::from_f32(x.to_f32())).collect(),
            HostData::F32(v) => v.iter().map(|&x| bf16::from_f32(x)).collect(),
            // Through f16 as when the loader widened blocks to f16, so GPU weights are unchanged.
            HostData::Quant(q) => q
                .to_f32()
                .into_iter()
                .map(|x| bf16::from_f32(half::f16::from_f32(x).to_f32()))
                .collect(),
            // An FP8 checkpoint outside FP8 mode (`--quantization fp8` keeps its codes): bf16
            // rounds `e4m3 * scale` (up to 12 significant bits) to 8.
            HostData::Fp8(q) => q.to_f32().into_iter().map(bf16::from_f32).collect(),
        };
        if data.len() != tensor.numel() {
            return Err(BackendError::Shape {
                op: "upload_weight",
                detail: format!("shape {:?} but {} elements", tensor.shape, data.len()),
            });
        }
        self.upload_bytes(DType::BF16, bytemuck::cast_slice(&data))
    }

    fn upload_projection(
        &self,
        tensor: HostTensor,
        site: ProjectionSite,
    ) -> Result<CudaBuffer, BackendError> {
        self.upload_projection_impl(tensor, site)
    }

    fn upload_f32(&self, data: &[f32]) -> Result<CudaBuffer, BackendError> {
        self.upload_bytes(DType::F32, bytemuck::cast_slice(data))
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CudaBuffer, BackendError> {
        self.upload_bytes(DType::U32, bytemuck::cast_slice(data))
    }

    fn upload_i32(&self, data: &[i32]) -> Result<CudaBuffer, BackendError> {
        self.upload_bytes(DType::I32, bytemuck::cast_slice(data))
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer, BackendError> {
        self.alloc_zeroed(dtype, len)
    }

    fn download_f32(&self, buf: &CudaBuffer, out: &mut [f32]) -> Result<(), BackendError> {
        check_buffer("download_f32", "buf", buf, DType::F32, out.len())?;
        self.download_raw(buf, 0, bytemuck::cast_slice_mut(out))
    }

    fn download_u32(&self, buf: &CudaBuffer, out: &mut [u32]) -> Result<(), BackendError> {
        check_buffer("download_u32", "buf", buf, DType::U32, out.len())?;
        self.download_raw(buf, 0, bytemuck::cast_slice_mut(out))
    }

    fn read_bytes(
        &self,
        buf: &CudaBuffer,
        elem_offset: usize,
        n_elems: usize,
    ) -> Result<Vec<u8>, BackendError> {
        let end = elem_offset + n_elems;
        if end > buf.len {
            return Err(range_err("read_bytes", "range", end, buf.len));
        }
        let size = buf.dtype.size_bytes();
        let mut out = vec![0u8; n_elems * size];
        self.download_raw(buf, elem_offset * size, &mut out)?;
        Ok(out)
    }

    fn write_bytes(
        &self,
        buf: &mut CudaBuffer,
        elem_offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let size = buf.dtype.size_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(BackendError::Shape {
                op: "write_bytes",
                detail: format!("{} bytes is not a multiple of {size}", bytes.len()),
            });
        }
        let end = elem_offset + bytes.len() / size;
        if end > buf.len {
            return Err(range_err("write_bytes", "range", end, buf.len));
        }
        self.upload_raw(buf, elem_offset * size, bytes)
    }

    fn copy_within(
        &self,
        buf: &mut CudaBuffer,
        src_offset: usize,
        dst_offset: usize,
        n_elems: usize,
    ) -> Result<(), BackendError> {
        for (what, off) in [("source", src_offset), ("destination", dst_offset)] {
            if off + n_elems > buf.len {
                return Err(range_err("copy_within", what, off + n_elems, buf.len));
            }
        }
        if src_offset.abs_diff(dst_offset) < n_elems {
            return Err(BackendError::Shape {
                op: "copy_within",
                detail: "ranges overlap".into(),
            });
        }
        self.copy_raw(
            buf.ptr_at(dst_offset),
            buf.ptr_at(src_offset),
            n_elems * buf.dtype.size_bytes(),
        )
    }

    fn kv_dtype(&self) -> DType {
        self.kv_dtype_impl()
    }

    fn kv_row_elems(&self, heads: HeadShape) -> usize {
        self.kv_row_elems_impl(heads)
    }

    fn kv_block_multiple(&self) -> usize {
        match self.kv_element() {
            sov_kernels::KvElement::E4m3 => sov_kernels::KV_E4M3_GROUP,
            _ => 1,
        }
    }

    fn free_memory_bytes(&self) -> Option<usize> {
        // Memory the allocation pool keeps for reuse is free to this backend's buffers.
        let idle = self.idle_pool_bytes().unwrap_or(0);
        self.free_device_bytes()
            .ok()
            .map(|f| f.saturating_add(idle))
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.stream.synchronize().map_err(driver_err)
    }

    fn embedding(
        &self,
        table: &CudaBuffer,
        ids: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        hidden: usize,
    ) -> Result<(), BackendError> {
        self.embedding_impl(table, ids, out, n, hidden)
    }

    fn matmul_input_dtype(&self, rows: usize) -> DType {
        self.matmul_input_dtype_impl(rows)
    }

    fn takes_quantized_rows(
        &self,
        rows: usize,
        k: usize,
        w: &CudaBuffer,
        producer: InputProducer,
    ) -> bool {
        self.takes_quantized_rows_impl(rows, k, w, producer)
    }

    fn alloc_quantized_rows(&self, rows: usize, k: usize) -> Result<CudaBuffer, BackendError> {
        self.alloc_quantized_rows_impl(rows, k)
    }

    fn rms_norm(
        &self,
        x: &CudaBuffer,
        norm: RmsNorm<'_, Self>,
        out: &mut CudaBuffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        check_buffer("rms_norm", "x", x, DType::F32, n * d)?;
        // Plain RMSNorm: the kernel reads `x` through its residual pointer and never writes it.
        self.rms_norm_impl(x.ptr(), None, norm, out, n, d)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuffer,
        x: &CudaBuffer,
        norm: RmsNorm<'_, Self>,
        out: &mut CudaBuffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        check_buffer("add_rms_norm", "residual", residual, DType::F32, n * d)?;
        self.rms_norm_impl(residual.ptr(), Some(x), norm, out, n, d)
    }

    fn matmul(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        self.matmul_impl(x, w, out, n, k, m)
    }

    fn matmul_residual_delta(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        self.matmul_residual_delta_impl(x, w, out, (n, k, m))
    }

    fn add_bias(
        &self,
        x: &mut CudaBuffer,
        bias: &CudaBuffer,
        n: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        self.add_bias_impl(x, bias, n, m)
    }

    fn rope(
        &self,
        qkv: &mut CudaBuffer,
        positions: &CudaBuffer,
        tables: RopeTables<'_, Self>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        self.rope_impl(qkv, positions, tables, n, heads)
    }

    fn kv_write(
        &self,
        qkv: &CudaBuffer,
        slot_mapping: &CudaBuffer,
        kv: KvLayer<&mut CudaBuffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        self.kv_write_impl(qkv, slot_mapping, kv, n, heads)
    }

    fn rope_kv_write(
        &self,
        qkv: &mut CudaBuffer,
        tokens: NewTokens<'_, Self>,
        tables: RopeTables<'_, Self>,
        kv: KvLayer<&mut CudaBuffer>,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        self.rope_kv_write_impl(qkv, tokens, tables, kv, heads)
    }

    fn paged_attention(
        &self,
        qkv: &CudaBuffer,
        kv: KvLayer<&CudaBuffer>,
        meta: &BatchMeta<Self>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        self.paged_attention_impl(qkv, kv, meta, out, shape)
    }

    fn reserve_scratch(
        &self,
        max_rows: usize,
        max_k: usize,
        max_seqs: usize,
        max_context: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        self.reserve_matmul_scratch(max_rows, max_k)?;
        self.reserve_decode_scratch(max_seqs, max_context, heads)
    }

    fn rope_kv_attention(
        &self,
        qkv: &mut CudaBuffer,
        tables: RopeTables<'_, Self>,
        kv: KvLayer<&mut CudaBuffer>,
        meta: &BatchMeta<Self>,
        out: &mut CudaBuffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        self.rope_kv_attention_impl(qkv, tables, kv, meta, out, shape)
    }

    fn matmul_silu_mul(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        gate_up: &mut CudaBuffer,
        out: &mut CudaBuffer,
        shape: SwiGluShape,
    ) -> Result<(), BackendError> {
        self.matmul_silu_mul_impl(x, w, gate_up, out, shape)
    }

    fn silu_mul(
        &self,
        gate_up: &CudaBuffer,
        out: &mut CudaBuffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError> {
        self.silu_mul_impl(gate_up, out, n, f)
    }

    fn gather_rows(
        &self,
        x: &CudaBuffer,
        rows: &CudaBuffer,
        out: &mut CudaBuffer,
        r: usize,
        d: usize,
    ) -> Result<(), BackendError> {
        self.gather_rows_impl(x, rows, out, r, d)
    }
}
