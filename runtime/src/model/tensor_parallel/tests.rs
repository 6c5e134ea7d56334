//! The sharded model against the whole one on the CPU: 2 and 4 simulated ranks give the
//! unsharded logits within f32 rounding and the same greedy tokens.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::loader::tensor::HostTensor;
use crate::model::batch::SeqChunk;
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::model::{KvCache, LlamaModel, ModelError};

const BLOCK: usize = 16;
const BLOCKS: usize = 8;

/// The tiny shape with heads that split 4 ways (8 query, 4 key/value heads of 8).
fn config(bias: bool) -> LlamaConfig {
    LlamaConfig {
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 8,
        attention_bias: bias,
        ..tiny_config()
    }
}

/// Something that runs a forward step: the whole model or a tensor-parallel group.
trait Step {
    fn step(&mut self, tokens: &[u32], start: usize, table: &[u32]) -> Vec<f32>;
}

struct Whole(LlamaModel<CpuBackend>, KvCache<CpuBackend>);
struct Split(TensorParallel<CpuBackend>, Vec<KvCache<CpuBackend>>);

impl Step for Whole {
    fn step(&mut self, tokens: &[u32], start: usize, table: &[u32]) -> Vec<f32> {
        let chunk = SeqChunk {
            tokens,
            start_pos: start,
            block_table: table,
        };
        self.0.forward_all_logits(&mut self.1, &[chunk]).unwrap()
    }
}

impl Step for Split {
    fn step(&mut self, tokens: &[u32], start: usize, table: &[u32]) -> Vec<f32> {
        let chunk = SeqChunk {
            tokens,
            start_pos: start,
            block_table: table,
        };
        self.0.forward_all_logits(&mut self.1, &[chunk]).unwrap()
    }
}

fn whole(c: &LlamaConfig, w: &HashMap<String, HostTensor>) -> Whole {
    let m = LlamaModel::new(CpuBackend::with_threads(1), c, w).unwrap();
    let kv = m.new_kv_cache(BLOCKS, BLOCK).unwrap();
    Whole(m, kv)
}

fn split(c: &LlamaConfig, w: &HashMap<String, HostTensor>, world: usize) -> Split {
    let backends = (0..world).map(|_| CpuBackend::with_threads(1)).collect();
    let tp = TensorParallel::new(backends, c, w).unwrap();
    let kvs = tp.new_kv_caches(BLOCKS, BLOCK).unwrap();
    Split(tp, kvs)
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in row.iter().enumerate() {
        if *x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill of a 21-token prompt (all rows' logits), then `decode` greedy steps: every step's
/// logits, and the tokens.
fn run(m: &mut dyn Step, vocab: usize, decode: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let table: Vec<u32> = (0..BLOCKS as u32).collect();
    let prompt: Vec<u32> = (0..21u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut logits = vec![m.step(&prompt, 0, &table)];
    let mut tokens = Vec::new();
    for pos in prompt.len()..prompt.len() + decode {
        let last = logits.last().map(|l| &l[l.len() - vocab..]).unwrap();
        let t = argmax(last);
        tokens.push(t);
        logits.push(m.step(&[t], pos, &table));
    }
    (logits, tokens)
}

fn check_equivalent(bias: bool, world: usize) {
    let c = config(bias);
    let w = random_weights(&c, 7, WeightDtype::F32);
    let (ref_logits, ref_tokens) = run(&mut whole(&c, &w), c.vocab_size, 24);
    let (tp_logits, tp_tokens) = run(&mut split(&c, &w, world), c.vocab_size, 24);
    let scale = ref_logits
        .iter()
        .flatten()
        .fold(0f32, |m, x| m.max(x.abs()));
    assert!(
        scale > 0.0,
        "logits are all zero: the test would prove nothing"
    );
    for (step, (a, b)) in ref_logits.iter().zip(&tp_logits).enumerate() {
        assert_eq!(a.len(), b.len());
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "world {world}, bias {bias}, step {step}: logits differ by {worst} (scale {scale})"
        );
    }
    assert_eq!(
        ref_tokens, tp_tokens,
        "world {world}, bias {bias}: greedy tokens"
    );
}

#[test]
fn two_ranks_give_the_whole_models_logits_and_tokens() {
    check_equivalent(false, 2);
}

#[test]
fn four_ranks_give_the_whole_models_logits_and_tokens() {
    check_equivalent(false, 4);
}

#[test]
fn sharded_attention_bias_matches() {
    check_equivalent(true, 2);
}

#[test]
fn a_split_that_does_not_divide_is_refused() {
    let c = config(false);
    let err = shard_config(&c, 3).unwrap_err();
    assert!(
        matches!(&err, ModelError::InvalidConfig(m) if m.contains("across 3")),
        "{err}"
    );
    let w = random_weights(&c, 7, WeightDtype::F32);
    let backends = (0..3).map(|_| CpuBackend::with_threads(1)).collect();
    assert!(TensorParallel::new(backends, &c, &w).is_err());
}

#[test]
fn shards_partition_every_split_tensor() {
    let c = config(true);
    let w = random_weights(&c, 3, WeightDtype::F32);
    let parts: Vec<_> = (0..4)
        .map(|rank| shard_weights(&w, &c, Shard { rank, world: 4 }).unwrap())
        .collect();
    let name = "model.layers.1.self_attn.o_proj.weight";
    let full = w[name].to_f32();
    let cols = c.num_attention_heads * c.head_dim;
    let per = cols / 4;
    for (rank, p) in parts.iter().enumerate() {
        assert_eq!(p[name].shape, vec![c.hidden_size, per]);
        let mine = p[name].to_f32();
        for row in 0..c.hidden_size {
            assert_eq!(
                &mine[row * per..(row + 1) * per],
                &full[row * cols + rank * per..row * cols + (rank + 1) * per]
            );
        }
    }
    let k = "model.layers.0.self_attn.k_proj.bias";
    let joined: Vec<f32> = parts.iter().flat_map(|p| p[k].to_f32()).collect();
    assert_eq!(joined, w[k].to_f32());
    assert_eq!(
        parts[2]["model.embed_tokens.weight"].to_f32(),
        w["model.embed_tokens.weight"].to_f32()
    );
}

#[test]
fn a_failing_rank_releases_the_others() {
    let group = Arc::new(LocalGroup::new(2));
    let r0 = LocalGroup::rank(&group, 0).unwrap();
    let backend = CpuBackend::with_threads(1);
    let waiter = {
        let backend = backend.clone();
        std::thread::spawn(move || {
            let mut buf = crate::backend::Backend::upload_f32(&backend, &[1.0; 4]).unwrap();
            AllReduce::<CpuBackend>::all_reduce_sum(&r0, &backend, &mut buf, 4)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    group.abort();
    let r = waiter.join().unwrap();
    assert!(r.is_err(), "rank 0 must leave the all-reduce with an error");
    assert!(LocalGroup::rank(&group, 2).is_none());
}
