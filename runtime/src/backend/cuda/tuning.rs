//! The CUDA backend's tuning: every performance choice a user or a benchmark may change, in one
//! typed struct whose defaults are the values measured fastest on the H200.
//!
//! Design: library code never reads the environment. A program builds a [`CudaTuning`] once, at its
//! edge -- [`CudaTuning::default`], or [`CudaTuning::from_vars`] over its environment (the `SOV_*`
//! variable named on each field) -- and opens the device with
//! [`super::CudaBackend::with_tuning`]. The parser is a pure function of a lookup, so it is tested
//! without touching the process environment, and a malformed value is an error naming its
//! variable, never silently replaced by the default. [`KernelBuild`] is the part that changes how
//! the kernel units are compiled and loaded; the process-wide module cache keys on its values.
//!
//! Settled A/B switches are not here: the measured winner is the only path (see
//! [`RETIRED_VARS`] for the variables that used to select the other one).

use std::path::PathBuf;

/// Tuning of a [`super::CudaBackend`]. `Default` is the measured configuration; fields are public
/// so a library user can change one and keep the rest (`CudaTuning { gemv_max_rows: 0,
/// ..Default::default() }`). [`super::CudaBackend::with_tuning`] checks the values
/// ([`CudaTuning::validate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaTuning {
    /// CTAs per streaming multiprocessor that a split-K decode-attention launch aims to have in
    /// flight (`SOV_DECODE_CTAS_PER_SM`, at least 1). Default 2: measured best at batch 1 and 64 on
    /// the H200; fewer splits leave SMs idle at batch 1, more add merge work.
    pub decode_ctas_per_sm: usize,
    /// Shortest split of a decode-attention launch where the context allows, in tokens
    /// (`SOV_DECODE_MIN_SPLIT_TOKENS`). Default 64, one tile: a short context then takes one split
    /// and skips the merge of partial results.
    pub decode_min_split_tokens: usize,
    /// Longest split of a decode-attention launch, in tokens (`SOV_DECODE_SPLIT_TOKENS`, at least
    /// 1); `None`, the default, is unlimited. On the H200 one split per sequence at batch >= 64
    /// measured fastest: each short split costs a pipeline fill and a merge.
    pub decode_max_split_tokens: Option<usize>,
    /// Decode attention on tensor cores (`decode_attention_mma.cu`) where the head shape allows
    /// (`SOV_DECODE_MMA`, a switch). Default on: 94% of copy bandwidth at (64, 2048) against the
    /// CUDA-core kernel's 62%. Off keeps the CUDA-core kernel everywhere, for comparisons and for
    /// checking that kernel on shapes the tensor-core one would take; it is the only kernel for f32
    /// caches and head_dim 16/32 either way.
    pub decode_tensor_cores: bool,
    /// Most rows of a decode step whose RoPE and new-token K/V write run inside the tensor-core
    /// attention (`rope_kv_attention`, `SOV_DECODE_FUSED_ROPE_ROWS`, a whole number; 0 = never);
    /// larger steps launch `rope_kv_write` and then the attention, unless they run as warp items
    /// (`decode_warp_fused_rope`). Same bits either way. The
    /// fused write puts the newest token's rotation and quantization on one warp of every CTA,
    /// which at wide grids costs more than the launch it saves (`kernels/docs/fp8.md`).
    pub decode_fused_rope_max_rows: usize,
    /// (sequence, kv head) items per SM from which a decode launch on tensor cores gives each item
    /// a warp of its own instead of a CTA of four warps (`paged_decode_attention_mma_warps`,
    /// `SOV_DECODE_WARP_ITEMS`, a whole number; 0 = never). Only where every context fits one
    /// split, the RoPE is not fused and the mode is not deterministic: a warp then streams a whole
    /// context for one start-up and needs no merge of warp states. Default 24: on an H100
    /// (`bench_decode_attention`, Llama-3-8B heads) warp items were faster at 31 and 61 items an SM
    /// with either cache (e4m3 1.18-1.32x, bf16 1.02-1.04x) and mixed at 15.5 (256 x 384 e4m3
    /// 1.10x, bf16 0.98x; 256 x 1024 0.92x / 0.95x), see `kernels/docs/fp8-kv-cache.md` (FP8 KV
    /// cache).
    pub decode_warp_items_per_sm: usize,
    /// Whether a decode launch of warp items (see `decode_warp_items_per_sm`) runs the RoPE and
    /// the new token's K/V write itself (`SOV_DECODE_WARP_FUSED_ROPE`, a switch), whatever
    /// `decode_fused_rope_max_rows` says: each warp rotates its own query heads and writes the
    /// newest token of its (sequence, kv head), the only one that reads it, so no barrier is
    /// needed and the step launches no `rope_kv_write`. Same bits either way.
    pub decode_warp_fused_rope: bool,
    /// Prefill attention (prompt chunks, and the decode rows of a mixed step) on tensor cores
    /// (`prefill_attention_mma.cu`) where the head shape allows (`SOV_PREFILL_MMA`, a switch).
    /// Default on. Off keeps the CUDA-core kernel (`prefill_attention.cu`), which took 14.5 ms of
    /// a 61.7 ms step of 2048 prompt tokens at the Llama-3-8B shape on the H200 (Nsight Compute);
    /// that kernel is also the only one for f32 caches and head_dim 16/32.
    pub prefill_tensor_cores: bool,
    /// Products of at most this many rows use `gemv.cu` instead of cuBLAS in fast mode (`SOV_GEMV`;
    /// 0 = cuBLAS always; values above the kernel's 4 act as 4). Default 1: at one row the GEMV
    /// beat cuBLAS on every Llama-3-8B decode product on the H200 (`bench_decode_matmuls`); at four
    /// rows it measured 0.4-0.7x cuBLAS.
    pub gemv_max_rows: usize,
    /// Warps per weight row in the GEMV: 1, 2, 4 or 8 (`SOV_GEMV_SPLIT`). `None`, the default,
    /// picks the most that keep the grid in one wave (2 for Llama-3-8B's o and down products, 1
    /// for the others); forcing 1 cost 0.06 ms a batch-1 step.
    pub gemv_split: Option<usize>,
    /// Batch-invariant mode (`sov --deterministic`; not an environment variable of this struct, the
    /// command line sets it): every row's result is independent of the rows it is batched with, and
    /// a prefill computes the same K/V and attention as decode steps (see
    /// `kernels/docs/deterministic.md`). Products go through one pinned cuBLASLt algorithm per
    /// weight shape (no GEMV, bf16 inputs at every row count), decode attention cuts contexts into
    /// splits of [`Self::deterministic_split_tokens`], and prefill attention runs the decode kernel
    /// once per query token. Default off.
    pub deterministic: bool,
    /// Split length of decode attention in deterministic mode, in tokens
    /// (`SOV_DETERMINISTIC_SPLIT_TOKENS`, a multiple of 64). Default 256: on the H200 (Llama-3-8B
    /// shape, 128 in / 256 out) 256-token splits gave 15740 tok/s at batch 256 against 15155 with
    /// 128 and 12998 with 64, and the same at batch 1 (217.0 / 217.1 / 218.5;
    /// `kernels/bench/logs/det-gemv-2026-12-03T0942.log`). It changes the bits of attention, so
    /// it is part of the precision the heads record ([`Self::precision_name`]).
    pub deterministic_split_tokens: usize,
    /// Rows at which the pinned cuBLASLt algorithm of each weight shape is chosen in deterministic
    /// mode (`SOV_DETERMINISTIC_GEMM_ROWS`, at least 1): the heuristic's pick for a product of this
    /// many rows is then used for every row count. Default 128.
    pub deterministic_gemm_rows: usize,
    /// How much faster than cuBLASLt, in percent of cuBLASLt's timed median, one of sov's small-row
    /// kernels (`det_gemv_*`) must be to serve a deterministic product of at most 16 rows
    /// (`SOV_DETERMINISTIC_KERNEL_MARGIN`, -100..=100). A negative margin takes a kernel that is up
    /// to that much slower as timed. Every choice gives the same bits. Default 0 (3 until the
    /// timing ran candidates behind a stand-in for the kernel before them,
    /// [`Self::deterministic_lead_us`]): on the H200, timed alone, margins of -10 and -100 moved
    /// qkv, gate/up and the lm head to kernels and lost 3.7% and 5.5% at batch 1, and -100 27% at
    /// batch 16; behind the stand-in only qkv at one row moved, and gained
    /// (`kernels/docs/deterministic.md`, deterministic mode).
    pub deterministic_kernel_margin: i32,
    /// Microseconds of the stand-in kernel (`lead_spin`) that runs before each timed launch
    /// when deterministic mode times a product's candidates (`SOV_DETERMINISTIC_LEAD_US`,
    /// 0..=100; 0: none, each candidate timed alone). In a decode step a kernel launched with
    /// programmatic dependent launch issues its first weight loads under the kernel before it
    /// (an RMSNorm of about 3 us at batch 1), which cuBLASLt cannot; the stand-in lets the
    /// timing see that (`det_gemv.rs`). Default 3: on the H200 (Llama-3-8B shape) batch 1 went
    /// from 209.6 to 222.0 tok/s against 0 (qkv moved to `det_gemv_32_k512`).
    pub deterministic_lead_us: u32,
    /// Parts along K of deterministic mode's products whose weight has at least twice as many
    /// columns as rows (`SOV_DETERMINISTIC_K_SPLIT`, 1 or 2; Llama's down projection): 2 reduces
    /// each half of K in its own chain and adds them in a fixed order, at every row count
    /// (`det_split.rs`), so that products of few rows run on twice the CTAs. Default 2: on the H200
    /// (Llama-3-8B shape) batch 16 gained 6.7-10.4% over 1, batch 64, 256 and 1000 requests lost
    /// 1.1-2.4% (`kernels/docs/deterministic.md`, deterministic mode). It changes the bits of those
    /// products, so it is part of the precision the heads record ([`Self::precision_name`]); 1 is
    /// the order of every run before it was named.
    pub deterministic_k_split: usize,
    /// Weight and activation format of the linear layers (`sov --quantization`; not an
    /// environment variable of this struct, the command line sets it). Default
    /// [`Quantization::None`]: bf16 weights.
    pub quantization: Quantization,
    /// Under [`Quantization::Fp8W8A8`], the layers at each end of the stack whose products keep
    /// bf16 weights and inputs (`sov --fp8-edge-layers`; not an environment variable of this
    /// struct): 1 keeps the first and the last layer. Default 1: on the default model
    /// (SmolLM2-135M) FP8 in every layer raised the perplexity of
    /// `runtime/bench/texts/plain-english.txt` by 3.6% over bf16 on the H200, most of it in
    /// those two layers' SwiGLU inputs (`runtime/BENCHMARKS.md`). An FP8 checkpoint's weights
    /// stay as the checkpoint has them. It changes the bits of those layers, so it is part of
    /// the precision the heads record ([`Self::precision_name`]).
    pub fp8_bf16_edge_layers: usize,
    /// FP8 products of at most this many rows run on `fp8.cu`'s small-M tensor-core kernel, more
    /// rows through cuBLASLt (`SOV_FP8_SMALL_ROWS`, 0..=32). Default 16: on the H200 the small-M
    /// kernel beat cuBLASLt up to 16 rows on every Llama-3-8B product and lost from 32 on gate/up,
    /// o and down (`kernels/docs/fp8.md`).
    pub fp8_small_max_rows: usize,
    /// Small-M FP8 products of fewer than this many CTAs (16 weight rows each) run the kernel's
    /// `_wide` form, 16 warps a CTA instead of 8 (`SOV_FP8_SMALL_WIDE_CTAS`, 0 = never): at
    /// Llama-3-8B's qkv, o and down (256-384 CTAs) the 8-warp grid keeps 15 warps an SM; the
    /// wide form made batch 1 0.7% faster on an H100 (`kernels/docs/fp8.md`, FP8). The two forms
    /// add their partial sums in different groups, so their bits differ (each is the same at
    /// every row count); the fused kernels ([`Self::fp8_fused_max_rows`]) give the 8-warp
    /// form's bits.
    pub fp8_small_wide_ctas: usize,
    /// FP8 products of at most this many rows (and at most 32 KiB of quantized input) quantize
    /// their input inside the small-M kernel instead of in a `quantize_rows` launch before it,
    /// and the gate/up product applies SwiGLU there too (`fp8_small_q_*`, `fp8_fused.rs`;
    /// `SOV_FP8_FUSED_ROWS`, 0..=8, 0 = off). The outputs are the bits of the 8-warp small-M
    /// form ([`Self::fp8_small_wide_ctas`] says where the products take the other).
    /// Default 0: every CTA of a fused product re-reads and quantizes the input, so at one row
    /// the producers' quantized rows ([`Self::fp8_quantized_inputs`]) and the plain small-M
    /// kernel run the step faster (`kernels/docs/fp8.md`, FP8).
    pub fp8_fused_max_rows: usize,
    /// Which producers of FP8 product inputs write them as e4m3 rows, so the product runs no
    /// quantization launch of its own (`SOV_FP8_QUANTIZED_INPUTS`: `off`, `swiglu`, `all`;
    /// `fp8_inputs.rs`): products that do not quantize their input themselves (more rows than
    /// [`Self::fp8_fused_max_rows`]). The producers quantize what they would have stored (bf16,
    /// or f32 for the few rows whose products take f32), with the products' arithmetic, so the
    /// products see the same codes and scales either way.
    /// Default [`Fp8QuantizedInputs::All`]: on the H200 both quantizing kernels cost less than
    /// the quantization launches they replace (`kernels/docs/fp8.md`, FP8).
    pub fp8_quantized_inputs: Fp8QuantizedInputs,
    /// Whether the FP8 gate/up product that cuBLASLt multiplies (more rows than
    /// [`Self::fp8_small_max_rows`]) writes its `[n, 2f]` output in bf16 instead of f32, for the
    /// SiLU-mul to read (`SOV_FP8_GATE_UP_BF16`, a switch; `fp8.rs`): half the bytes written and
    /// read again, at the cost of rounding gate and up to bf16 before the SwiGLU, as a bf16
    /// model does. Needs cuBLASLt's outer-vector scales (else f32 stays).
    pub fp8_gate_up_bf16: bool,
    /// Whether the FP8 o and down products that cuBLASLt multiplies (more rows than
    /// [`Self::fp8_small_max_rows`]) write their output, the residual add's delta, in bf16
    /// instead of f32 (`SOV_FP8_DELTA_BF16`, a switch; `fp8.rs`,
    /// [`crate::backend::Backend::matmul_residual_delta`]): cuBLASLt's bf16 output runs 5-11%
    /// faster than its f32 one on an H100 (torch's `_scaled_mm`, `kernels/docs/fp8.md`), and the
    /// add + RMSNorm reads half the delta's bytes, at the cost of rounding each delta to bf16
    /// before the add, as a bf16 model does. Needs cuBLASLt's outer-vector scales (else f32
    /// stays). Default on since stop 57 (H100 80GB, 1000 requests, FP8 + e4m3 cache, one call:
    /// 30365.52 / 30261.55 tok/s against 29894.61 / 29890.72 with it off, +1.4%).
    pub fp8_delta_bf16: bool,
    /// The KV cache in e4m3 with one f32 scale per token and head (`sov --kv-dtype fp8`; not an
    /// environment variable of this struct, the command line sets it), half the bytes of bf16
    /// per token (`kv_e4m3.rs`). Default off: a bf16 cache (f32 in precise mode, which this
    /// does not apply to). Needs compute capability 8.9 and tensor-core attention. It changes
    /// the bits of attention, so it is part of the precision the heads record
    /// ([`Self::precision_name`]).
    pub kv_e4m3: bool,
    /// How the kernel units are compiled and loaded.
    pub kernels: KernelBuild,
}

/// Format of the linear layers' weights and inputs (the four products of every layer; the
/// embedding and the lm head stay bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Quantization {
    /// bf16 weights, bf16 (or f32) inputs.
    #[default]
    None,
    /// FP8 W8A8: e4m3 weights with one f32 scale per output channel, quantized at load from the
    /// source weights; inputs quantized per token (row absmax / 448) before each product;
    /// e4m3 x e4m3 products with f32 accumulation (see `fp8.cu`). Needs compute capability 8.9.
    Fp8W8A8,
}

/// The tuning that is compiled into the kernel units or set on them when they load. Two backends
/// with equal values share compiled units; different values compile their own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelBuild {
    /// Ring depth (K/V chunks per warp, `STAGES`) of the tensor-core decode kernel: 2, 3 or 4
    /// (`SOV_DECODE_STAGES`). Default 2: deeper rings did not move (1, 4096) past 42% of copy and
    /// cost shared memory; at head_dim 256 a depth of 4 needs more than an SM has (the unit then
    /// fails to load with the driver's error).
    pub decode_stages: usize,
    /// Shared-memory carveouts of the tensor-core decode kernel's three entry points
    /// (`SOV_DECODE_CARVEOUT=few,wide[,warps]`, percent, `-1` = the driver's choice).
    pub decode_carveout: DecodeCarveout,
    /// Extra NVRTC options of the CUDA-core decode-attention unit, e.g. `-DREG_LOADS -DPREFETCH`
    /// (`SOV_DECODE_ATTENTION_DEFINES`, split at whitespace; see `decode_attention.cu`). Default
    /// none.
    pub decode_attention_defines: Vec<String>,
    /// Extra NVRTC options of the GEMV unit, e.g. `-DUNROLL=4` (`SOV_GEMV_DEFINES`). Default none.
    pub gemv_defines: Vec<String>,
    /// A checkout's `kernels/cuda` to compile the `.cu` files from instead of the sources built
    /// into sov (`SOV_KERNEL_SOURCE_DIR`), so a kernel can be edited and re-run on the GPU machine
    /// without a Rust build. Default `None`: the embedded sources.
    pub source_dir: Option<PathBuf>,
}

/// Shared-memory carveout (percent of the SM's maximum; `None` leaves the driver's choice) of the
/// tensor-core decode kernel's entry points: `few` for `paged_decode_attention_mma_few` (grids of
/// at most one CTA per SM), `wide` for `paged_decode_attention_mma`, `warps` for
/// `paged_decode_attention_mma_warps` (warp items; `SOV_DECODE_CARVEOUT=few,wide` sets it to
/// `wide`). Defaults 40, 72 and 72; the first two measured
/// on the H200: without a carveout the driver gave the kernel so much shared memory that at batch 1
/// the GEMVs overlapping it lost the L1 they read x through (4.59 vs 4.25 ms a Llama-3-8B step),
/// and at batch 64 it ran at 74% of copy bandwidth instead of 94%; 40 was best at batch 1
/// (4.17-4.20 ms a step) and 72 for wide grids (64 x 2048: 93.7% of copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeCarveout {
    /// Percent (0..=100) for grids of at most one CTA per SM.
    pub few: Option<u8>,
    /// Percent (0..=100) for wider grids.
    pub wide: Option<u8>,
    /// Percent (0..=100) for launches of warp items.
    pub warps: Option<u8>,
}

impl Default for DecodeCarveout {
    fn default() -> Self {
        Self {
            few: Some(40),
            wide: Some(72),
            warps: Some(72),
        }
    }
}

impl DecodeCarveout {
    /// The carveout of kernel function `name`, if it is one of the three entry points and has one.
    pub(super) fn of(self, name: &str) -> Option<i32> {
        match name {
            "paged_decode_attention_mma_few" => self.few.map(i32::from),
            "paged_decode_attention_mma" => self.wide.map(i32::from),
            "paged_decode_attention_mma_warps" => self.warps.map(i32::from),
            _ => None,
        }
    }
}

impl Default for KernelBuild {
    fn default() -> Self {
        Self {
            decode_stages: sov_kernels::DEFAULT_DECODE_MMA_STAGES,
            decode_carveout: DecodeCarveout::default(),
            decode_attention_defines: Vec::new(),
            gemv_defines: Vec::new(),
            source_dir: None,
        }
    }
}

impl Default for CudaTuning {
    fn default() -> Self {
        Self {
            decode_ctas_per_sm: 2,
            decode_min_split_tokens: 64,
            decode_max_split_tokens: None,
            decode_tensor_cores: true,
            decode_fused_rope_max_rows: DEFAULT_FUSED_ROPE_ROWS,
            decode_warp_items_per_sm: DEFAULT_WARP_ITEMS_PER_SM,
            decode_warp_fused_rope: true,
            prefill_tensor_cores: true,
            gemv_max_rows: 1,
            gemv_split: None,
            deterministic: false,
            deterministic_split_tokens: DEFAULT_DETERMINISTIC_SPLIT_TOKENS,
            deterministic_gemm_rows: 128,
            deterministic_kernel_margin: DEFAULT_DETERMINISTIC_KERNEL_MARGIN,
            deterministic_lead_us: DEFAULT_DETERMINISTIC_LEAD_US,
            deterministic_k_split: DEFAULT_DETERMINISTIC_K_SPLIT,
            quantization: Quantization::None,
            fp8_bf16_edge_layers: 1,
            fp8_small_max_rows: 16,
            fp8_small_wide_ctas: DEFAULT_FP8_SMALL_WIDE_CTAS,
            fp8_fused_max_rows: DEFAULT_FP8_FUSED_ROWS,
            fp8_quantized_inputs: Fp8QuantizedInputs::All,
            fp8_gate_up_bf16: true,
            fp8_delta_bf16: true,
            kv_e4m3: false,
            kernels: KernelBuild::default(),
        }
    }
}

/// Which producers write FP8 product inputs quantized ([`CudaTuning::fp8_quantized_inputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8QuantizedInputs {
    /// None: every FP8 product of more rows quantizes its input in a launch of its own.
    Off,
    /// The SwiGLU kernel (the down product's input).
    SwiGlu,
    /// The SwiGLU and RMSNorm kernels (the down, qkv and gate/up inputs).
    All,
}

impl Fp8QuantizedInputs {
    /// Whether `producer` writes quantized rows under this setting.
    pub fn covers(self, producer: crate::backend::InputProducer) -> bool {
        use crate::backend::InputProducer as P;
        matches!((self, producer), (Self::All, _) | (Self::SwiGlu, P::SwiGlu))
    }
}

/// A tuning value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not valid: expected {expected}")]
pub struct TuningError {
    /// The environment variable (or, for a value set in code, the variable of that field).
    pub var: &'static str,
    /// The value as given.
    pub value: String,
    /// What the setting accepts.
    pub expected: &'static str,
}

/// Variables of A/B switches that were settled and removed, each with what sov now always does and
/// the measurement that settled it (batch-1 Llama-3-8B op loop on the H200, ms a step, the
/// default against the switch off, each pair in one device run). [`CudaTuning::from_vars`]
/// ignores them; [`retired_vars_set`] finds them so a program can warn.
pub const RETIRED_VARS: [(&str, &str); 5] = [
    (
        "SOV_BF16_INPUTS",
        "products of more than one row always take bf16 inputs from their producer \
         (4.19/5.09/5.90/11.60 vs 4.20/5.20/6.13/11.99 ms at batch 1/16/64/256)",
    ),
    (
        "SOV_FUSED_ROPE",
        "decode steps always fuse RoPE and the KV write into the tensor-core attention where it \
         applies (4.11 vs 4.13-4.14 ms)",
    ),
    (
        "SOV_GEMV_SINGLE",
        "one-row products always use the one-row GEMV kernels (4.26 vs 4.57 ms)",
    ),
    (
        "SOV_GEMV_SWIGLU",
        "the one-row gate/up product always fuses the SwiGLU (4.26 vs 4.24 ms: neutral, one \
         kernel fewer)",
    ),
    (
        "SOV_PDL",
        "kernels always use programmatic dependent launch where the device supports it (4.26 vs \
         4.37 ms)",
    ),
];

/// The retired variables ([`RETIRED_VARS`]) that `get` finds set, with what sov does instead.
pub fn retired_vars_set(get: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, &'static str)> {
    RETIRED_VARS
        .into_iter()
        .filter(|(var, _)| get(var).is_some())
        .collect()
}

/// `get(var)` trimmed, or `None` when unset or blank.
fn lookup(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Option<String> {
    get(var)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn invalid(var: &'static str, value: &str, expected: &'static str) -> TuningError {
    TuningError {
        var,
        value: value.to_string(),
        expected,
    }
}

/// An unsigned integer of at least `min`.
fn parse_count(var: &'static str, value: &str, min: usize) -> Result<usize, TuningError> {
    let expected = if min == 0 {
        "a whole number"
    } else {
        "a whole number of at least 1"
    };
    match value.parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(invalid(var, value, expected)),
    }
}

/// `0`/`false`/`off`/`no` or `1`/`true`/`on`/`yes`, any case.
fn parse_switch(var: &'static str, value: &str) -> Result<bool, TuningError> {
    match value.to_ascii_lowercase().as_str() {
        "0" | "false" | "off" | "no" => Ok(false),
        "1" | "true" | "on" | "yes" => Ok(true),
        _ => Err(invalid(var, value, "0, 1, false, true, off, on, no or yes")),
    }
}

const CTAS_VAR: &str = "SOV_DECODE_CTAS_PER_SM";
const MIN_SPLIT_VAR: &str = "SOV_DECODE_MIN_SPLIT_TOKENS";
const MAX_SPLIT_VAR: &str = "SOV_DECODE_SPLIT_TOKENS";
const MMA_VAR: &str = "SOV_DECODE_MMA";
const PREFILL_MMA_VAR: &str = "SOV_PREFILL_MMA";
const FUSED_ROPE_VAR: &str = "SOV_DECODE_FUSED_ROPE_ROWS";
const WARP_ITEMS_VAR: &str = "SOV_DECODE_WARP_ITEMS";
const WARP_ROPE_VAR: &str = "SOV_DECODE_WARP_FUSED_ROPE";
/// [`CudaTuning::decode_warp_items_per_sm`]'s default.
const DEFAULT_WARP_ITEMS_PER_SM: usize = 24;
/// [`CudaTuning::decode_fused_rope_max_rows`]'s default.
const DEFAULT_FUSED_ROPE_ROWS: usize = 64;
const GEMV_VAR: &str = "SOV_GEMV";
const GEMV_SPLIT_VAR: &str = "SOV_GEMV_SPLIT";
const STAGES_VAR: &str = "SOV_DECODE_STAGES";
const CARVEOUT_VAR: &str = "SOV_DECODE_CARVEOUT";
const ATTENTION_DEFINES_VAR: &str = "SOV_DECODE_ATTENTION_DEFINES";
const GEMV_DEFINES_VAR: &str = "SOV_GEMV_DEFINES";
const SOURCE_DIR_VAR: &str = "SOV_KERNEL_SOURCE_DIR";
const DET_SPLIT_VAR: &str = "SOV_DETERMINISTIC_SPLIT_TOKENS";
/// [`CudaTuning::deterministic_split_tokens`]'s default.
const DEFAULT_DETERMINISTIC_SPLIT_TOKENS: usize = 256;
/// The split length of every deterministic run whose heads say only `-deterministic`.
const UNNAMED_DETERMINISTIC_SPLIT_TOKENS: usize = 128;
const DET_ROWS_VAR: &str = "SOV_DETERMINISTIC_GEMM_ROWS";
const DET_MARGIN_VAR: &str = "SOV_DETERMINISTIC_KERNEL_MARGIN";
const DET_MARGIN_EXPECTED: &str = "a whole percent -100..=100";
/// [`CudaTuning::deterministic_kernel_margin`]'s default.
const DEFAULT_DETERMINISTIC_KERNEL_MARGIN: i32 = 0;
const DET_LEAD_VAR: &str = "SOV_DETERMINISTIC_LEAD_US";
const DET_LEAD_EXPECTED: &str = "a whole number of microseconds 0..=100";
/// [`CudaTuning::deterministic_lead_us`]'s default.
const DEFAULT_DETERMINISTIC_LEAD_US: u32 = 3;
const DET_SPLIT_EXPECTED: &str = "a positive multiple of 64";
const DET_K_SPLIT_VAR: &str = "SOV_DETERMINISTIC_K_SPLIT";
const DET_K_SPLIT_EXPECTED: &str = "1 or 2";
/// [`CudaTuning::deterministic_k_split`]'s default.
const DEFAULT_DETERMINISTIC_K_SPLIT: usize = 2;
const FP8_SMALL_VAR: &str = "SOV_FP8_SMALL_ROWS";
/// What [`CudaTuning::precision_name`] appends for an e4m3 KV cache.
const KV_E4M3_SUFFIX: &str = "-kvfp8";
const FP8_SMALL_EXPECTED: &str = "a whole number 0..=32";
const FP8_WIDE_VAR: &str = "SOV_FP8_SMALL_WIDE_CTAS";
const FP8_WIDE_EXPECTED: &str = "a whole number of CTAs (0 = never)";
/// [`CudaTuning::fp8_small_wide_ctas`]'s default: Llama-3-8B's qkv, o and down products (384 and
/// 256 CTAs) take the wide form, gate/up (1792) the 8-warp one.
const DEFAULT_FP8_SMALL_WIDE_CTAS: usize = 512;
const FP8_FUSED_VAR: &str = "SOV_FP8_FUSED_ROWS";
const FP8_FUSED_EXPECTED: &str = "a whole number 0..=8";
/// [`CudaTuning::fp8_fused_max_rows`]'s default.
const DEFAULT_FP8_FUSED_ROWS: usize = 0;
const FP8_INPUTS_VAR: &str = "SOV_FP8_QUANTIZED_INPUTS";
const FP8_INPUTS_EXPECTED: &str = "off, swiglu or all";
const FP8_GATE_UP_VAR: &str = "SOV_FP8_GATE_UP_BF16";
const FP8_DELTA_VAR: &str = "SOV_FP8_DELTA_BF16";
/// Most rows the `fp8_small_q_*` kernels take (one tile of 8).
pub(super) const FP8_FUSED_LIMIT: usize = 8;

/// Most rows `fp8.cu`'s small-M kernel takes (4 tiles of 8).
pub(super) const FP8_SMALL_LIMIT: usize = 32;

const GEMV_SPLITS: [usize; 4] = [1, 2, 4, 8];
const GEMV_SPLIT_EXPECTED: &str = "1, 2, 4 or 8";
const STAGES_EXPECTED: &str = "2, 3 or 4";
const CARVEOUT_EXPECTED: &str =
    "percents `few,wide` or `few,wide,warps`, each 0..=100 or -1 (the driver's choice)";

impl CudaTuning {
    /// Every tuning variable, for documentation and for programs that list what they read.
    pub const VARS: [&str; 26] = [
        CTAS_VAR,
        MIN_SPLIT_VAR,
        MAX_SPLIT_VAR,
        MMA_VAR,
        FUSED_ROPE_VAR,
        WARP_ITEMS_VAR,
        WARP_ROPE_VAR,
        PREFILL_MMA_VAR,
        GEMV_VAR,
        GEMV_SPLIT_VAR,
        STAGES_VAR,
        CARVEOUT_VAR,
        ATTENTION_DEFINES_VAR,
        GEMV_DEFINES_VAR,
        SOURCE_DIR_VAR,
        DET_SPLIT_VAR,
        DET_ROWS_VAR,
        DET_MARGIN_VAR,
        DET_LEAD_VAR,
        DET_K_SPLIT_VAR,
        FP8_SMALL_VAR,
        FP8_WIDE_VAR,
        FP8_FUSED_VAR,
        FP8_INPUTS_VAR,
        FP8_GATE_UP_VAR,
        FP8_DELTA_VAR,
    ];

    /// The default tuning with every variable that `get` returns applied (a program's edge calls
    /// `CudaTuning::from_vars(|k| std::env::var(k).ok())`). Unset or blank variables keep their
    /// default; a value that does not parse, or is out of range, is an error naming the variable.
    /// Variables other than [`Self::VARS`] are not read.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, TuningError> {
        let mut t = Self::default();
        if let Some(v) = lookup(&get, CTAS_VAR) {
            t.decode_ctas_per_sm = parse_count(CTAS_VAR, &v, 1)?;
        }
        if let Some(v) = lookup(&get, MIN_SPLIT_VAR) {
            t.decode_min_split_tokens = parse_count(MIN_SPLIT_VAR, &v, 0)?;
        }
        if let Some(v) = lookup(&get, MAX_SPLIT_VAR) {
            t.decode_max_split_tokens = Some(parse_count(MAX_SPLIT_VAR, &v, 1)?);
        }
        if let Some(v) = lookup(&get, MMA_VAR) {
            t.decode_tensor_cores = parse_switch(MMA_VAR, &v)?;
        }
        if let Some(v) = lookup(&get, FUSED_ROPE_VAR) {
            t.decode_fused_rope_max_rows = parse_count(FUSED_ROPE_VAR, &v, 0)?;
        }
        if let Some(v) = lookup(&get, WARP_ITEMS_VAR) {
            t.decode_warp_items_per_sm = parse_count(WARP_ITEMS_VAR, &v, 0)?;
        }
        if let Some(v) = lookup(&get, WARP_ROPE_VAR) {
            t.decode_warp_fused_rope = parse_switch(WARP_ROPE_VAR, &v)?;
        }
        if let Some(v) = lookup(&get, PREFILL_MMA_VAR) {
            t.prefill_tensor_cores = parse_switch(PREFILL_MMA_VAR, &v)?;
        }
        if let Some(v) = lookup(&get, GEMV_VAR) {
            t.gemv_max_rows = parse_count(GEMV_VAR, &v, 0)?;
        }
        if let Some(v) = lookup(&get, GEMV_SPLIT_VAR) {
            match v.parse::<usize>() {
                Ok(s) if GEMV_SPLITS.contains(&s) => t.gemv_split = Some(s),
                _ => return Err(invalid(GEMV_SPLIT_VAR, &v, GEMV_SPLIT_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, DET_SPLIT_VAR) {
            match v.parse::<usize>() {
                Ok(s) if s > 0 && s.is_multiple_of(64) => t.deterministic_split_tokens = s,
                _ => return Err(invalid(DET_SPLIT_VAR, &v, DET_SPLIT_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, DET_ROWS_VAR) {
            t.deterministic_gemm_rows = parse_count(DET_ROWS_VAR, &v, 1)?;
        }
        if let Some(v) = lookup(&get, DET_MARGIN_VAR) {
            match v.parse::<i32>() {
                Ok(p) if (-100..=100).contains(&p) => t.deterministic_kernel_margin = p,
                _ => return Err(invalid(DET_MARGIN_VAR, &v, DET_MARGIN_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, DET_LEAD_VAR) {
            match v.parse::<u32>() {
                Ok(us @ 0..=100) => t.deterministic_lead_us = us,
                _ => return Err(invalid(DET_LEAD_VAR, &v, DET_LEAD_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, DET_K_SPLIT_VAR) {
            match v.parse::<usize>() {
                Ok(s @ 1..=2) => t.deterministic_k_split = s,
                _ => return Err(invalid(DET_K_SPLIT_VAR, &v, DET_K_SPLIT_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, FP8_SMALL_VAR) {
            match v.parse::<usize>() {
                Ok(r) if r <= FP8_SMALL_LIMIT => t.fp8_small_max_rows = r,
                _ => return Err(invalid(FP8_SMALL_VAR, &v, FP8_SMALL_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, FP8_WIDE_VAR) {
            match v.parse::<usize>() {
                Ok(c) => t.fp8_small_wide_ctas = c,
                _ => return Err(invalid(FP8_WIDE_VAR, &v, FP8_WIDE_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, FP8_FUSED_VAR) {
            match v.parse::<usize>() {
                Ok(r) if r <= FP8_FUSED_LIMIT => t.fp8_fused_max_rows = r,
                _ => return Err(invalid(FP8_FUSED_VAR, &v, FP8_FUSED_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, FP8_INPUTS_VAR) {
            t.fp8_quantized_inputs = match v.to_ascii_lowercase().as_str() {
                "off" => Fp8QuantizedInputs::Off,
                "swiglu" => Fp8QuantizedInputs::SwiGlu,
                "all" => Fp8QuantizedInputs::All,
                _ => return Err(invalid(FP8_INPUTS_VAR, &v, FP8_INPUTS_EXPECTED)),
            };
        }
        if let Some(v) = lookup(&get, FP8_GATE_UP_VAR) {
            t.fp8_gate_up_bf16 = parse_switch(FP8_GATE_UP_VAR, &v)?;
        }
        if let Some(v) = lookup(&get, FP8_DELTA_VAR) {
            t.fp8_delta_bf16 = parse_switch(FP8_DELTA_VAR, &v)?;
        }
        let k = &mut t.kernels;
        if let Some(v) = lookup(&get, STAGES_VAR) {
            match v.parse::<usize>() {
                Ok(s) if sov_kernels::DECODE_MMA_STAGES.contains(&s) => k.decode_stages = s,
                _ => return Err(invalid(STAGES_VAR, &v, STAGES_EXPECTED)),
            }
        }
        if let Some(v) = lookup(&get, CARVEOUT_VAR) {
            let bad = || invalid(CARVEOUT_VAR, &v, CARVEOUT_EXPECTED);
            let percent = |p: &str| match p.trim().parse::<i32>() {
                Ok(-1) => Ok(None),
                Ok(p) if (0..=100).contains(&p) => Ok(Some(p as u8)),
                _ => Err(bad()),
            };
            let parts: Vec<&str> = v.split(',').collect();
            let (few, wide, warps) = match parts[..] {
                [few, wide] => (few, wide, wide),
                [few, wide, warps] => (few, wide, warps),
                _ => return Err(bad()),
            };
            k.decode_carveout = DecodeCarveout {
                few: percent(few)?,
                wide: percent(wide)?,
                warps: percent(warps)?,
            };
        }
        if let Some(v) = lookup(&get, ATTENTION_DEFINES_VAR) {
            k.decode_attention_defines = v.split_whitespace().map(str::to_string).collect();
        }
        if let Some(v) = lookup(&get, GEMV_DEFINES_VAR) {
            k.gemv_defines = v.split_whitespace().map(str::to_string).collect();
        }
        if let Some(v) = lookup(&get, SOURCE_DIR_VAR) {
            k.source_dir = Some(PathBuf::from(v));
        }
        Ok(t)
    }

    /// The precision name a receipt records for a backend of this tuning: `bf16` or `f32`
    /// (`precise`, [`super::CudaBackend::with_precise`]), with `-deterministic` appended in
    /// deterministic mode, `-split{N}` after it unless attention splits at 128 tokens, and
    /// `-ksplit{K}` after that unless products reduce K in one part;
    /// `fp8-w8a8` with [`Quantization::Fp8W8A8`] (which [`Self::validate`] refuses with either of
    /// the others), `-bf16edges{N}` after it when [`Self::fp8_bf16_edge_layers`] keeps layers in
    /// bf16.
    pub fn precision_name(&self, precise: bool) -> String {
        let name = self.products_precision_name(precise);
        if self.kv_e4m3 && !precise {
            format!("{name}{KV_E4M3_SUFFIX}")
        } else {
            name
        }
    }

    /// [`Self::precision_name`] without the KV cache's part.
    fn products_precision_name(&self, precise: bool) -> String {
        if self.quantization == Quantization::Fp8W8A8 {
            // Every FP8 run before the edge layers were kept in bf16 quantized them all.
            return match self.fp8_bf16_edge_layers {
                0 => "fp8-w8a8".into(),
                n => format!("fp8-w8a8-bf16edges{n}"),
            };
        }
        let base = if precise { "f32" } else { "bf16" };
        if !self.deterministic {
            return base.into();
        }
        // The split length decides how attention rounds. Runs before it was named all split at
        // 128 tokens and say only "-deterministic"; a replay at 128 keeps that name.
        let attention = match self.deterministic_split_tokens {
            UNNAMED_DETERMINISTIC_SPLIT_TOKENS => format!("{base}-deterministic"),
            split => format!("{base}-deterministic-split{split}"),
        };
        // Likewise the parts of K: every run before the name carried them reduced K in one.
        match self.deterministic_k_split {
            1 => attention,
            parts => format!("{attention}-ksplit{parts}"),
        }
    }

    /// Whether a precision name ([`Self::precision_name`]) says its run kept an e4m3 KV cache.
    pub fn names_kv_e4m3(name: &str) -> bool {
        name.ends_with(KV_E4M3_SUFFIX)
    }

    /// The attention split length and the parts of K that a deterministic precision name
    /// ([`Self::precision_name`]) says its run used: `bf16-deterministic-split256-ksplit2` gives
    /// `(256, 2)`, the bare `-deterministic` of older runs `(128, 1)`. None for a name that is not
    /// a deterministic one (`bf16`, `fp8-w8a8`, a name this build does not know): `sov audit`
    /// replays a run in the order its heads name.
    pub fn deterministic_order(name: &str) -> Option<(usize, usize)> {
        let name = name.strip_suffix(KV_E4M3_SUFFIX).unwrap_or(name);
        let rest = ["bf16", "f32"]
            .iter()
            .find_map(|base| name.strip_prefix(base))?
            .strip_prefix("-deterministic")?;
        let (split, rest) = match rest.strip_prefix("-split") {
            Some(r) => {
                let digits = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
                (r[..digits].parse().ok()?, &r[digits..])
            }
            None => (UNNAMED_DETERMINISTIC_SPLIT_TOKENS, rest),
        };
        let parts = match rest {
            "" => 1,
            r => r.strip_prefix("-ksplit")?.parse().ok()?,
        };
        let valid = split > 0 && split % 64 == 0 && (1..=2).contains(&parts);
        valid.then_some((split, parts))
    }

    /// Checks values set in code against what each setting accepts (the ranges
    /// [`Self::from_vars`] enforces); the error names the field's variable.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.decode_ctas_per_sm == 0 {
            return Err(invalid(CTAS_VAR, "0", "a whole number of at least 1"));
        }
        if self.decode_max_split_tokens == Some(0) {
            return Err(invalid(MAX_SPLIT_VAR, "0", "a whole number of at least 1"));
        }
        if let Some(s) = self.gemv_split.filter(|s| !GEMV_SPLITS.contains(s)) {
            return Err(invalid(GEMV_SPLIT_VAR, &s.to_string(), GEMV_SPLIT_EXPECTED));
        }
        let split = self.deterministic_split_tokens;
        if split == 0 || !split.is_multiple_of(64) {
            return Err(invalid(
                DET_SPLIT_VAR,
                &split.to_string(),
                DET_SPLIT_EXPECTED,
            ));
        }
        if self.deterministic_gemm_rows == 0 {
            return Err(invalid(DET_ROWS_VAR, "0", "a whole number of at least 1"));
        }
        let margin = self.deterministic_kernel_margin;
        if !(-100..=100).contains(&margin) {
            let m = margin.to_string();
            return Err(invalid(DET_MARGIN_VAR, &m, DET_MARGIN_EXPECTED));
        }
        if self.deterministic_lead_us > 100 {
            let us = self.deterministic_lead_us.to_string();
            return Err(invalid(DET_LEAD_VAR, &us, DET_LEAD_EXPECTED));
        }
        if !(1..=2).contains(&self.deterministic_k_split) {
            let s = self.deterministic_k_split.to_string();
            return Err(invalid(DET_K_SPLIT_VAR, &s, DET_K_SPLIT_EXPECTED));
        }
        if self.fp8_small_max_rows > FP8_SMALL_LIMIT {
            let r = self.fp8_small_max_rows.to_string();
            return Err(invalid(FP8_SMALL_VAR, &r, FP8_SMALL_EXPECTED));
        }
        if self.fp8_fused_max_rows > FP8_FUSED_LIMIT {
            let r = self.fp8_fused_max_rows.to_string();
            return Err(invalid(FP8_FUSED_VAR, &r, FP8_FUSED_EXPECTED));
        }
        if self.kv_e4m3 && !(self.decode_tensor_cores && self.prefill_tensor_cores) {
            // Only the tensor-core attention kernels read an e4m3 cache.
            return Err(TuningError {
                var: if self.decode_tensor_cores {
                    PREFILL_MMA_VAR
                } else {
                    MMA_VAR
                },
                value: "off".into(),
                expected: "on with --kv-dtype fp8 (only the tensor-core attention reads an FP8 cache)",
            });
        }
        if self.quantization == Quantization::Fp8W8A8 && self.deterministic {
            // The FP8 products pick their kernel by row count (small-M kernel or cuBLASLt) and
            // have no pinned algorithm yet, so a row's result would depend on its batch.
            return Err(TuningError {
                var: "--quantization",
                value: "fp8".into(),
                expected: "bf16 weights in deterministic mode (FP8 products are not batch-invariant \
                           yet; pass --deterministic false)",
            });
        }
        let stages = self.kernels.decode_stages;
        if !sov_kernels::DECODE_MMA_STAGES.contains(&stages) {
            return Err(invalid(STAGES_VAR, &stages.to_string(), STAGES_EXPECTED));
        }
        let c = self.kernels.decode_carveout;
        if let Some(p) = [c.few, c.wide, c.warps]
            .into_iter()
            .flatten()
            .find(|p| *p > 100)
        {
            return Err(invalid(CARVEOUT_VAR, &p.to_string(), "percents 0..=100"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn no_variables_give_the_measured_defaults() {
        let t = CudaTuning::from_vars(vars(&[])).unwrap();
        assert_eq!(t, CudaTuning::default());
        assert_eq!(t.decode_ctas_per_sm, 2);
        assert_eq!(t.decode_min_split_tokens, 64);
        assert_eq!(t.decode_max_split_tokens, None);
        assert!(t.decode_tensor_cores);
        assert_eq!(t.gemv_max_rows, 1);
        assert_eq!(t.gemv_split, None);
        assert_eq!(t.kernels.decode_stages, 2);
        assert_eq!(
            t.kernels
                .decode_carveout
                .of("paged_decode_attention_mma_few"),
            Some(40)
        );
        assert_eq!(
            t.kernels.decode_carveout.of("paged_decode_attention_mma"),
            Some(72)
        );
        assert_eq!(
            t.kernels
                .decode_carveout
                .of("paged_decode_attention_mma_warps"),
            Some(72)
        );
        assert_eq!(t.decode_warp_items_per_sm, 24);
        assert!(t.decode_warp_fused_rope);
        assert_eq!(t.kernels.decode_carveout.of("gemv_bf16"), None);
        assert!(t.kernels.decode_attention_defines.is_empty() && t.kernels.gemv_defines.is_empty());
        assert_eq!(t.kernels.source_dir, None);
        assert_eq!(t.validate(), Ok(()));
        // Blank values count as unset.
        assert_eq!(
            CudaTuning::from_vars(vars(&[("SOV_GEMV", " "), ("SOV_DECODE_STAGES", "")])),
            Ok(CudaTuning::default())
        );
    }

    #[test]
    fn every_variable_sets_its_field() {
        let t = CudaTuning::from_vars(vars(&[
            ("SOV_DECODE_CTAS_PER_SM", "4"),
            ("SOV_DECODE_MIN_SPLIT_TOKENS", "256"),
            ("SOV_DECODE_SPLIT_TOKENS", " 512 "),
            ("SOV_DECODE_MMA", "off"),
            ("SOV_PREFILL_MMA", "0"),
            ("SOV_DECODE_FUSED_ROPE_ROWS", "64"),
            ("SOV_DECODE_WARP_ITEMS", "8"),
            ("SOV_DECODE_WARP_FUSED_ROPE", "off"),
            ("SOV_GEMV", "0"),
            ("SOV_GEMV_SPLIT", "8"),
            ("SOV_DECODE_STAGES", "3"),
            ("SOV_DECODE_CARVEOUT", "-1, 55"),
            ("SOV_DECODE_ATTENTION_DEFINES", "-DREG_LOADS  -DPREFETCH"),
            ("SOV_GEMV_DEFINES", "-DUNROLL=4"),
            ("SOV_KERNEL_SOURCE_DIR", "kernels/cuda"),
            ("SOV_DETERMINISTIC_SPLIT_TOKENS", "512"),
            ("SOV_DETERMINISTIC_GEMM_ROWS", "64"),
            ("SOV_DETERMINISTIC_KERNEL_MARGIN", "-20"),
            ("SOV_DETERMINISTIC_LEAD_US", "0"),
            ("SOV_DETERMINISTIC_K_SPLIT", "1"),
            ("SOV_FP8_SMALL_ROWS", "4"),
            ("SOV_FP8_SMALL_WIDE_CTAS", "100"),
            ("SOV_FP8_FUSED_ROWS", "2"),
            ("SOV_FP8_QUANTIZED_INPUTS", "swiglu"),
            ("SOV_FP8_GATE_UP_BF16", "off"),
            ("SOV_FP8_DELTA_BF16", "off"),
        ]))
        .unwrap();
        let expect = CudaTuning {
            decode_ctas_per_sm: 4,
            decode_min_split_tokens: 256,
            decode_max_split_tokens: Some(512),
            decode_tensor_cores: false,
            decode_fused_rope_max_rows: 64,
            decode_warp_items_per_sm: 8,
            decode_warp_fused_rope: false,
            prefill_tensor_cores: false,
            gemv_max_rows: 0,
            gemv_split: Some(8),
            deterministic: false,
            deterministic_split_tokens: 512,
            deterministic_gemm_rows: 64,
            deterministic_kernel_margin: -20,
            deterministic_lead_us: 0,
            deterministic_k_split: 1,
            quantization: Quantization::None,
            // Not from the environment: the command line sets it.
            fp8_bf16_edge_layers: 1,
            fp8_small_max_rows: 4,
            fp8_small_wide_ctas: 100,
            fp8_fused_max_rows: 2,
            fp8_quantized_inputs: Fp8QuantizedInputs::SwiGlu,
            fp8_gate_up_bf16: false,
            fp8_delta_bf16: false,
            kv_e4m3: false,
            kernels: KernelBuild {
                decode_stages: 3,
                decode_carveout: DecodeCarveout {
                    few: None,
                    wide: Some(55),
                    warps: Some(55),
                },
                decode_attention_defines: vec!["-DREG_LOADS".into(), "-DPREFETCH".into()],
                gemv_defines: vec!["-DUNROLL=4".into()],
                source_dir: Some(PathBuf::from("kernels/cuda")),
            },
        };
        assert_eq!(t, expect);
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(
            t.kernels
                .decode_carveout
                .of("paged_decode_attention_mma_few"),
            None
        );
        for on in ["1", "TRUE", "yes", "On"] {
            let t = CudaTuning::from_vars(vars(&[("SOV_DECODE_MMA", on)])).unwrap();
            assert!(t.decode_tensor_cores, "{on}");
        }
    }

    #[test]
    fn a_bad_value_is_an_error_naming_its_variable() {
        for (var, value) in [
            ("SOV_DECODE_CTAS_PER_SM", "0"),
            ("SOV_DECODE_CTAS_PER_SM", "two"),
            ("SOV_DECODE_MIN_SPLIT_TOKENS", "-64"),
            ("SOV_DECODE_SPLIT_TOKENS", "0"),
            ("SOV_DECODE_MMA", "maybe"),
            ("SOV_GEMV", "1.5"),
            ("SOV_GEMV_SPLIT", "3"),
            ("SOV_DECODE_STAGES", "5"),
            ("SOV_DECODE_STAGES", "1"),
            ("SOV_DECODE_CARVEOUT", "40"),
            ("SOV_DECODE_CARVEOUT", "40,101"),
            ("SOV_DECODE_CARVEOUT", "x,72"),
            ("SOV_DECODE_CARVEOUT", "40,72,72,72"),
            ("SOV_DECODE_CARVEOUT", "40,72,101"),
            ("SOV_DECODE_WARP_ITEMS", "-1"),
            ("SOV_DETERMINISTIC_SPLIT_TOKENS", "100"),
            ("SOV_DETERMINISTIC_SPLIT_TOKENS", "0"),
            ("SOV_DETERMINISTIC_GEMM_ROWS", "0"),
            ("SOV_DETERMINISTIC_KERNEL_MARGIN", "101"),
            ("SOV_DETERMINISTIC_KERNEL_MARGIN", "-3.5"),
            ("SOV_DETERMINISTIC_K_SPLIT", "3"),
            ("SOV_DETERMINISTIC_K_SPLIT", "0"),
            ("SOV_DETERMINISTIC_LEAD_US", "101"),
            ("SOV_DETERMINISTIC_LEAD_US", "-1"),
        ] {
            let err = CudaTuning::from_vars(vars(&[(var, value)])).unwrap_err();
            assert_eq!(err.var, var, "{value}");
            assert_eq!(err.value, value);
            let text = err.to_string();
            assert!(
                text.contains(var) && text.contains(value),
                "{text} should name {var} and {value}"
            );
        }
    }

    #[test]
    fn values_set_in_code_are_checked() {
        let bad = [
            CudaTuning {
                decode_ctas_per_sm: 0,
                ..Default::default()
            },
            CudaTuning {
                decode_max_split_tokens: Some(0),
                ..Default::default()
            },
            CudaTuning {
                gemv_split: Some(16),
                ..Default::default()
            },
            CudaTuning {
                deterministic_kernel_margin: -101,
                ..Default::default()
            },
            CudaTuning {
                deterministic_k_split: 4,
                ..Default::default()
            },
            CudaTuning {
                kernels: KernelBuild {
                    decode_stages: 7,
                    ..Default::default()
                },
                ..Default::default()
            },
            CudaTuning {
                kernels: KernelBuild {
                    decode_carveout: DecodeCarveout {
                        few: Some(101),
                        wide: None,
                        warps: None,
                    },
                    ..Default::default()
                },
                ..Default::default()
            },
        ];
        let vars: Vec<&str> = bad.iter().map(|t| t.validate().unwrap_err().var).collect();
        assert_eq!(
            vars,
            [
                "SOV_DECODE_CTAS_PER_SM",
                "SOV_DECODE_SPLIT_TOKENS",
                "SOV_GEMV_SPLIT",
                "SOV_DETERMINISTIC_KERNEL_MARGIN",
                "SOV_DETERMINISTIC_K_SPLIT",
                "SOV_DECODE_STAGES",
                "SOV_DECODE_CARVEOUT"
            ]
        );
    }

    #[test]
    fn precision_names_say_deterministic() {
        let mut t = CudaTuning::default();
        assert_eq!(
            (
                t.precision_name(false).as_str(),
                t.precision_name(true).as_str()
            ),
            ("bf16", "f32")
        );
        t.deterministic = true;
        assert_eq!(
            t.precision_name(false),
            "bf16-deterministic-split256-ksplit2"
        );
        assert_eq!(t.precision_name(true), "f32-deterministic-split256-ksplit2");
        // The splits every run made before the name carried them.
        t.deterministic_k_split = 1;
        assert_eq!(t.precision_name(false), "bf16-deterministic-split256");
        t.deterministic_split_tokens = 128;
        assert_eq!(t.precision_name(false), "bf16-deterministic");
        t.deterministic_split_tokens = 64;
        assert_eq!(t.precision_name(false), "bf16-deterministic-split64");
        t.deterministic_k_split = 2;
        assert_eq!(
            t.precision_name(false),
            "bf16-deterministic-split64-ksplit2"
        );
    }

    #[test]
    fn an_fp8_kv_cache_is_named_and_needs_tensor_core_attention() {
        let mut t = CudaTuning {
            kv_e4m3: true,
            ..Default::default()
        };
        assert_eq!(t.precision_name(false), "bf16-kvfp8");
        assert_eq!(
            t.precision_name(true),
            "f32",
            "precise mode keeps an f32 cache"
        );
        t.deterministic = true;
        let name = t.precision_name(false);
        assert_eq!(name, "bf16-deterministic-split256-ksplit2-kvfp8");
        assert_eq!(CudaTuning::deterministic_order(&name), Some((256, 2)));
        assert!(CudaTuning::names_kv_e4m3(&name));
        assert!(!CudaTuning::names_kv_e4m3(
            "bf16-deterministic-split256-ksplit2"
        ));
        t.deterministic = false;
        t.quantization = Quantization::Fp8W8A8;
        assert_eq!(t.precision_name(false), "fp8-w8a8-bf16edges1-kvfp8");
        assert!(t.validate().is_ok());
        t.prefill_tensor_cores = false;
        assert_eq!(t.validate().unwrap_err().var, PREFILL_MMA_VAR);
        t.decode_tensor_cores = false;
        assert_eq!(t.validate().unwrap_err().var, MMA_VAR);
        t.kv_e4m3 = false;
        assert!(t.validate().is_ok());
    }

    #[test]
    fn precision_names_give_back_their_order() {
        for (split, parts) in [(256, 2), (256, 1), (128, 1), (128, 2), (64, 2), (512, 1)] {
            let t = CudaTuning {
                deterministic: true,
                deterministic_split_tokens: split,
                deterministic_k_split: parts,
                ..Default::default()
            };
            for precise in [false, true] {
                let name = t.precision_name(precise);
                assert_eq!(
                    CudaTuning::deterministic_order(&name),
                    Some((split, parts)),
                    "{name}"
                );
            }
        }
        for name in [
            "bf16",
            "f32",
            "fp8-w8a8",
            "bf16-deterministic-split",
            "bf16-deterministic-split100",
            "bf16-deterministic-ksplit3",
            "bf16-deterministic-split256-ksplit",
            "bf16-deterministic-split256-extra",
            "int4-deterministic",
        ] {
            assert_eq!(CudaTuning::deterministic_order(name), None, "{name}");
        }
    }

    #[test]
    fn fp8_is_named_and_refused_in_deterministic_mode() {
        let mut t = CudaTuning {
            quantization: Quantization::Fp8W8A8,
            ..Default::default()
        };
        assert_eq!(t.precision_name(false), "fp8-w8a8-bf16edges1");
        t.fp8_bf16_edge_layers = 0;
        assert_eq!(t.precision_name(false), "fp8-w8a8");
        t.fp8_bf16_edge_layers = 2;
        assert_eq!(t.precision_name(true), "fp8-w8a8-bf16edges2");
        assert!(t.validate().is_ok());
        t.deterministic = true;
        assert_eq!(t.validate().unwrap_err().var, "--quantization");
    }

    #[test]
    fn fp8_small_rows_are_bounded_by_the_kernel() {
        let t = CudaTuning::from_vars(vars(&[("SOV_FP8_SMALL_ROWS", "8")])).unwrap();
        assert_eq!(t.fp8_small_max_rows, 8);
        let e = CudaTuning::from_vars(vars(&[("SOV_FP8_SMALL_ROWS", "33")])).unwrap_err();
        assert_eq!(e.var, "SOV_FP8_SMALL_ROWS");
        let t = CudaTuning {
            fp8_small_max_rows: 64,
            ..Default::default()
        };
        assert!(t.validate().is_err());
        let t = CudaTuning::from_vars(vars(&[("SOV_FP8_FUSED_ROWS", "0")])).unwrap();
        assert_eq!(t.fp8_fused_max_rows, 0);
        let e = CudaTuning::from_vars(vars(&[("SOV_FP8_FUSED_ROWS", "9")])).unwrap_err();
        assert_eq!(e.var, "SOV_FP8_FUSED_ROWS");
        let t = CudaTuning {
            fp8_fused_max_rows: 9,
            ..Default::default()
        };
        assert!(t.validate().is_err());
    }

    #[test]
    fn fp8_quantized_inputs_name_their_producers() {
        use crate::backend::InputProducer::{RmsNorm, SwiGlu};
        assert_eq!(
            CudaTuning::default().fp8_quantized_inputs,
            Fp8QuantizedInputs::All
        );
        for (v, want, norm, swiglu) in [
            ("off", Fp8QuantizedInputs::Off, false, false),
            ("SwiGLU", Fp8QuantizedInputs::SwiGlu, false, true),
            ("all", Fp8QuantizedInputs::All, true, true),
        ] {
            let t = CudaTuning::from_vars(vars(&[("SOV_FP8_QUANTIZED_INPUTS", v)])).unwrap();
            assert_eq!(t.fp8_quantized_inputs, want, "{v}");
            assert_eq!(want.covers(RmsNorm), norm, "{v}");
            assert_eq!(want.covers(SwiGlu), swiglu, "{v}");
        }
        for bad in ["0", "1", "norm"] {
            let e = CudaTuning::from_vars(vars(&[("SOV_FP8_QUANTIZED_INPUTS", bad)])).unwrap_err();
            assert_eq!(e.var, "SOV_FP8_QUANTIZED_INPUTS");
        }
    }

    #[test]
    fn retired_variables_are_not_tuning_but_are_found() {
        let get = vars(&[("SOV_PDL", "0"), ("SOV_GEMV_SWIGLU", "0")]);
        assert_eq!(CudaTuning::from_vars(&get), Ok(CudaTuning::default()));
        let found: Vec<&str> = retired_vars_set(&get).into_iter().map(|(v, _)| v).collect();
        assert_eq!(found, ["SOV_GEMV_SWIGLU", "SOV_PDL"]);
        for (var, _) in RETIRED_VARS {
            assert!(!CudaTuning::VARS.contains(&var), "{var}");
        }
    }
}
