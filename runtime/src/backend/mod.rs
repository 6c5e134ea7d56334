//! Compute backends (CPU, CUDA) behind one trait the model is written against.
//!
//! Design: the model ([`crate::model::LlamaModel`]) is generic over `B: Backend` (no `dyn`), owns
//! its weights as `B::Buffer`s and calls one backend op per step of the Llama forward pass. A
//! backend owns device memory and kernels; it knows nothing about Llama beyond these ops.
//!
//! Conventions every implementation follows:
//! - Buffers are flat, row-major and typed ([`DType`]); shapes are passed to each op explicitly as
//!   element counts, so a buffer may be larger than what one call uses (workspaces are reused
//!   across batch sizes). Every shape below is written `[outer, ..., inner]`.
//! - Activations are f32. Weights are stored as the backend chooses in [`Backend::upload_weight`]
//!   (the CPU keeps the source dtype: f32 stays f32, f16/bf16 stay 16-bit; CUDA stores bf16).
//!   Small parameters that ops take as `f32` (norm weights, biases, RoPE tables) are uploaded with
//!   [`Backend::upload_f32`].
//! - Fused projections (the vLLM layout): the model concatenates q/k/v weights into one
//!   `[(H + 2*KVH) * D, hidden]` matrix and gate/up into one `[2 * F, hidden]` matrix, so one matmul
//!   yields `qkv: [n, (H + 2*KVH) * D]` (q heads, then k heads, then v heads, each head `D`
//!   contiguous) and `gate_up: [n, 2 * F]` (gate then up). The ops below read those layouts.
//! - Paged KV cache: per layer, one K and one V buffer, each `[num_blocks, block_size, KVH, D]`
//!   in [`Backend::kv_dtype`] (rows of [`Backend::kv_row_elems`] where a format adds scales). A token at position `p` of a sequence with block table `bt` lives in
//!   slot `bt[p / block_size] * block_size + p % block_size`. A format may lay a block's slots
//!   out otherwise within the block's bytes (the CUDA e4m3 cache groups 16 slots head-major,
//!   [`Backend::kv_block_multiple`]); a block stays `block_size` rows' bytes, copied whole.
//! - Ops take `&self` (a backend with mutable state, e.g. a CUDA stream, uses interior
//!   mutability) and `&mut` output buffers; inputs and outputs never alias.
//! - Ops that need more than a few values take small parameter structs: [`KvLayer`] (a layer's K
//!   and V cache), [`RopeTables`], [`NewTokens`] (positions and slots of a step's tokens),
//!   [`AttentionShape`] (heads, block size, scale), [`RmsNorm`] (weight and epsilon) and
//!   [`SwiGluShape`].
//! - Errors are [`BackendError`]; an op called with a buffer too small or of the wrong dtype
//!   returns [`BackendError::Shape`] rather than panicking.

pub mod cpu;
pub mod cuda;
pub mod kv_stage;

use crate::loader::tensor::HostTensor;

/// Where a linear product's weight sits in the model: its layer among `layers`. A backend that
/// quantizes may keep some layers in full precision ([`Backend::upload_projection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectionSite {
    /// The layer, from 0.
    pub layer: usize,
    /// Layers in the model.
    pub layers: usize,
}

impl ProjectionSite {
    /// Layers between this one and the nearer end of the stack: 0 for the first and the last.
    pub fn from_edge(self) -> usize {
        self.layer
            .min(self.layers.saturating_sub(1).saturating_sub(self.layer))
    }
}

/// Element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit unsigned integer (token ids, block tables).
    U32,
    /// 32-bit signed integer.
    I32,
    /// FP8 e4m3 (CUDA's FP8 weights: [`Backend::upload_projection`] under `--quantization fp8`).
    F8E4M3,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
        }
    }
}

/// Failures of a backend operation.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A buffer is too small, has the wrong dtype, or dimensions are inconsistent.
    #[error("{op}: {detail}")]
    Shape {
        /// The operation that refused its arguments.
        op: &'static str,
        /// Which buffer or dimension is wrong, and how.
        detail: String,
    },
    /// Device allocation failed.
    #[error("out of device memory allocating {bytes} bytes")]
    OutOfMemory {
        /// Size of the allocation that failed.
        bytes: usize,
    },
    /// The operation or dtype is not supported by this backend.
    #[error("{0} is not supported by this backend")]
    Unsupported(String),
    /// A driver, compiler or library error from the device runtime.
    #[error("device error: {0}")]
    Device(String),
    /// A CUDA tuning value the backend cannot be opened with.
    #[error("CUDA tuning: {0}")]
    Tuning(#[from] cuda::TuningError),
}

/// A typed, flat buffer in backend memory.
pub trait DeviceBuffer {
    /// Element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// True when the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-step batch metadata in backend memory, built once per forward pass by the model from the
/// engine's [`crate::model::batch::SeqChunk`]s and shared by every layer.
///
/// Tokens of the step are laid out sequence after sequence: sequence `s` owns token rows
/// `q_starts[s] .. q_starts[s + 1]`. Its new tokens sit at positions
/// `ctx_lens[s] - n_new_s .. ctx_lens[s]` and attend causally to every cached position `<=` their
/// own (the cache holds the earlier positions; `kv_write` adds the new ones first).
pub struct BatchMeta<B: Backend> {
    /// Total new tokens in the step (rows of every activation).
    pub n_tokens: usize,
    /// Number of sequences.
    pub n_seqs: usize,
    /// Longest run of new tokens of one sequence (1 for a pure decode step).
    pub max_q_len: usize,
    /// Longest context (cached + new) of one sequence.
    pub max_ctx_len: usize,
    /// Row stride of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// `[n_tokens]` u32: position of each token in its sequence (RoPE).
    pub positions: B::Buffer,
    /// `[n_tokens]` u32: KV slot each token's K/V is written to.
    pub slot_mapping: B::Buffer,
    /// `[n_seqs + 1]` u32: first token row of each sequence; the last entry is `n_tokens`.
    pub q_starts: B::Buffer,
    /// `[n_seqs]` u32: context length of each sequence after this step (cached + new).
    pub ctx_lens: B::Buffer,
    /// `[n_seqs, max_blocks_per_seq]` u32: block table of each sequence, padded with 0.
    pub block_tables: B::Buffer,
}

/// Shape of the attention heads, shared by the RoPE, KV-write and attention ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    /// Query heads `H`.
    pub n_heads: usize,
    /// Key/value heads `KVH` (`H % KVH == 0`; query head `h` reads kv head `h / (H / KVH)`).
    pub n_kv_heads: usize,
    /// Per-head dimension `D` (even).
    pub head_dim: usize,
}

impl HeadShape {
    /// Width of one row of the fused qkv activation: `(H + 2*KVH) * D`.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }
    /// Width of one row of the attention output: `H * D`.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Elements of one token in one layer's K (or V) cache: `KVH * D`.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The parameters of an RMSNorm: `weight: [d]` f32 and the epsilon added to the mean square.
pub struct RmsNorm<'a, B: Backend> {
    /// `[d]` f32, multiplied into each normalized row.
    pub weight: &'a B::Buffer,
    /// Added to `mean(x^2)` before the square root.
    pub eps: f32,
}

impl<B: Backend> Clone for RmsNorm<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for RmsNorm<'_, B> {}

/// A model's rotary tables: `cos`, `sin`: `[max_pos, D/2]` f32 each (the model bakes Llama-3.1
/// `rope_scaling` into them).
pub struct RopeTables<'a, B: Backend> {
    /// `[max_pos, D/2]` f32.
    pub cos: &'a B::Buffer,
    /// `[max_pos, D/2]` f32.
    pub sin: &'a B::Buffer,
}

impl<B: Backend> Clone for RopeTables<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for RopeTables<'_, B> {}

/// A step's new tokens as the KV writes see them: `positions: [n]` u32 (each token's position in
/// its sequence, for RoPE) and `slots: [n]` u32 (the KV slot it is written to).
pub struct NewTokens<'a, B: Backend> {
    /// `[n]` u32.
    pub positions: &'a B::Buffer,
    /// `[n]` u32.
    pub slots: &'a B::Buffer,
    /// Number of tokens.
    pub n: usize,
}

impl<B: Backend> Clone for NewTokens<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for NewTokens<'_, B> {}

/// One layer's paged KV cache: its K and V buffers, each `[num_blocks, block_size, KVH, D]` in
/// [`Backend::kv_dtype`]. `K` is `&Buffer` for ops that read the cache and `&mut Buffer` for ops
/// that write it (the CPU kernels use it over slices too).
#[derive(Debug, Clone, Copy)]
pub struct KvLayer<K> {
    /// The layer's K cache.
    pub k: K,
    /// The layer's V cache.
    pub v: K,
}

impl<T: ?Sized> KvLayer<&mut T> {
    /// The same caches, borrowed again for a call that writes them.
    pub fn reborrow(&mut self) -> KvLayer<&mut T> {
        KvLayer {
            k: &mut *self.k,
            v: &mut *self.v,
        }
    }

    /// The same caches, borrowed for a call that reads them.
    pub fn as_shared(&self) -> KvLayer<&T> {
        KvLayer {
            k: &*self.k,
            v: &*self.v,
        }
    }
}

/// What an attention op needs to know besides its buffers: the head shape, the paged cache's
/// block size and the score scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query and KV heads and their dimension.
    pub heads: HeadShape,
    /// Tokens per KV block (the cache is `[num_blocks, block_size, KVH, D]`).
    pub block_size: usize,
    /// Multiplies `q . k` before the softmax (`1 / sqrt(D)` for Llama).
    pub scale: f32,
}

/// The op that writes a product's input, for [`Backend::takes_quantized_rows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputProducer {
    /// [`Backend::rms_norm`] / [`Backend::add_rms_norm`] (the qkv and gate/up inputs).
    RmsNorm,
    /// [`Backend::silu_mul`] / [`Backend::matmul_silu_mul`] (the down input).
    SwiGlu,
}

/// Sizes of a SwiGLU feed-forward input ([`Backend::matmul_silu_mul`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwiGluShape {
    /// Rows of `x`.
    pub n: usize,
    /// Inner dimension: columns of `x` and of the weight.
    pub k: usize,
    /// Intermediate size: columns of the output (the weight has `2 * f` rows).
    pub f: usize,
}

impl<B: Backend> BatchMeta<B> {
    /// The step's new tokens (positions and slots of its `n_tokens` rows), for the KV writes.
    pub fn new_tokens(&self) -> NewTokens<'_, B> {
        NewTokens {
            positions: &self.positions,
            slots: &self.slot_mapping,
            n: self.n_tokens,
        }
    }
}

/// A compute backend: memory plus the ops of a Llama forward pass.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A buffer in this backend's memory.
    type Buffer: DeviceBuffer + Send + Sync;

    /// Human-readable name (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    // ----- memory -----

    /// Uploads a weight matrix or embedding table, keeping or converting its dtype as the backend
    /// prefers (see the module doc). The result is `[numel]` in the tensor's row-major order.
    fn upload_weight(&self, tensor: &HostTensor) -> Result<Self::Buffer, BackendError>;
    /// As [`Backend::upload_weight`], taking the tensor: a host-memory backend keeps its data
    /// without a copy, so a large model never sits in host memory twice.
    fn upload_weight_owned(&self, tensor: HostTensor) -> Result<Self::Buffer, BackendError> {
        self.upload_weight(&tensor)
    }
    /// Uploads the weight of one of a layer's linear products (qkv, o, gate/up, down), which a
    /// backend may store quantized (CUDA under `--quantization fp8`, except in the layers its
    /// tuning keeps in bf16: `site` says which layer this is); the result is what
    /// [`Backend::matmul`] takes as `w`. Default: [`Backend::upload_weight_owned`].
    fn upload_projection(
        &self,
        tensor: HostTensor,
        site: ProjectionSite,
    ) -> Result<Self::Buffer, BackendError> {
        let _ = site;
        self.upload_weight_owned(tensor)
    }
    /// Uploads f32 data as an f32 buffer `[data.len()]`.
    fn upload_f32(&self, data: &[f32]) -> Result<Self::Buffer, BackendError>;
    /// Uploads u32 data as a u32 buffer `[data.len()]` (token ids, positions, block tables, ...).
    fn upload_u32(&self, data: &[u32]) -> Result<Self::Buffer, BackendError>;
    /// Uploads i32 data as an i32 buffer `[data.len()]`.
    fn upload_i32(&self, data: &[i32]) -> Result<Self::Buffer, BackendError>;
    /// Allocates a zero-filled buffer of `len` elements of `dtype`.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Self::Buffer, BackendError>;
    /// Copies the first `out.len()` elements of an f32 buffer to the host.
    fn download_f32(&self, buf: &Self::Buffer, out: &mut [f32]) -> Result<(), BackendError>;
    /// Copies the first `out.len()` elements of a u32 buffer to the host.
    fn download_u32(&self, buf: &Self::Buffer, out: &mut [u32]) -> Result<(), BackendError>;
    /// Raw bytes of elements `elem_offset .. elem_offset + n_elems` of any buffer, in the buffer's
    /// dtype, little-endian (KV block swap-out and checkpoints).
    fn read_bytes(
        &self,
        buf: &Self::Buffer,
        elem_offset: usize,
        n_elems: usize,
    ) -> Result<Vec<u8>, BackendError>;
    /// Overwrites elements from `elem_offset` with `bytes` (whose length is a multiple of the
    /// dtype size), the inverse of [`Backend::read_bytes`] (KV block swap-in and restore).
    fn write_bytes(
        &self,
        buf: &mut Self::Buffer,
        elem_offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError>;
    /// Copies `n_elems` elements inside one buffer from `src_offset` to `dst_offset` (the ranges
    /// do not overlap); used to copy a KV block (copy-on-write of a shared prefix).
    fn copy_within(
        &self,
        buf: &mut Self::Buffer,
        src_offset: usize,
        dst_offset: usize,
        n_elems: usize,
    ) -> Result<(), BackendError>;
    /// Element type of the KV cache buffers (f32 on CPU, bf16 on CUDA).
    fn kv_dtype(&self) -> DType;

    /// Elements (of [`Backend::kv_dtype`]) of one token's row in one layer's K (or V) cache:
    /// `KVH * D` values, plus what the format keeps beside them (an e4m3 cache's per-head
    /// scales). The cache layout above holds with this row width in place of `KVH * D`.
    fn kv_row_elems(&self, heads: HeadShape) -> usize {
        heads.kv_width()
    }
    /// Block sizes of a KV cache in [`Backend::kv_dtype`] must be multiples of this: 1, or an
    /// e4m3 cache's slot group (16), whose blocks must be whole groups.
    fn kv_block_multiple(&self) -> usize {
        1
    }
    /// The device memory free now, in bytes, where the device reports it (a GPU); None on
    /// backends whose memory is the host's.
    fn free_memory_bytes(&self) -> Option<usize> {
        None
    }
    /// Waits until all queued work has finished (a no-op on synchronous backends).
    fn synchronize(&self) -> Result<(), BackendError>;
    /// Runs one forward step's worth of op calls in the backend's execution context. The CPU
    /// backend enters its thread pool once here, so the many parallel ops of a step do not each
    /// pay a cross-thread hand-off; other backends just call `step`.
    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        step()
    }

    // ----- ops -----

    /// `out[i, :] = table[ids[i], :]` as f32.
    /// `table: [vocab, hidden]` (weight dtype), `ids: [n]` u32, `out: [n, hidden]` f32.
    /// An id `>= vocab` is an error (CPU) or clamped (device backends may not check).
    fn embedding(
        &self,
        table: &Self::Buffer,
        ids: &Self::Buffer,
        out: &mut Self::Buffer,
        n: usize,
        hidden: usize,
    ) -> Result<(), BackendError>;

    /// The dtype in which this backend multiplies the input of a product of `rows` rows. The ops
    /// that produce product inputs (RMSNorm, SwiGLU) may write it instead of f32, and
    /// [`Self::matmul`] then reads it without a conversion: the values multiplied are the same
    /// (the f32 results rounded as the product would round them), with fewer kernels and bytes.
    /// F32 unless a backend overrides it (the CUDA backend: bf16 where cuBLAS multiplies in bf16).
    fn matmul_input_dtype(&self, rows: usize) -> DType {
        let _ = rows;
        DType::F32
    }

    /// Whether the product `x[rows, k] @ w^T`, its input written by `producer`, takes `x` as
    /// quantized rows (a buffer from [`Self::alloc_quantized_rows`]): the producer then writes
    /// the rows quantized as the product would quantize them, and the product reads them as they
    /// are. False unless a backend overrides it (the CUDA backend: FP8 products of more rows than
    /// quantize their own input, for the producers whose quantizing kernel pays).
    fn takes_quantized_rows(
        &self,
        rows: usize,
        k: usize,
        w: &Self::Buffer,
        producer: InputProducer,
    ) -> bool {
        let _ = (rows, k, w, producer);
        false
    }

    /// A buffer for up to `rows` quantized product-input rows of `k` values
    /// ([`Self::takes_quantized_rows`]): [`DType::F8E4M3`] codes, then the rows' scales.
    /// Unsupported unless a backend overrides it.
    fn alloc_quantized_rows(&self, rows: usize, k: usize) -> Result<Self::Buffer, BackendError> {
        let _ = (rows, k);
        Err(BackendError::Unsupported(
            "quantized product-input rows".into(),
        ))
    }

    /// RMSNorm as Hugging Face Llama: `out = x / sqrt(mean(x^2) + eps) * weight`, per row.
    /// `x: [n, d]` f32, `norm.weight: [d]` f32, `out: [n, d]` f32 or
    /// [`Self::matmul_input_dtype`]`(n)` (the f32 result rounded to it), or quantized rows
    /// ([`Self::alloc_quantized_rows`]).
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        norm: RmsNorm<'_, Self>,
        out: &mut Self::Buffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError>;

    /// Fused residual add and RMSNorm: `residual += x; out = rms_norm(residual)`.
    /// `residual: [n, d]` f32 (updated in place), `x: [n, d]` f32 (or the type
    /// [`Self::matmul_residual_delta`] marked it with), `norm.weight: [d]` f32,
    /// `out: [n, d]` f32, [`Self::matmul_input_dtype`]`(n)` or quantized rows.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        norm: RmsNorm<'_, Self>,
        out: &mut Self::Buffer,
        n: usize,
        d: usize,
    ) -> Result<(), BackendError>;

    /// `out = x @ w^T`: `x: [n, k]` f32 or [`Self::matmul_input_dtype`]`(n)` (or quantized rows
    /// where [`Self::takes_quantized_rows`]), `w: [m, k]` (weight dtype, HF `[out, in]` layout),
    /// `out: [n, m]` f32 (overwritten).
    fn matmul(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        out: &mut Self::Buffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError>;

    /// A product whose only reader is a later [`Self::add_rms_norm`], as its `x` (a layer's o
    /// and down products, the residual stream's deltas): [`Self::matmul`]'s values into `out`
    /// (made `[n, m]` f32), which a backend may store narrower and mark so through
    /// [`DeviceBuffer::dtype`] (the CUDA backend: bf16 from some FP8 products; its
    /// `add_rms_norm` reads either). Default: [`Self::matmul`].
    fn matmul_residual_delta(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        out: &mut Self::Buffer,
        n: usize,
        k: usize,
        m: usize,
    ) -> Result<(), BackendError> {
        self.matmul(x, w, out, n, k, m)
    }

    /// `x[i, :] += bias` per row: `x: [n, m]` f32, `bias: [m]` f32.
    fn add_bias(
        &self,
        x: &mut Self::Buffer,
        bias: &Self::Buffer,
        n: usize,
        m: usize,
    ) -> Result<(), BackendError>;

    /// Rotary embedding, Hugging Face `rotate_half` (NeoX) style, in place on the q and k heads of
    /// a fused qkv activation (v untouched). For a head vector `x` of token `i` at position
    /// `p = positions[i]` and `j < D/2`:
    /// `x'[j] = x[j]*cos[p,j] - x[j+D/2]*sin[p,j]`, `x'[j+D/2] = x[j+D/2]*cos[p,j] + x[j]*sin[p,j]`.
    /// `qkv: [n, (H + 2*KVH) * D]` f32, `positions: [n]` u32, `tables`: [`RopeTables`].
    fn rope(
        &self,
        qkv: &mut Self::Buffer,
        positions: &Self::Buffer,
        tables: RopeTables<'_, Self>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError>;

    /// Writes the k and v heads of each token into the paged cache at `slot_mapping[i]`:
    /// `kv.k[slot, :, :] = qkv[i, H*D .. (H+KVH)*D]`, `kv.v[slot, :, :] = qkv[i, (H+KVH)*D ..]`.
    /// `qkv: [n, (H + 2*KVH) * D]` f32, `slot_mapping: [n]` u32, `kv`: [`KvLayer`].
    fn kv_write(
        &self,
        qkv: &Self::Buffer,
        slot_mapping: &Self::Buffer,
        kv: KvLayer<&mut Self::Buffer>,
        n: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError>;

    /// [`Backend::rope`] at `tokens.positions` then [`Backend::kv_write`] at `tokens.slots` with
    /// the same `qkv`, as one call: a backend may fuse them (the CUDA backend does: one kernel
    /// launch fewer per layer and step), with the same results. Shapes as for the two ops.
    fn rope_kv_write(
        &self,
        qkv: &mut Self::Buffer,
        tokens: NewTokens<'_, Self>,
        tables: RopeTables<'_, Self>,
        kv: KvLayer<&mut Self::Buffer>,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        self.rope(qkv, tokens.positions, tables, tokens.n, heads)?;
        self.kv_write(qkv, tokens.slots, kv, tokens.n, heads)
    }

    /// Causal paged attention over several sequences (prefill chunks and decode tokens mixed):
    /// for token row `i` of sequence `s` at position `p`, query head `h`, kv head
    /// `g = h / (H / KVH)`: `out[i, h] = softmax_j(scale * q[i,h] . K[s, j, g]) @ V[s, j, g]`
    /// over `j = 0 ..= p`, where `K[s, j]` is read from slot
    /// `block_tables[s, j / block_size] * block_size + j % block_size`.
    /// `qkv: [n_tokens, (H + 2*KVH) * D]` f32 (q heads read, already rotated),
    /// `kv`: [`KvLayer`] (already holding this step's tokens), `out: [n_tokens, H * D]` f32 or
    /// [`Self::matmul_input_dtype`]`(n_tokens)` (the f32 result rounded to it); heads,
    /// `block_size` and `scale` from `shape`.
    fn paged_attention(
        &self,
        qkv: &Self::Buffer,
        kv: KvLayer<&Self::Buffer>,
        meta: &BatchMeta<Self>,
        out: &mut Self::Buffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError>;

    /// Sizes the backend's reusable scratch for steps of up to `max_rows` token rows (matmul
    /// inputs at most `max_k` wide) over at most `max_seqs` sequences of up to `max_context`
    /// tokens with `heads`, so serving does not reallocate it mid-run. On the GPU a reallocation
    /// also invalidates the captured decode graphs (they run eagerly and are captured again). The
    /// default does nothing.
    fn reserve_scratch(
        &self,
        max_rows: usize,
        max_k: usize,
        max_seqs: usize,
        max_context: usize,
        heads: HeadShape,
    ) -> Result<(), BackendError> {
        let _ = (max_rows, max_k, max_seqs, max_context, heads);
        Ok(())
    }

    /// [`Backend::rope_kv_write`] of `meta`'s tokens ([`BatchMeta::new_tokens`]) followed by
    /// [`Backend::paged_attention`], as one call: a backend may fuse them for decode steps (the
    /// CUDA backend does: the attention rotates q and the new k row as it loads them and writes
    /// the new K/V rows itself, one kernel launch fewer per layer and step), with the same `out`
    /// and cache contents. Afterwards `qkv`'s q and k heads may or may not be rotated.
    fn rope_kv_attention(
        &self,
        qkv: &mut Self::Buffer,
        tables: RopeTables<'_, Self>,
        kv: KvLayer<&mut Self::Buffer>,
        meta: &BatchMeta<Self>,
        out: &mut Self::Buffer,
        shape: AttentionShape,
    ) -> Result<(), BackendError> {
        rope_kv_then_attention(self, qkv, tables, kv, meta, out, shape)
    }

    /// SwiGLU activation: `out[i, j] = silu(gate_up[i, j]) * gate_up[i, f + j]`,
    /// `silu(x) = x / (1 + exp(-x))`. `gate_up: [n, 2 * f]` f32, `out: [n, f]` f32,
    /// [`Self::matmul_input_dtype`]`(n)` or quantized rows.
    fn silu_mul(
        &self,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        n: usize,
        f: usize,
    ) -> Result<(), BackendError>;

    /// The SwiGLU feed-forward input in one call: `out = silu(x @ Wg^T) * (x @ Wu^T)` where
    /// `w = [Wg; Wu]: [2 * f, k]` bf16 (gate rows, then up rows), `x: [n, k]` f32 or
    /// [`Self::matmul_input_dtype`]`(n)` (or quantized rows where
    /// [`Self::takes_quantized_rows`]), `out: [n, f]` as [`Self::silu_mul`]'s, sizes from
    /// `shape`. `gate_up: [n, 2 * f]` f32 is scratch: the default ([`Self::matmul`]
    /// into it, then [`Self::silu_mul`]) leaves the two products there; a backend that fuses them
    /// may leave it untouched. Either way `out` holds the same values as the two calls.
    fn matmul_silu_mul(
        &self,
        x: &Self::Buffer,
        w: &Self::Buffer,
        gate_up: &mut Self::Buffer,
        out: &mut Self::Buffer,
        shape: SwiGluShape,
    ) -> Result<(), BackendError> {
        let SwiGluShape { n, k, f } = shape;
        self.matmul(x, w, gate_up, n, k, 2 * f)?;
        self.silu_mul(gate_up, out, n, f)
    }

    /// Row gather: `out[r, :] = x[rows[r], :]`.
    /// `x: [n, d]` f32 or [`Self::matmul_input_dtype`]`(n)` (widened), `rows: [r]` u32 (each `< n`),
    /// `out: [r, d]` f32.
    fn gather_rows(
        &self,
        x: &Self::Buffer,
        rows: &Self::Buffer,
        out: &mut Self::Buffer,
        r: usize,
        d: usize,
    ) -> Result<(), BackendError>;
}

/// Returns a [`BackendError::Shape`] unless `buf` holds at least `need` elements of `dtype`.
pub fn check_buffer<B: DeviceBuffer>(
    op: &'static str,
    what: &str,
    buf: &B,
    dtype: DType,
    need: usize,
) -> Result<(), BackendError> {
    if buf.dtype() != dtype {
        return Err(BackendError::Shape {
            op,
            detail: format!("{what} has dtype {:?}, expected {dtype:?}", buf.dtype()),
        });
    }
    if buf.len() < need {
        return Err(BackendError::Shape {
            op,
            detail: format!("{what} holds {} elements, needs {need}", buf.len()),
        });
    }
    Ok(())
}

/// [`Backend::rope_kv_attention`] unfused: [`Backend::rope_kv_write`] of `meta`'s tokens, then
/// [`Backend::paged_attention`] (the trait's default, and the CUDA backend's path where its fused
/// kernel does not apply).
pub fn rope_kv_then_attention<B: Backend>(
    b: &B,
    qkv: &mut B::Buffer,
    tables: RopeTables<'_, B>,
    mut kv: KvLayer<&mut B::Buffer>,
    meta: &BatchMeta<B>,
    out: &mut B::Buffer,
    shape: AttentionShape,
) -> Result<(), BackendError> {
    b.rope_kv_write(qkv, meta.new_tokens(), tables, kv.reborrow(), shape.heads)?;
    b.paged_attention(qkv, kv.as_shared(), meta, out, shape)
}

#[cfg(test)]
mod tests {
    use super::ProjectionSite;

    #[test]
    fn projection_sites_count_layers_from_the_nearer_end() {
        let from_edge = |layers| -> Vec<usize> {
            (0..layers)
                .map(|layer| ProjectionSite { layer, layers }.from_edge())
                .collect()
        };
        assert_eq!(from_edge(1), vec![0]);
        assert_eq!(from_edge(2), vec![0, 0]);
        assert_eq!(from_edge(5), vec![0, 1, 2, 1, 0]);
        assert_eq!(from_edge(6), vec![0, 1, 2, 2, 1, 0]);
    }
}
