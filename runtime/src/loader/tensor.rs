//! Host-side tensors as the loaders hand them to the model.
//!
//! Contract between `crate::loader` (safetensors, GGUF) and `crate::model`. Tensors are named with
//! Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`, ...) whatever the source format;
//! GGUF names are mapped and llama.cpp's Q/K row permutation is undone by the loader. Shapes are
//! row-major, outermost first, as PyTorch prints them (a linear weight is `[out_features, in_features]`).

use half::{bf16, f16};

pub use super::fp8::Fp8Rows;
pub use super::gguf::quant::{QuantData, QuantType};

/// Element storage of a host tensor. Quantized GGUF types stay in their block format
/// ([`HostData::Quant`]) and FP8 checkpoints in e4m3 ([`HostData::Fp8`]); backends that cannot
/// compute with them widen them at upload.
#[derive(Debug, Clone)]
pub enum HostData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 16-bit IEEE floats.
    F16(Vec<f16>),
    /// bfloat16s.
    BF16(Vec<bf16>),
    /// Quantized blocks (GGUF Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), row-major.
    Quant(QuantData),
    /// FP8 e4m3 codes with one scale per row (compressed-tensors FP8 checkpoints).
    Fp8(Fp8Rows),
}

impl HostData {
    /// Number of elements held.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::Quant(q) => q.numel(),
            HostData::Fp8(q) => q.codes.len(),
        }
    }

    /// True when no element is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A named, shaped tensor in host memory.
#[derive(Debug, Clone)]
pub struct HostTensor {
    /// Row-major shape, outermost first.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: HostData,
}

impl HostTensor {
    /// Number of elements the shape describes.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The data as f32 (copies, widens 16-bit data, dequantizes blocks and FP8 rows).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::Quant(q) => q.to_f32(),
            HostData::Fp8(q) => q.to_f32(),
        }
    }
}
