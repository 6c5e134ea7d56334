//! sov-kernels: the CUDA C sources of sov's GPU kernels, exposed as strings for NVRTC.
//!
//! Each `.cu` file under `kernels/cuda/` is one compilation unit starting with
//! `#include "common.cuh"`. NVRTC compiles a single string and should not depend on CUDA's own
//! headers being installed, so [`KernelId::source`] inlines the shared header in place of that line.
//! The runtime (`sov::backend::cuda`) compiles each unit once per process and device architecture,
//! with the `-D` defines [`KernelId::defines`] asks for (shape parameters, and the ring depth the
//! caller's tuning picks; this crate reads no environment), and looks kernels up by the names
//! [`KernelId::functions`] lists. This crate has no CUDA dependency: it builds everywhere.

#![warn(missing_docs)]

/// The header every unit includes: bf16 conversion, vector unpacking, warp and block reductions.
pub const COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

/// The end of a decode-attention CTA (warp and split merge), shared by both decode units.
pub const DECODE_MERGE_HEADER: &str = include_str!("../cuda/decode_merge.cuh");

/// The tensor-core attention units' shared pieces: swizzled cp.async copies of K/V rows,
/// ldmatrix reads and bf16 operand packing.
pub const MMA_TILES_HEADER: &str = include_str!("../cuda/mma_tiles.cuh");

/// The warp-item form of the tensor-core decode attention (one warp a whole (kv head, sequence),
/// with the fused RoPE), included by its unit after the pieces it shares with the CTA form.
pub const DECODE_WARP_ITEM_HEADER: &str = include_str!("../cuda/decode_warp_item.cuh");

/// Headers a unit may include: (file name, embedded text). Each `#include "<name>"` line is
/// replaced by the header's text.
const HEADERS: [(&str, &str); 4] = [
    ("common.cuh", COMMON_HEADER),
    ("decode_merge.cuh", DECODE_MERGE_HEADER),
    ("mma_tiles.cuh", MMA_TILES_HEADER),
    ("decode_warp_item.cuh", DECODE_WARP_ITEM_HEADER),
];

/// Ring depth (chunks per warp, `STAGES`) of the tensor-core decode kernel that sov compiles
/// unless its tuning says otherwise (measured on the H200: deeper rings were not faster).
pub const DEFAULT_DECODE_MMA_STAGES: usize = 2;

/// Ring depths the tensor-core decode kernel can be compiled for. At head_dim 256 a depth of 4 asks
/// for 256 KiB of shared memory, more than an SM has: loading the unit then fails with the
/// driver's error.
pub const DECODE_MMA_STAGES: std::ops::RangeInclusive<usize> = 2..=4;

/// Bytes of dynamic shared memory `paged_decode_attention_mma` compiled with a ring of `stages`
/// needs for `head_dim` and cache element `kv`, for each of its 4 warps: bf16, `stages` chunks of
/// 16 K and 16 V rows; e4m3, `stages` chunks of 16 K and 16 V rows of codes with their 2 x 16 f32
/// scales (widened to 16-bit in registers; `decode_attention_mma.cu`).
pub fn decode_mma_shared_bytes(head_dim: usize, stages: usize, kv: KvElement) -> usize {
    match kv {
        KvElement::E4m3 => 4 * stages * (2 * 16 * head_dim + 2 * 16 * 4),
        _ => 4 * stages * 2 * 16 * head_dim * 2,
    }
}

/// Bytes of dynamic shared memory `prefill_attention_mma` needs for `head_dim` and cache element
/// `kv`: bf16, two stages of 32 K and 32 V rows; e4m3, two stages of 32 K and 32 V rows of codes
/// with their 2 x 32 f32 scales, and one stage widened to 16-bit.
pub fn prefill_mma_shared_bytes(head_dim: usize, kv: KvElement) -> usize {
    let wide_stage = 2 * 32 * head_dim * 2;
    match kv {
        KvElement::E4m3 => 2 * (2 * 32 * head_dim + 2 * 32 * 4) + wide_stage,
        _ => 2 * wide_stage,
    }
}

/// Bytes each slot owns in one layer's K (or V) cache of e4m3 codes: `kv_heads * head_dim` codes
/// and one f32 scale per head, padded to 16 bytes (`kv_e4m3_row_bytes` in `common.cuh`). The bytes
/// of a slot are not one row: slots go in groups of [`KV_E4M3_GROUP`], each group's
/// `KV_E4M3_GROUP * row` bytes holding `[kv_heads][16][head_dim]` codes, then `[kv_heads][16]` f32
/// scales, then padding, so that a head's codes of 16 consecutive slots are one contiguous run
/// (the decode kernel then reads whole runs, not a 128-byte piece of each row).
pub fn kv_e4m3_row_bytes(kv_heads: usize, head_dim: usize) -> usize {
    kv_heads * head_dim + (4 * kv_heads).div_ceil(16) * 16
}

/// Slots of one group of an e4m3 cache ([`kv_e4m3_row_bytes`]); a cache block of such a cache
/// must be whole groups (its block size a multiple of this).
pub const KV_E4M3_GROUP: usize = 16;

/// Byte ranges, within one layer's K (or V) bytes of a block of an e4m3 cache
/// ([`kv_e4m3_row_bytes`] a slot, block size a multiple of [`KV_E4M3_GROUP`]), that hold the first
/// `tokens` slots' codes and scales: what a checkpoint keeps of a partial block, in this order.
pub fn kv_e4m3_tail_ranges(
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
) -> Vec<std::ops::Range<usize>> {
    let group_bytes = KV_E4M3_GROUP * kv_e4m3_row_bytes(kv_heads, head_dim);
    let mut ranges = Vec::new();
    for g in 0..tokens.div_ceil(KV_E4M3_GROUP) {
        let (base, n) = (
            g * group_bytes,
            (tokens - g * KV_E4M3_GROUP).min(KV_E4M3_GROUP),
        );
        for h in 0..kv_heads {
            let at = base + h * KV_E4M3_GROUP * head_dim;
            ranges.push(at..at + n * head_dim);
        }
        for h in 0..kv_heads {
            let at = base + kv_heads * KV_E4M3_GROUP * head_dim + h * KV_E4M3_GROUP * 4;
            ranges.push(at..at + n * 4);
        }
    }
    ranges
}

/// A deterministic-mode small-row kernel of `gemv.cu` (`det_gemv_*`): its warps, the chains a
/// warp keeps (8 weight rows each), and the columns a stage and stages of its shared-memory ring
/// (the template arguments of each instantiation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetGemvKernel {
    /// The `extern "C"` name in `gemv.cu`.
    pub name: &'static str,
    /// Warps a CTA.
    pub warps: usize,
    /// Accumulator chains a warp, each over 8 weight rows.
    pub chains: usize,
    /// Columns of k a stage holds.
    pub stage_cols: usize,
    /// Stages of the ring.
    pub stages: usize,
}

/// Most rows of x a [`DetGemvKernel`] takes.
pub const DET_GEMV_MAX_ROWS: usize = 16;

/// The deterministic small-row kernels, as `gemv.cu` instantiates them; the host times them all
/// per product shape and keeps the fastest (`runtime/src/backend/cuda/det_gemv.rs`).
pub const DET_GEMV_KERNELS: [DetGemvKernel; 6] = [
    DetGemvKernel {
        name: "det_gemv_8",
        warps: 1,
        chains: 1,
        stage_cols: 512,
        stages: 4,
    },
    DetGemvKernel {
        name: "det_gemv_16",
        warps: 2,
        chains: 1,
        stage_cols: 1024,
        stages: 2,
    },
    DetGemvKernel {
        name: "det_gemv_16_w1",
        warps: 1,
        chains: 2,
        stage_cols: 1024,
        stages: 2,
    },
    DetGemvKernel {
        name: "det_gemv_32",
        warps: 4,
        chains: 1,
        stage_cols: 1024,
        stages: 2,
    },
    DetGemvKernel {
        name: "det_gemv_32_k512",
        warps: 4,
        chains: 1,
        stage_cols: 512,
        stages: 2,
    },
    DetGemvKernel {
        name: "det_gemv_64",
        warps: 8,
        chains: 1,
        stage_cols: 512,
        stages: 2,
    },
];

impl DetGemvKernel {
    /// Weight rows a CTA.
    pub fn rows_per_cta(&self) -> usize {
        8 * self.warps * self.chains
    }

    /// Threads a CTA.
    pub fn threads(&self) -> usize {
        32 * self.warps
    }

    /// Dynamic shared memory of a launch for `rows` rows of x: the stages' mbarriers
    /// (`DG_BAR_BYTES`), `stages` stages of `rows_per_cta + rows` rows of `stage_cols + 16` bf16
    /// (32 bytes of padding a row), and one zero row.
    pub fn shared_bytes(&self, rows: usize) -> usize {
        128 + (self.stages * (self.rows_per_cta() + rows) + 1) * (self.stage_cols + 16) * 2
    }
}

/// Error reading a kernel source from a directory ([`KernelId::source_from_dir`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot read kernel source {path}: {source}")]
pub struct SourceDirError {
    /// The file that could not be read.
    pub path: std::path::PathBuf,
    /// The I/O error reading it.
    #[source]
    pub source: std::io::Error,
}

fn inline_headers<E>(
    raw: &str,
    header: impl Fn(&str, &'static str) -> Result<String, E>,
) -> Result<String, E> {
    let mut text = raw.to_string();
    for (name, embedded) in HEADERS {
        let line = format!("#include \"{name}\"");
        if text.contains(&line) {
            text = text.replacen(&line, &header(name, embedded)?, 1);
        }
    }
    Ok(text)
}

/// One compilation unit of kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelId {
    /// Paged decode attention with split-K (flash-decoding) and GQA sharing; needs head defines.
    DecodeAttention,
    /// The same decode attention on tensor cores (bf16 cache, head_dim 64/128/256); needs head
    /// defines, a ring depth ([`DECODE_MMA_STAGES`]) and [`decode_mma_shared_bytes`] of dynamic
    /// shared memory.
    DecodeAttentionMma,
    /// Causal prefill attention over the paged cache, varlen batch; needs head defines.
    PrefillAttention,
    /// The same prefill attention on tensor cores (bf16 cache, head_dim 64/128/256); needs head
    /// defines and [`prefill_mma_shared_bytes`] of dynamic shared memory.
    PrefillAttentionMma,
    /// RMSNorm fused with the residual add, SiLU-mul, embedding and row gathers, bias, bf16 cast.
    Elementwise,
    /// RoPE (rotate_half, precomputed Llama-3.1 frequencies) and KV-cache writes.
    RopeKv,
    /// On-device argmax and the sampled draw (temperature, top-k, top-p, min-p), each bit for bit
    /// the engine's host rule.
    Sampling,
    /// Matrix-vector products for a few rows (decode at batch 1-4), bound by the weight stream;
    /// and deterministic mode's reference chain on tensor cores (`det_mma_16`).
    Gemv,
    /// FP8 (e4m3) W8A8: per-row quantization, the small-M product on tensor cores, a scalar
    /// product for any shape, and the rescale of an unscaled product (sm_89 and newer).
    Fp8,
}

/// Compile-time parameters of the attention units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadConfig {
    /// Dimension of one attention head.
    pub head_dim: usize,
    /// Query heads per KV head (grouped-query attention).
    pub group: usize,
    /// What the KV cache holds.
    pub kv: KvElement,
}

/// The element type of a KV cache, as the attention units are compiled for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvElement {
    /// bf16 values (the default).
    #[default]
    Bf16,
    /// f32 values (precise mode).
    F32,
    /// e4m3 codes with one f32 scale per token and head ([`kv_e4m3_row_bytes`]; `--kv-dtype
    /// fp8`); read by the tensor-core units only.
    E4m3,
}

/// A head shape the attention kernels cannot be compiled for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "attention kernels support head_dim in {{16, 32, 64, 128, 256}} and 1..=8 query heads per KV \
     head; got head_dim {head_dim}, group {group}"
)]
pub struct UnsupportedHeads {
    /// The requested head dimension (elements per head).
    pub head_dim: usize,
    /// The requested query heads per KV head (GQA group size).
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
    pub const ALL: [KernelId; 9] = [
        KernelId::DecodeAttention,
        KernelId::DecodeAttentionMma,
        KernelId::PrefillAttention,
        KernelId::PrefillAttentionMma,
        KernelId::Elementwise,
        KernelId::RopeKv,
        KernelId::Sampling,
        KernelId::Gemv,
        KernelId::Fp8,
    ];

    /// File name under `kernels/cuda/`.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelId::DecodeAttention => "decode_attention.cu",
            KernelId::DecodeAttentionMma => "decode_attention_mma.cu",
            KernelId::PrefillAttention => "prefill_attention.cu",
            KernelId::PrefillAttentionMma => "prefill_attention_mma.cu",
            KernelId::Elementwise => "elementwise.cu",
            KernelId::RopeKv => "rope_kv.cu",
            KernelId::Sampling => "sampling.cu",
            KernelId::Gemv => "gemv.cu",
            KernelId::Fp8 => "fp8.cu",
        }
    }

    fn raw_source(self) -> &'static str {
        match self {
            KernelId::DecodeAttention => include_str!("../cuda/decode_attention.cu"),
            KernelId::DecodeAttentionMma => include_str!("../cuda/decode_attention_mma.cu"),
            KernelId::PrefillAttention => include_str!("../cuda/prefill_attention.cu"),
            KernelId::PrefillAttentionMma => include_str!("../cuda/prefill_attention_mma.cu"),
            KernelId::Elementwise => include_str!("../cuda/elementwise.cu"),
            KernelId::RopeKv => include_str!("../cuda/rope_kv.cu"),
            KernelId::Sampling => include_str!("../cuda/sampling.cu"),
            KernelId::Gemv => include_str!("../cuda/gemv.cu"),
            KernelId::Fp8 => include_str!("../cuda/fp8.cu"),
        }
    }

    /// The full program text for NVRTC, with the shared headers inlined.
    pub fn source(self) -> String {
        let inlined: Result<String, std::convert::Infallible> =
            inline_headers(self.raw_source(), |_, embedded| Ok(embedded.to_string()));
        match inlined {
            Ok(text) => text,
            Err(never) => match never {},
        }
    }

    /// Like [`Self::source`] but reads the unit and its headers from `dir` (a checkout's
    /// `kernels/cuda`), so a kernel can be edited and re-run without rebuilding sov.
    pub fn source_from_dir(self, dir: &std::path::Path) -> Result<String, SourceDirError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| SourceDirError { path, source })
        };
        let raw = read(self.file_name())?;
        inline_headers(&raw, |name, _| read(name))
    }

    /// Whether the unit can be compiled for `heads` (always, for units without head defines).
    pub fn supports(self, heads: Option<HeadConfig>) -> bool {
        match (self, heads) {
            (KernelId::DecodeAttentionMma | KernelId::PrefillAttentionMma, Some(h)) => {
                h.kv != KvElement::F32
                    && matches!(h.head_dim, 64 | 128 | 256)
                    && (1..=8).contains(&h.group)
            }
            (KernelId::DecodeAttention | KernelId::PrefillAttention, Some(h))
                if h.kv == KvElement::E4m3 =>
            {
                false
            }
            (KernelId::DecodeAttentionMma | KernelId::PrefillAttentionMma, None) => false,
            (id, Some(h)) if id.needs_heads() => h.validate().is_ok(),
            (id, _) => !id.needs_heads(),
        }
    }

    /// `extern "C"` kernel names the unit defines.
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            KernelId::DecodeAttention => &["paged_decode_attention"],
            KernelId::DecodeAttentionMma => &[
                "paged_decode_attention_mma",
                "paged_decode_attention_mma_few",
                "paged_decode_attention_mma_warps",
            ],
            KernelId::PrefillAttention => &["prefill_attention"],
            KernelId::PrefillAttentionMma => &["prefill_attention_mma"],
            KernelId::Elementwise => &[
                "rmsnorm_residual",
                "rmsnorm_residual_bf16",
                "rmsnorm_residual_e4m3",
                "rmsnorm_residual_f32_e4m3",
                "rmsnorm_residual_dbf16",
                "rmsnorm_residual_bf16_dbf16",
                "rmsnorm_residual_e4m3_dbf16",
                "rmsnorm_residual_f32_e4m3_dbf16",
                "silu_mul",
                "silu_mul_bf16",
                "silu_mul_e4m3",
                "silu_mul_from_bf16",
                "silu_mul_bf16_from_bf16",
                "silu_mul_e4m3_from_bf16",
                "silu_mul_f32_e4m3",
                "embedding_gather",
                "gather_rows",
                "gather_rows_bf16",
                "add_bias",
                "cast_f32_bf16",
                "fill_random_bf16",
                "split_f32_bf16",
                "expand_decode_rows",
                "read_sweep",
                "lead_spin",
            ],
            KernelId::RopeKv => &[
                "rope_inplace",
                "kv_write",
                "kv_write_f32",
                "rope_kv_write",
                "rope_kv_write_f32",
                "rope_kv_write_e4m3",
            ],
            KernelId::Sampling => &["argmax_rows", "draw_tokens"],
            KernelId::Gemv => &[
                "gemv_bf16",
                "gemv_bf16_1",
                "gemv_swiglu",
                "gemv_swiglu_1",
                "det_mma_16",
                "det_gemv_8",
                "det_gemv_16",
                "det_gemv_16_w1",
                "det_gemv_32",
                "det_gemv_32_k512",
                "det_gemv_64",
            ],
            KernelId::Fp8 => &[
                "quantize_rows_f32",
                "quantize_rows_bf16",
                "quantize_rows_vec_f32",
                "quantize_rows_vec_bf16",
                "fp8_gemm_scalar",
                "fp8_rescale",
                "fp8_gemm_small_1",
                "fp8_gemm_small_2",
                "fp8_gemm_small_3",
                "fp8_gemm_small_4",
                "fp8_gemm_small_wide_1",
                "fp8_gemm_small_wide_2",
                "fp8_gemm_small_wide_3",
                "fp8_gemm_small_wide_4",
                "fp8_small_q_f32",
                "fp8_small_q_bf16",
                "fp8_swiglu_small_q_f32_f32",
                "fp8_swiglu_small_q_f32_bf16",
                "fp8_swiglu_small_q_bf16_f32",
                "fp8_swiglu_small_q_bf16_bf16",
            ],
        }
    }

    /// Whether the unit is compiled per [`HeadConfig`].
    pub fn needs_heads(self) -> bool {
        matches!(
            self,
            KernelId::DecodeAttention
                | KernelId::DecodeAttentionMma
                | KernelId::PrefillAttention
                | KernelId::PrefillAttentionMma
        )
    }

    /// NVRTC `-D` options for this unit: the head defines of the attention units, and for the
    /// tensor-core decode unit its ring depth `decode_stages` (one of [`DECODE_MMA_STAGES`]).
    /// Empty unless [`Self::needs_heads`].
    pub fn defines(self, heads: Option<HeadConfig>, decode_stages: usize) -> Vec<String> {
        match (self.needs_heads(), heads) {
            (true, Some(h)) => {
                let mut d = vec![
                    format!("-DHEAD_DIM={}", h.head_dim),
                    format!("-DGQA_GROUP={}", h.group),
                ];
                match h.kv {
                    KvElement::Bf16 => {}
                    KvElement::F32 => d.push("-DKV_F32".to_string()),
                    KvElement::E4m3 => d.push("-DKV_FP8".to_string()),
                }
                if self == KernelId::DecodeAttentionMma {
                    d.push(format!("-DSTAGES={decode_stages}"));
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
                !src.contains("#include"),
                "{} still includes a header",
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
    fn sources_read_from_the_checkout_equal_the_embedded_ones() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        for id in KernelId::ALL {
            assert_eq!(
                id.source_from_dir(&dir).ok(),
                Some(id.source()),
                "{}",
                id.file_name()
            );
        }
        let err = KernelId::Gemv.source_from_dir(std::path::Path::new("/nonexistent"));
        assert!(err.is_err_and(|e| e.to_string().contains("gemv.cu")));
    }

    #[test]
    fn the_tensor_core_units_take_bf16_caches_of_wide_heads_only() {
        let h = |head_dim, group, kv_f32: bool| {
            Some(HeadConfig {
                head_dim,
                group,
                kv: if kv_f32 {
                    KvElement::F32
                } else {
                    KvElement::Bf16
                },
            })
        };
        let e4m3 = |head_dim, group| {
            Some(HeadConfig {
                head_dim,
                group,
                kv: KvElement::E4m3,
            })
        };
        assert!(KernelId::DecodeAttentionMma.supports(e4m3(128, 4)));
        assert!(KernelId::PrefillAttentionMma.supports(e4m3(64, 3)));
        assert!(!KernelId::DecodeAttention.supports(e4m3(128, 4)));
        assert!(!KernelId::PrefillAttention.supports(e4m3(128, 4)));
        assert!(!KernelId::DecodeAttentionMma.supports(e4m3(32, 4)));
        assert!(
            KernelId::PrefillAttentionMma
                .defines(e4m3(128, 4), 2)
                .contains(&"-DKV_FP8".to_string())
        );
        assert!(KernelId::DecodeAttentionMma.supports(h(128, 4, false)));
        assert!(KernelId::DecodeAttentionMma.supports(h(64, 3, false)));
        assert!(!KernelId::DecodeAttentionMma.supports(h(128, 4, true)));
        assert!(!KernelId::DecodeAttentionMma.supports(h(32, 4, false)));
        assert!(KernelId::PrefillAttentionMma.supports(h(256, 1, false)));
        assert!(!KernelId::PrefillAttentionMma.supports(h(128, 4, true)));
        assert!(!KernelId::PrefillAttentionMma.supports(h(16, 2, false)));
        assert!(!KernelId::PrefillAttentionMma.supports(None));
        assert!(KernelId::DecodeAttention.supports(h(32, 4, true)));
        assert!(!KernelId::DecodeAttention.supports(None));
        assert!(KernelId::Gemv.supports(None));
        for stages in DECODE_MMA_STAGES {
            let d = KernelId::DecodeAttentionMma.defines(h(128, 4, false), stages);
            assert_eq!(d.last(), Some(&format!("-DSTAGES={stages}")));
            for kv in [KvElement::Bf16, KvElement::E4m3] {
                assert!(
                    decode_mma_shared_bytes(128, stages, kv) >= 4 * 8 * 128 * 4,
                    "w_acc fits over the ring"
                );
            }
        }
        assert!(DECODE_MMA_STAGES.contains(&DEFAULT_DECODE_MMA_STAGES));
        // Only the tensor-core unit takes the ring depth.
        assert_eq!(
            KernelId::DecodeAttention.defines(h(128, 4, false), 3),
            KernelId::DecodeAttention.defines(h(128, 4, false), 2)
        );
    }

    #[test]
    fn e4m3_rows_pad_their_scales_to_16_bytes() {
        assert_eq!(kv_e4m3_row_bytes(8, 128), 1024 + 32);
        assert_eq!(kv_e4m3_row_bytes(3, 64), 192 + 16);
        assert_eq!(kv_e4m3_row_bytes(1, 64), 64 + 16);
        assert_eq!(kv_e4m3_row_bytes(5, 256), 1280 + 32);
        for (h, d) in [(1, 64), (2, 128), (3, 64), (8, 128), (7, 256)] {
            assert_eq!(kv_e4m3_row_bytes(h, d) % 16, 0);
            assert!(kv_e4m3_row_bytes(h, d) >= h * d + 4 * h);
        }
    }

    #[test]
    fn e4m3_tail_ranges_cover_each_slot_once_and_stay_inside_its_groups() {
        let (h, d) = (3, 64);
        let row = kv_e4m3_row_bytes(h, d);
        for tokens in [0, 1, 15, 16, 17, 40] {
            let ranges = kv_e4m3_tail_ranges(h, d, tokens);
            let total: usize = ranges.iter().map(|r| r.len()).sum();
            assert_eq!(total, tokens * (h * d + 4 * h), "{tokens} tokens");
            // A slot's codes and scales land where common.cuh's kv8_codes_at / kv8_scale_at put them.
            let mut owned = vec![false; tokens.div_ceil(KV_E4M3_GROUP) * KV_E4M3_GROUP * row];
            for r in &ranges {
                for b in r.clone() {
                    assert!(!owned[b], "byte {b} twice");
                    owned[b] = true;
                }
            }
            for slot in 0..tokens {
                let (g, i) = (slot / KV_E4M3_GROUP, slot % KV_E4M3_GROUP);
                for kvh in 0..h {
                    let codes = g * KV_E4M3_GROUP * row + (kvh * KV_E4M3_GROUP + i) * d;
                    assert!(owned[codes..codes + d].iter().all(|&o| o));
                    let scale = g * KV_E4M3_GROUP * row
                        + h * KV_E4M3_GROUP * d
                        + (kvh * KV_E4M3_GROUP + i) * 4;
                    assert!(owned[scale..scale + 4].iter().all(|&o| o));
                }
            }
        }
    }

    #[test]
    fn head_shapes_are_validated() {
        assert!(
            HeadConfig {
                head_dim: 128,
                group: 4,
                kv: KvElement::Bf16
            }
            .validate()
            .is_ok()
        );
        assert!(
            HeadConfig {
                head_dim: 64,
                group: 3,
                kv: KvElement::F32
            }
            .validate()
            .is_ok()
        );
        assert!(
            HeadConfig {
                head_dim: 96,
                group: 4,
                kv: KvElement::Bf16
            }
            .validate()
            .is_err()
        );
        assert!(
            HeadConfig {
                head_dim: 128,
                group: 9,
                kv: KvElement::Bf16
            }
            .validate()
            .is_err()
        );
        let d = KernelId::DecodeAttention.defines(
            Some(HeadConfig {
                head_dim: 64,
                group: 3,
                kv: KvElement::Bf16,
            }),
            DEFAULT_DECODE_MMA_STAGES,
        );
        assert_eq!(
            d,
            vec!["-DHEAD_DIM=64".to_string(), "-DGQA_GROUP=3".to_string()]
        );
        let d = KernelId::PrefillAttention.defines(
            Some(HeadConfig {
                head_dim: 64,
                group: 3,
                kv: KvElement::F32,
            }),
            DEFAULT_DECODE_MMA_STAGES,
        );
        assert_eq!(d.last().map(String::as_str), Some("-DKV_F32"));
        assert!(
            KernelId::Elementwise
                .defines(None, DEFAULT_DECODE_MMA_STAGES)
                .is_empty()
        );
    }
}
