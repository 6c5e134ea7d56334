//! sov-kernels: the CUDA C sources of sov's GPU kernels, exposed as strings for NVRTC.
//!
//! Each `.cu` file under `kernels/cuda/` is one compilation unit starting with
//! `#include "common.cuh"`. NVRTC compiles a single string and should not depend on CUDA's own
//! headers being installed, so [`KernelId::source`] inlines the shared header in place of that line.
//! The runtime (`sov::backend::cuda`) compiles each unit once per process and device architecture,
//! with the `-D` defines [`KernelId::defines`] asks for, and looks kernels up by the names
//! [`KernelId::functions`] lists. This crate has no CUDA dependency: it builds everywhere.

/// The header every unit includes: bf16 conversion, vector unpacking, warp and block reductions.
pub const COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

const INCLUDE_LINE: &str = "#include \"common.cuh\"";

/// One compilation unit of kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelId {
    /// Paged decode attention with split-K (flash-decoding) and GQA sharing; needs head defines.
    DecodeAttention,
    /// Causal prefill attention over the paged cache, varlen batch; needs head defines.
    PrefillAttention,
    /// RMSNorm fused with the residual add, SiLU-mul, embedding and row gathers, bias, bf16 cast.
    Elementwise,
    /// RoPE (rotate_half, precomputed Llama-3.1 frequencies) and KV-cache writes.
    RopeKv,
    /// On-device argmax and temperature / top-k / top-p sampling.
    Sampling,
    /// Matrix-vector products for a few rows (decode at batch 1-4), bound by the weight stream.
    Gemv,
}

/// Compile-time parameters of the attention units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadConfig {
    /// Dimension of one attention head.
    pub head_dim: usize,
    /// Query heads per KV head (grouped-query attention).
    pub group: usize,
    /// The KV cache holds f32 instead of bf16 (precise mode).
    pub kv_f32: bool,
}

/// A head shape the attention kernels cannot be compiled for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "attention kernels support head_dim in {{16, 32, 64, 128, 256}} and 1..=8 query heads per KV \
     head; got head_dim {head_dim}, group {group}"
)]
pub struct UnsupportedHeads {
    pub head_dim: usize,
    pub group: usize,
}

impl HeadConfig {
    /// Checks that the attention kernels can be compiled for this shape.
    pub fn validate(self) -> Result<Self, UnsupportedHeads> {
        let dim_ok = matches!(self.head_dim, 16 | 32 | 64 | 128 | 256);
        if dim_ok && (1..=8).contains(&self.group) {
            Ok(self)
        } else {
            Err(UnsupportedHeads {
                head_dim: self.head_dim,
                group: self.group,
            })
        }
    }
}

impl KernelId {
    /// Every unit, for tools that compile them all.
    pub const ALL: [KernelId; 6] = [
        KernelId::DecodeAttention,
        KernelId::PrefillAttention,
        KernelId::Elementwise,
        KernelId::RopeKv,
        KernelId::Sampling,
        KernelId::Gemv,
    ];

    /// File name under `kernels/cuda/`.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelId::DecodeAttention => "decode_attention.cu",
            KernelId::PrefillAttention => "prefill_attention.cu",
            KernelId::Elementwise => "elementwise.cu",
            KernelId::RopeKv => "rope_kv.cu",
            KernelId::Sampling => "sampling.cu",
            KernelId::Gemv => "gemv.cu",
        }
    }

    fn raw_source(self) -> &'static str {
        match self {
            KernelId::DecodeAttention => include_str!("../cuda/decode_attention.cu"),
            KernelId::PrefillAttention => include_str!("../cuda/prefill_attention.cu"),
            KernelId::Elementwise => include_str!("../cuda/elementwise.cu"),
            KernelId::RopeKv => include_str!("../cuda/rope_kv.cu"),
            KernelId::Sampling => include_str!("../cuda/sampling.cu"),
            KernelId::Gemv => include_str!("../cuda/gemv.cu"),
        }
    }

    /// The full program text for NVRTC, with the shared header inlined.
    pub fn source(self) -> String {
        self.raw_source().replacen(INCLUDE_LINE, COMMON_HEADER, 1)
    }

    /// `extern "C"` kernel names the unit defines.
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            KernelId::DecodeAttention => &["paged_decode_attention"],
            KernelId::PrefillAttention => &["prefill_attention"],
            KernelId::Elementwise => &[
                "rmsnorm_residual",
                "silu_mul",
                "embedding_gather",
                "gather_rows",
                "add_bias",
                "cast_f32_bf16",
                "fill_random_bf16",
                "split_f32_bf16",
            ],
            KernelId::RopeKv => &["rope_inplace", "kv_write", "kv_write_f32"],
            KernelId::Sampling => &["argmax_rows", "sample_tokens"],
            KernelId::Gemv => &["gemv_bf16"],
        }
    }

    /// Whether the unit is compiled per [`HeadConfig`].
    pub fn needs_heads(self) -> bool {
        matches!(self, KernelId::DecodeAttention | KernelId::PrefillAttention)
    }

    /// NVRTC `-D` options for this unit (empty unless [`Self::needs_heads`]).
    pub fn defines(self, heads: Option<HeadConfig>) -> Vec<String> {
        match (self.needs_heads(), heads) {
            (true, Some(h)) => {
                let mut d = vec![
                    format!("-DHEAD_DIM={}", h.head_dim),
                    format!("-DGQA_GROUP={}", h.group),
                ];
                if h.kv_f32 {
                    d.push("-DKV_F32".to_string());
                }
                d
            }
            _ => Vec::new(),
        }
    }
}

/// Bytes of dynamic shared memory `prefill_attention` needs for `head_dim`.
pub fn prefill_shared_bytes(head_dim: usize) -> usize {
    let padded = head_dim + 4;
    (64 + 2 * 32) * padded * 4 + 64 * 33 * 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_inlines_the_header_and_defines_its_functions() {
        for id in KernelId::ALL {
            let src = id.source();
            assert!(
                !src.contains(INCLUDE_LINE),
                "{} still includes the header",
                id.file_name()
            );
            assert!(
                src.contains("__device__ __forceinline__ float bf2f"),
                "{}",
                id.file_name()
            );
            for f in id.functions() {
                assert!(
                    src.contains(&format!("{f}(")),
                    "{} does not define {f}",
                    id.file_name()
                );
            }
        }
    }

    #[test]
    fn head_shapes_are_validated() {
        assert!(
            HeadConfig {
                head_dim: 128,
                group: 4,
                kv_f32: false
            }
            .validate()
            .is_ok()
        );
        assert!(
            HeadConfig {
                head_dim: 64,
                group: 3,
                kv_f32: true
            }
            .validate()
            .is_ok()
        );
        assert!(
            HeadConfig {
                head_dim: 96,
                group: 4,
                kv_f32: false
            }
            .validate()
            .is_err()
        );
        assert!(
            HeadConfig {
                head_dim: 128,
                group: 9,
                kv_f32: false
            }
            .validate()
            .is_err()
        );
        let d = KernelId::DecodeAttention.defines(Some(HeadConfig {
            head_dim: 64,
            group: 3,
            kv_f32: false,
        }));
        assert_eq!(
            d,
            vec!["-DHEAD_DIM=64".to_string(), "-DGQA_GROUP=3".to_string()]
        );
        let d = KernelId::PrefillAttention.defines(Some(HeadConfig {
            head_dim: 64,
            group: 3,
            kv_f32: true,
        }));
        assert_eq!(d.last().map(String::as_str), Some("-DKV_F32"));
        assert!(KernelId::Elementwise.defines(None).is_empty());
    }
}
