//! Host-memory buffers of the CPU backend: one typed `Vec` per buffer, with checked typed views.
//! Quantized weights keep their GGUF blocks ([`CpuBuffer::Quant`]).

use half::{bf16, f16};

use crate::backend::{BackendError, DType, DeviceBuffer};
use crate::loader::tensor::QuantData;

/// A flat buffer in host memory.
#[derive(Debug, Clone)]
pub enum CpuBuffer {
    /// [`DType::F32`] elements.
    F32(Vec<f32>),
    /// [`DType::F16`] elements.
    F16(Vec<f16>),
    /// [`DType::BF16`] elements.
    BF16(Vec<bf16>),
    /// [`DType::U32`] elements.
    U32(Vec<u32>),
    /// [`DType::I32`] elements.
    I32(Vec<i32>),
    /// A quantized weight matrix (blocks along rows). It reports [`DType::F32`], the dtype it
    /// computes in; byte-level ops refuse it.
    Quant(QuantData),
}

impl DeviceBuffer for CpuBuffer {
    fn dtype(&self) -> DType {
        match self {
            CpuBuffer::F32(_) => DType::F32,
            CpuBuffer::F16(_) => DType::F16,
            CpuBuffer::BF16(_) => DType::BF16,
            CpuBuffer::U32(_) => DType::U32,
            CpuBuffer::I32(_) => DType::I32,
            CpuBuffer::Quant(_) => DType::F32,
        }
    }

    fn len(&self) -> usize {
        match self {
            CpuBuffer::F32(v) => v.len(),
            CpuBuffer::F16(v) => v.len(),
            CpuBuffer::BF16(v) => v.len(),
            CpuBuffer::U32(v) => v.len(),
            CpuBuffer::I32(v) => v.len(),
            CpuBuffer::Quant(q) => q.numel(),
        }
    }
}

fn shape_error(
    op: &'static str,
    what: &str,
    buf: &CpuBuffer,
    dtype: DType,
    need: usize,
) -> BackendError {
    BackendError::Shape {
        op,
        detail: format!(
            "{what} is {:?}[{}], expected {dtype:?} with at least {need} elements",
            buf.dtype(),
            buf.len()
        ),
    }
}

impl CpuBuffer {
    /// The first `need` elements as f32, or a shape error naming `op` and `what`.
    pub fn f32s(&self, op: &'static str, what: &str, need: usize) -> Result<&[f32], BackendError> {
        match self {
            CpuBuffer::F32(v) if v.len() >= need => Ok(&v[..need]),
            _ => Err(shape_error(op, what, self, DType::F32, need)),
        }
    }

    /// The first `need` elements as mutable f32, or a shape error.
    pub fn f32s_mut(
        &mut self,
        op: &'static str,
        what: &str,
        need: usize,
    ) -> Result<&mut [f32], BackendError> {
        if self.dtype() != DType::F32 || self.len() < need {
            return Err(shape_error(op, what, self, DType::F32, need));
        }
        match self {
            CpuBuffer::F32(v) => Ok(&mut v[..need]),
            _ => Err(shape_error(op, what, self, DType::F32, need)),
        }
    }

    /// The first `need` elements as u32, or a shape error.
    pub fn u32s(&self, op: &'static str, what: &str, need: usize) -> Result<&[u32], BackendError> {
        match self {
            CpuBuffer::U32(v) if v.len() >= need => Ok(&v[..need]),
            _ => Err(shape_error(op, what, self, DType::U32, need)),
        }
    }

    /// Checks that the buffer holds at least `need` elements of any dtype.
    pub fn check_len(&self, op: &'static str, what: &str, need: usize) -> Result<(), BackendError> {
        if self.len() < need {
            return Err(BackendError::Shape {
                op,
                detail: format!("{what} holds {} elements, needs {need}", self.len()),
            });
        }
        Ok(())
    }

    /// Whether this is a quantized weight (whose bytes are blocks, not elements).
    pub fn is_quant(&self) -> bool {
        matches!(self, CpuBuffer::Quant(_))
    }

    /// All elements as little-endian bytes (a quantized buffer's blocks).
    pub fn bytes(&self) -> &[u8] {
        match self {
            CpuBuffer::F32(v) => bytemuck::cast_slice(v),
            CpuBuffer::F16(v) => bytemuck::cast_slice(v),
            CpuBuffer::BF16(v) => bytemuck::cast_slice(v),
            CpuBuffer::U32(v) => bytemuck::cast_slice(v),
            CpuBuffer::I32(v) => bytemuck::cast_slice(v),
            CpuBuffer::Quant(q) => &q.bytes,
        }
    }

    /// All elements as mutable little-endian bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            CpuBuffer::F32(v) => bytemuck::cast_slice_mut(v),
            CpuBuffer::F16(v) => bytemuck::cast_slice_mut(v),
            CpuBuffer::BF16(v) => bytemuck::cast_slice_mut(v),
            CpuBuffer::U32(v) => bytemuck::cast_slice_mut(v),
            CpuBuffer::I32(v) => bytemuck::cast_slice_mut(v),
            CpuBuffer::Quant(q) => &mut q.bytes,
        }
    }
}
