//! Splitting a Llama configuration and its Hugging Face-named weights into the slice one rank of
//! a tensor-parallel group holds (see the parent module for the layout).

use std::collections::HashMap;
use std::ops::Range;

use crate::loader::tensor::{HostData, HostTensor};
use crate::model::ModelError;
use crate::model::config::LlamaConfig;

/// One rank's place in a tensor-parallel group of `world` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Ranks in the group.
    pub world: usize,
}

impl Shard {
    /// This rank's part of `0..total` split into `world` equal parts.
    fn part(&self, total: usize) -> Range<usize> {
        let per = total / self.world;
        self.rank * per..(self.rank + 1) * per
    }
}

/// The configuration of one rank of a `world`-way split: query heads, key/value heads and the MLP
/// width divided by `world` (each must divide evenly); everything else unchanged.
pub fn shard_config(config: &LlamaConfig, world: usize) -> Result<LlamaConfig, ModelError> {
    if world == 0 {
        return Err(ModelError::InvalidConfig(
            "tensor parallelism needs at least one rank".into(),
        ));
    }
    for (what, n) in [
        ("attention heads", config.num_attention_heads),
        ("key/value heads", config.num_key_value_heads),
        ("intermediate_size", config.intermediate_size),
    ] {
        if !n.is_multiple_of(world) || n == 0 {
            return Err(ModelError::InvalidConfig(format!(
                "{n} {what} cannot be split evenly across {world} tensor-parallel ranks"
            )));
        }
    }
    Ok(LlamaConfig {
        num_attention_heads: config.num_attention_heads / world,
        num_key_value_heads: config.num_key_value_heads / world,
        intermediate_size: config.intermediate_size / world,
        ..config.clone()
    })
}

/// How one tensor is split.
enum Split {
    /// Rows `[r]` of a `[rows, cols]` matrix (or of a vector).
    Rows(Range<usize>),
    /// Columns `[c]` of a `[rows, cols]` matrix.
    Cols(Range<usize>),
    /// The whole tensor.
    Whole,
}

/// How tensor `name` of the full model is split for `shard`.
fn split_of(name: &str, config: &LlamaConfig, shard: Shard) -> Split {
    let d = config.head_dim;
    let q = shard.part(config.num_attention_heads);
    let kv = shard.part(config.num_key_value_heads);
    let f = shard.part(config.intermediate_size);
    let heads = |r: Range<usize>| r.start * d..r.end * d;
    let Some(rest) = name.strip_prefix("model.layers.") else {
        return Split::Whole;
    };
    let leaf = rest.split_once('.').map_or("", |(_, leaf)| leaf);
    match leaf {
        "self_attn.q_proj.weight" | "self_attn.q_proj.bias" => Split::Rows(heads(q)),
        "self_attn.k_proj.weight"
        | "self_attn.k_proj.bias"
        | "self_attn.v_proj.weight"
        | "self_attn.v_proj.bias" => Split::Rows(heads(kv)),
        "self_attn.o_proj.weight" => Split::Cols(heads(q)),
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => Split::Rows(f),
        "mlp.down_proj.weight" => Split::Cols(f),
        _ => Split::Whole,
    }
}

/// Rows `r` and columns `c` of a row-major `[_, cols]` matrix: `[r.len(), c.len()]`.
fn slice2d<T: Copy>(data: &[T], cols: usize, r: &Range<usize>, c: &Range<usize>) -> Vec<T> {
    let mut out = Vec::with_capacity(r.len() * c.len());
    for row in r.clone() {
        out.extend_from_slice(&data[row * cols + c.start..row * cols + c.end]);
    }
    out
}

/// The part of one tensor `shard` holds.
fn shard_tensor(name: &str, t: &HostTensor, split: Split) -> Result<HostTensor, ModelError> {
    let (rows, cols) = match t.shape.as_slice() {
        [n] => (*n, 1),
        [r, c] => (*r, *c),
        _ => (0, 0),
    };
    let (r, c) = match split {
        Split::Whole => return Ok(t.clone()),
        Split::Rows(r) => (r, 0..cols),
        Split::Cols(c) => (0..rows, c),
    };
    if rows * cols != t.numel() || t.shape.is_empty() || r.end > rows || c.end > cols {
        return Err(ModelError::InvalidConfig(format!(
            "tensor `{name}` of shape {:?} cannot be split into rows {r:?} and columns {c:?}",
            t.shape
        )));
    }
    let data = match &t.data {
        HostData::F32(v) => HostData::F32(slice2d(v, cols, &r, &c)),
        HostData::F16(v) => HostData::F16(slice2d(v, cols, &r, &c)),
        HostData::BF16(v) => HostData::BF16(slice2d(v, cols, &r, &c)),
        // Quantized blocks run along rows and a column split would cut them: a split tensor is
        // dequantized to f32 first (replicated ones stay quantized).
        HostData::Quant(_) => HostData::F32(slice2d(&t.to_f32(), cols, &r, &c)),
        // FP8 rows likewise (the CPU, the only backend that shards, widens them to f32 anyway).
        HostData::Fp8(_) => HostData::F32(slice2d(&t.to_f32(), cols, &r, &c)),
    };
    let shape = if t.shape.len() == 1 {
        vec![r.len()]
    } else {
        vec![r.len(), c.len()]
    };
    Ok(HostTensor { shape, data })
}

/// The weights rank `shard.rank` holds, from the full model's Hugging Face-named tensors
/// (`config` is the full model's configuration). Every tensor is copied: sharded ones in part,
/// replicated ones whole.
pub fn shard_weights(
    weights: &HashMap<String, HostTensor>,
    config: &LlamaConfig,
    shard: Shard,
) -> Result<HashMap<String, HostTensor>, ModelError> {
    shard_config(config, shard.world)?;
    if shard.rank >= shard.world {
        return Err(ModelError::InvalidConfig(format!(
            "rank {} of a {}-rank group",
            shard.rank, shard.world
        )));
    }
    weights
        .iter()
        .map(|(name, t)| {
            let part = shard_tensor(name, t, split_of(name, config, shard))?;
            Ok((name.clone(), part))
        })
        .collect()
}
