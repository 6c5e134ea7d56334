//! `LlamaForCausalLM` as Hugging Face defines it, over any [`Backend`] and a paged KV cache.
//!
//! One forward pass runs a batch of sequences (prefill chunks and decode tokens mixed) as one
//! flat run of token rows:
//! ```text
//! h = embed(tokens)                                   [n, hidden]
//! per layer: x = rms_norm(h)  (fused with h += previous sublayer output)
//!            qkv = x @ Wqkv^T (+ bias); rope(q, k); kv_write(k, v)
//!            h += paged_attention(q, cache) @ Wo^T
//!            x = rms_norm(h); h += (silu(x @ Wg^T) * (x @ Wu^T)) @ Wd^T
//! logits = rms_norm(h)[rows] @ lm_head^T              [rows, vocab]
//! ```
//! where `rows` are the last new token of each sequence ([`LlamaModel::forward`]) or every new
//! token ([`LlamaModel::forward_all_logits`], for speculative verification).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{
    AttentionShape, Backend, BackendError, BatchMeta, DType, HeadShape, InputProducer, KvLayer,
    RmsNorm, RopeTables, SwiGluShape,
};
use crate::loader::tensor::HostTensor;

use super::batch::SeqChunk;
use super::config::LlamaConfig;
use super::error::ModelError;
use super::kv_cache::KvCache;
use super::plan::{PlanLimits, StepPlan, plan};
use super::rope;
use super::tensor_parallel::AllReduce;
use super::weights::{ModelWeights, TensorSource};

/// A Llama-architecture model with its weights on backend `B`.
pub struct LlamaModel<B: Backend> {
    backend: B,
    config: LlamaConfig,
    heads: HeadShape,
    weights: ModelWeights<B>,
    /// `[max_positions, D/2]` f32.
    rope_cos: B::Buffer,
    /// `[max_positions, D/2]` f32.
    rope_sin: B::Buffer,
    max_positions: usize,
    /// The tensor-parallel group this model is one rank of (`None`: the whole model). Its o and
    /// down products are partial sums, summed over the group before the residual add.
    all_reduce: Option<Arc<dyn AllReduce<B>>>,
}

/// Activations of one step, sized for its `n` token rows (or more: a runner that replays decode
/// graphs keeps one set at fixed addresses for its largest batch, see
/// [`LlamaModel::forward_into`]). Allocated by [`LlamaModel::alloc_activations`].
pub struct Activations<B: Backend> {
    /// `[n, hidden]`: the residual stream.
    hidden: B::Buffer,
    /// `[n, hidden]` in `matmul_input_dtype(n)`: normalized input of the current sublayer.
    normed: B::Buffer,
    /// `[n, (H + 2*KVH) * D]`.
    qkv: B::Buffer,
    /// `[n, H * D]` in `matmul_input_dtype(n)`: the attention output, the o product's input.
    attn: B::Buffer,
    /// `[n, hidden]`: output of the current sublayer, added to `hidden` by the next norm.
    sub_out: B::Buffer,
    /// `[n, 2 * F]`.
    gate_up: B::Buffer,
    /// `[n, F]` in `matmul_input_dtype(n)`: the SwiGLU output, the down product's input where
    /// that product does not take quantized rows (`act_q`).
    act: B::Buffer,
    /// `[n, hidden]` quantized rows ([`Backend::alloc_quantized_rows`]): `normed` for the qkv
    /// and gate/up products of layers that take quantized rows; None when none does.
    normed_q: Option<B::Buffer>,
    /// `[n, F]` quantized rows: `act` for the down products that take them; None when none does.
    act_q: Option<B::Buffer>,
}

/// The buffer a product of `w` takes its `(n, k)` input in: the quantized rows where the
/// backend's product takes them and the activations hold some, else the plain input.
fn pick_input<'a, B: Backend>(
    b: &B,
    plain: &'a mut B::Buffer,
    quantized: &'a mut Option<B::Buffer>,
    (n, k): (usize, usize),
    w: &B::Buffer,
    producer: InputProducer,
) -> &'a mut B::Buffer {
    match quantized {
        Some(q) if b.takes_quantized_rows(n, k, w, producer) => q,
        _ => plain,
    }
}

fn check_config(c: &LlamaConfig) -> Result<HeadShape, ModelError> {
    let bad = |m: String| Err(ModelError::InvalidConfig(m));
    if c.num_attention_heads == 0 || c.num_key_value_heads == 0 {
        return bad("attention needs at least one query and one key/value head".into());
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return bad(format!(
            "{} attention heads are not a multiple of {} key/value heads",
            c.num_attention_heads, c.num_key_value_heads
        ));
    }
    if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
        return bad(format!(
            "head_dim {} must be even and positive (RoPE rotates pairs)",
            c.head_dim
        ));
    }
    if c.hidden_size == 0
        || c.vocab_size == 0
        || c.intermediate_size == 0
        || c.max_position_embeddings == 0
    {
        return bad("hidden_size, vocab_size, intermediate_size and max_position_embeddings must be positive".into());
    }
    if c.vocab_size > u32::MAX as usize {
        return bad(format!(
            "vocabulary of {} does not fit u32 token ids",
            c.vocab_size
        ));
    }
    Ok(HeadShape {
        n_heads: c.num_attention_heads,
        n_kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    })
}

impl<B: Backend> LlamaModel<B> {
    /// Checks `config`, checks and uploads every weight (Hugging Face names, see
    /// `crate::loader::tensor`) and precomputes the RoPE tables. The weights are copied; see
    /// [`LlamaModel::from_tensors`] to move them instead.
    pub fn new(
        backend: B,
        config: &LlamaConfig,
        weights: &HashMap<String, HostTensor>,
    ) -> Result<Self, ModelError> {
        Self::build(backend, config, TensorSource::Borrowed(weights))
    }

    /// As [`LlamaModel::new`], consuming the tensors: each one is moved to the backend (no copy
    /// on the CPU) and freed as soon as it is uploaded, so peak host memory stays near one copy
    /// of the weights.
    pub fn from_tensors(
        backend: B,
        config: &LlamaConfig,
        weights: HashMap<String, HostTensor>,
    ) -> Result<Self, ModelError> {
        Self::build(backend, config, TensorSource::Owned(RefCell::new(weights)))
    }

    fn build(
        backend: B,
        config: &LlamaConfig,
        weights: TensorSource<'_>,
    ) -> Result<Self, ModelError> {
        let heads = check_config(config)?;
        let model_weights = ModelWeights::load(&backend, config, weights)?;
        let inv_freq = rope::inv_freq(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling.as_ref(),
        );
        let max_positions = config.max_position_embeddings;
        let (cos, sin) = rope::tables(&inv_freq, max_positions);
        Ok(LlamaModel {
            rope_cos: backend.upload_f32(&cos)?,
            rope_sin: backend.upload_f32(&sin)?,
            backend,
            config: config.clone(),
            heads,
            weights: model_weights,
            max_positions,
            all_reduce: None,
        })
    }

    /// Makes this model one rank of a tensor-parallel group: built from
    /// [`super::tensor_parallel::shard_config`] and [`super::tensor_parallel::shard_weights`], it
    /// sums its o and down products over `group` (see [`super::tensor_parallel`]).
    pub fn with_all_reduce(mut self, group: Arc<dyn AllReduce<B>>) -> Self {
        self.all_reduce = Some(group);
        self
    }

    /// A product into `sub_out`, the residual add's delta: [`Backend::matmul_residual_delta`]
    /// (which may leave it narrower than f32) where the next reader is the add, a plain f32
    /// [`Backend::matmul`] where a tensor-parallel all-reduce comes between.
    fn delta_product(
        &self,
        x: &B::Buffer,
        w: &B::Buffer,
        out: &mut B::Buffer,
        (n, k, m): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        match self.all_reduce {
            Some(_) => self.backend.matmul(x, w, out, n, k, m),
            None => self.backend.matmul_residual_delta(x, w, out, n, k, m),
        }
    }

    /// Sums `a.sub_out` (`[n, hidden]`) over the tensor-parallel group, if there is one.
    fn reduce_sub_out(&self, a: &mut Activations<B>, n: usize) -> Result<(), BackendError> {
        match &self.all_reduce {
            Some(group) => {
                group.all_reduce_sum(&self.backend, &mut a.sub_out, n * self.config.hidden_size)
            }
            None => Ok(()),
        }
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Sizes the backend's scratch for steps of up to `max_rows` token rows over up to
    /// `max_seqs` sequences of up to `max_context` tokens ([`Backend::reserve_scratch`]), so an
    /// engine allocates it once at start rather than at the first long prompt or long context.
    pub fn reserve_scratch(
        &self,
        max_rows: usize,
        max_seqs: usize,
        max_context: usize,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let max_k = c
            .hidden_size
            .max(c.intermediate_size)
            .max(self.heads.q_width());
        self.backend
            .reserve_scratch(max_rows, max_k, max_seqs, max_context, self.heads)?;
        Ok(())
    }

    /// Allocates a KV cache for this model on its backend.
    pub fn new_kv_cache(
        &self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<KvCache<B>, ModelError> {
        KvCache::new(&self.backend, &self.config, num_blocks, block_size)
    }

    /// Runs the new tokens of every chunk through the model, writing their K/V into `kv`, and
    /// returns the logits of each chunk's last new token: `[chunks.len(), vocab]` f32, row-major.
    pub fn forward(
        &self,
        kv: &mut KvCache<B>,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<f32>, ModelError> {
        self.run(kv, chunks, false)
    }

    /// As [`LlamaModel::forward`], but returns logits of every new token, chunk after chunk:
    /// `[total new tokens, vocab]` f32.
    pub fn forward_all_logits(
        &self,
        kv: &mut KvCache<B>,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<f32>, ModelError> {
        self.run(kv, chunks, true)
    }

    /// As [`LlamaModel::forward`], but the logits stay on the backend: `[chunks.len(), vocab]`
    /// f32 (each chunk's last new token a row, the same values [`LlamaModel::forward`] returns),
    /// for a caller that chooses tokens where the logits are and downloads only what it needs.
    pub fn forward_on_backend(
        &self,
        kv: &mut KvCache<B>,
        chunks: &[SeqChunk<'_>],
    ) -> Result<B::Buffer, ModelError> {
        self.backend.run_step(|| {
            self.logits_in_step(kv, chunks, false)
                .map(|(logits, _)| logits)
        })
    }

    fn run(
        &self,
        kv: &mut KvCache<B>,
        chunks: &[SeqChunk<'_>],
        all_rows: bool,
    ) -> Result<Vec<f32>, ModelError> {
        self.backend.run_step(|| {
            let (logits, rows) = self.logits_in_step(kv, chunks, all_rows)?;
            let mut out = vec![0f32; rows * self.config.vocab_size]; // [rows, vocab]
            self.backend.download_f32(&logits, &mut out)?;
            Ok(out)
        })
    }

    /// Checks `chunks` against this model and `kv` (the cache's shape, token ids, positions, block
    /// ids) and flattens them into the host metadata of one step: the one planning function of
    /// every forward path, [`Self::forward`]'s and a runner's that keeps its own buffers.
    pub fn plan_step(
        &self,
        kv: &KvCache<B>,
        chunks: &[SeqChunk<'_>],
    ) -> Result<StepPlan, ModelError> {
        let c = &self.config;
        let row = self.backend.kv_row_elems(self.heads);
        if kv.num_layers() != c.num_hidden_layers || kv.kv_width() != row {
            return Err(ModelError::InvalidBatch(format!(
                "KV cache of {} layers x {} wide does not fit the model ({} layers x {row})",
                kv.num_layers(),
                kv.kv_width(),
                c.num_hidden_layers,
            )));
        }
        let limits = PlanLimits {
            vocab_size: c.vocab_size,
            max_positions: self.max_positions,
            block_size: kv.block_size(),
            num_blocks: kv.num_blocks(),
        };
        plan(chunks, limits)
    }

    /// The logits of every one of `n` token rows into `logits` (`[>= n, vocab]` f32), on buffers
    /// the caller keeps: the embedding of `ids` (`[>= n]` u32), every layer over `kv` as `meta`
    /// describes (built from [`Self::plan_step`]), the final norm and the head, with `a` sized for
    /// at least `n` rows by [`Self::alloc_activations`]. It only enqueues backend ops (no upload,
    /// download or allocation), so a runner can capture it into a graph and replay it.
    pub fn forward_into(
        &self,
        ids: &B::Buffer,
        kv: &mut KvCache<B>,
        meta: &BatchMeta<B>,
        a: &mut Activations<B>,
        logits: &mut B::Buffer,
        n: usize,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        self.run_layers(ids, kv, meta, a, n)?;
        let head = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        self.backend
            .matmul(&a.normed, head, logits, n, c.hidden_size, c.vocab_size)
    }

    /// The forward pass proper, inside the backend's step context: the logits of every new token
    /// (`all_rows`) or of each chunk's last one, on the backend, and their row count.
    fn logits_in_step(
        &self,
        kv: &mut KvCache<B>,
        chunks: &[SeqChunk<'_>],
        all_rows: bool,
    ) -> Result<(B::Buffer, usize), ModelError> {
        let c = &self.config;
        // Pass-boundary events (`--log sov::pass=trace`, `kernels/bench/pass_timeline.py`): where
        // the host spends the time before a pass's first kernel.
        tracing::trace!(target: "sov::pass", "model: step start");
        let step = self.plan_step(kv, chunks)?;
        let meta = self.upload_meta(&step)?;
        tracing::trace!(target: "sov::pass", "model: planned, metadata uploaded");
        let n = meta.n_tokens;
        let b = &self.backend;
        let hidden = c.hidden_size;
        let mut a = self.alloc_activations(n)?;
        let tokens = b.upload_u32(&step.tokens)?; // [n]
        tracing::trace!(target: "sov::pass", "model: activations allocated, tokens uploaded");
        self.run_layers(&tokens, kv, &meta, &mut a, n)?;
        tracing::trace!(target: "sov::pass", "model: layers enqueued");
        let (rows, picked) = if all_rows {
            (n, None)
        } else {
            let r = step.last_rows.len();
            let ids = b.upload_u32(&step.last_rows)?; // [r]
            let mut picked = b.alloc(DType::F32, r * hidden)?; // [r, hidden]
            b.gather_rows(&a.normed, &ids, &mut picked, r, hidden)?;
            (r, Some(picked))
        };
        let head = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let mut logits = b.alloc(DType::F32, rows * c.vocab_size)?; // [rows, vocab]
        b.matmul(
            picked.as_ref().unwrap_or(&a.normed),
            head,
            &mut logits,
            rows,
            hidden,
            c.vocab_size,
        )?;
        Ok((logits, rows))
    }

    /// The forward pass from token ids to the final normalized hidden states: the embedding of
    /// `ids` (`[n]` u32), every layer over `kv` as `meta` describes, and the final RMSNorm, so
    /// `a.normed` holds `[n, hidden]` for the head. One Backend op per step of the Llama forward,
    /// shared by [`Self::forward`] and [`Self::forward_into`].
    fn run_layers(
        &self,
        ids: &B::Buffer,
        kv: &mut KvCache<B>,
        meta: &BatchMeta<B>,
        a: &mut Activations<B>,
        n: usize,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let b = &self.backend;
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps);
        let block_size = kv.block_size();
        b.embedding(&self.weights.embed, ids, &mut a.hidden, n, hidden)?;
        let scale = 1.0 / (self.heads.head_dim as f32).sqrt();
        let f = c.intermediate_size;
        for (l, w) in self.weights.layers.iter().enumerate() {
            // Each product input where its product takes it: quantized rows, or `normed` / `act`.
            let qkv_in = pick_input(
                b,
                &mut a.normed,
                &mut a.normed_q,
                (n, hidden),
                &w.qkv,
                InputProducer::RmsNorm,
            );
            if l == 0 {
                b.rms_norm(
                    &a.hidden,
                    RmsNorm {
                        weight: &w.input_norm,
                        eps,
                    },
                    qkv_in,
                    n,
                    hidden,
                )?;
            } else {
                b.add_rms_norm(
                    &mut a.hidden,
                    &a.sub_out,
                    RmsNorm {
                        weight: &w.input_norm,
                        eps,
                    },
                    qkv_in,
                    n,
                    hidden,
                )?;
            }
            let qkv_w = self.heads.qkv_width();
            b.matmul(qkv_in, &w.qkv, &mut a.qkv, n, hidden, qkv_w)?;
            if let Some(bias) = &w.qkv_bias {
                b.add_bias(&mut a.qkv, bias, n, qkv_w)?;
            }
            let (k_cache, v_cache) = kv.layer_mut(l);
            b.rope_kv_attention(
                &mut a.qkv,
                RopeTables {
                    cos: &self.rope_cos,
                    sin: &self.rope_sin,
                },
                KvLayer {
                    k: k_cache,
                    v: v_cache,
                },
                meta,
                &mut a.attn,
                AttentionShape {
                    heads: self.heads,
                    block_size,
                    scale,
                },
            )?;
            self.delta_product(
                &a.attn,
                &w.o_proj,
                &mut a.sub_out,
                (n, self.heads.q_width(), hidden),
            )?;
            self.reduce_sub_out(a, n)?;
            let gate_up_in = pick_input(
                b,
                &mut a.normed,
                &mut a.normed_q,
                (n, hidden),
                &w.gate_up,
                InputProducer::RmsNorm,
            );
            b.add_rms_norm(
                &mut a.hidden,
                &a.sub_out,
                RmsNorm {
                    weight: &w.post_norm,
                    eps,
                },
                gate_up_in,
                n,
                hidden,
            )?;
            let down_in = pick_input(
                b,
                &mut a.act,
                &mut a.act_q,
                (n, f),
                &w.down,
                InputProducer::SwiGlu,
            );
            b.matmul_silu_mul(
                gate_up_in,
                &w.gate_up,
                &mut a.gate_up,
                down_in,
                SwiGluShape { n, k: hidden, f },
            )?;
            self.delta_product(down_in, &w.down, &mut a.sub_out, (n, f, hidden))?;
            self.reduce_sub_out(a, n)?;
        }
        if self.weights.layers.is_empty() {
            b.rms_norm(
                &a.hidden,
                RmsNorm {
                    weight: &self.weights.final_norm,
                    eps,
                },
                &mut a.normed,
                n,
                hidden,
            )?;
        } else {
            b.add_rms_norm(
                &mut a.hidden,
                &a.sub_out,
                RmsNorm {
                    weight: &self.weights.final_norm,
                    eps,
                },
                &mut a.normed,
                n,
                hidden,
            )?;
        }
        Ok(())
    }

    fn upload_meta(&self, step: &StepPlan) -> Result<BatchMeta<B>, ModelError> {
        let b = &self.backend;
        Ok(BatchMeta {
            n_tokens: step.tokens.len(),
            n_seqs: step.ctx_lens.len(),
            max_q_len: step.max_q_len,
            max_ctx_len: step.max_ctx_len,
            max_blocks_per_seq: step.max_blocks_per_seq,
            positions: b.upload_u32(&step.positions)?,
            slot_mapping: b.upload_u32(&step.slot_mapping)?,
            q_starts: b.upload_u32(&step.q_starts)?,
            ctx_lens: b.upload_u32(&step.ctx_lens)?,
            block_tables: b.upload_u32(&step.block_tables)?,
        })
    }

    /// Activations for steps of up to `n` token rows (product inputs in the dtype the backend
    /// multiplies `n` rows in), for [`Self::forward_into`].
    pub fn alloc_activations(&self, n: usize) -> Result<Activations<B>, ModelError> {
        let c = &self.config;
        let b = &self.backend;
        let f32s = |len: usize| b.alloc(DType::F32, len);
        // The product inputs (normed rows, attention output, SwiGLU output) in the dtype the
        // backend multiplies them in at this row count, so no product converts its input.
        let inputs = |len: usize| b.alloc(b.matmul_input_dtype(n), len);
        // Quantized rows where some layer's product takes them (`run_layers` decides per layer).
        let layers = &self.weights.layers;
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let normed_q = layers
            .iter()
            .any(|w| {
                b.takes_quantized_rows(n, h, &w.qkv, InputProducer::RmsNorm)
                    || b.takes_quantized_rows(n, h, &w.gate_up, InputProducer::RmsNorm)
            })
            .then(|| b.alloc_quantized_rows(n, h))
            .transpose()?;
        let act_q = layers
            .iter()
            .any(|w| b.takes_quantized_rows(n, f, &w.down, InputProducer::SwiGlu))
            .then(|| b.alloc_quantized_rows(n, f))
            .transpose()?;
        Ok(Activations {
            hidden: f32s(n * c.hidden_size)?,
            normed: inputs(n * c.hidden_size)?,
            qkv: f32s(n * self.heads.qkv_width())?,
            attn: inputs(n * self.heads.q_width())?,
            sub_out: f32s(n * c.hidden_size)?,
            gate_up: f32s(n * 2 * c.intermediate_size)?,
            act: inputs(n * c.intermediate_size)?,
            normed_q,
            act_q,
        })
    }
}
