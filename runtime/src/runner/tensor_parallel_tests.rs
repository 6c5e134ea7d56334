//! The tensor-parallel runner through the engine (greedy and seeded requests give the whole
//! model's tokens) and its KV block gather/scatter (the unsharded checkpoint layout).

use std::collections::HashMap;
use std::sync::Arc;

use super::TensorParallelRunner;
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::driver::KvBlockIo;
use crate::engine::codec::ByteCodec;
use crate::engine::forward::ForwardModel;
use crate::engine::handle::{Engine, EngineConfig};
use crate::engine::{Prompt, Request, SamplingParams};
use crate::loader::tensor::HostTensor;
use crate::model::LlamaModel;
use crate::model::batch::SeqChunk;
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::model::tensor_parallel::TensorParallel;
use crate::runner::LlamaRunner;
use crate::scheduler::seed::Scheduler;

const BLOCKS: usize = 64;
const BS: usize = 16;

fn config() -> LlamaConfig {
    LlamaConfig {
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 8,
        ..tiny_config()
    }
}

fn tp(
    c: &LlamaConfig,
    w: &HashMap<String, HostTensor>,
    world: usize,
) -> TensorParallelRunner<CpuBackend> {
    let backends = (0..world).map(|_| CpuBackend::with_threads(1)).collect();
    TensorParallelRunner::new(TensorParallel::new(backends, c, w).unwrap(), BLOCKS, BS).unwrap()
}

fn whole(c: &LlamaConfig, w: &HashMap<String, HostTensor>) -> LlamaRunner<CpuBackend> {
    let m = LlamaModel::new(CpuBackend::with_threads(1), c, w).unwrap();
    LlamaRunner::new(m, BLOCKS, BS).unwrap()
}

/// Four requests (two greedy, two seeded) through the default machine: each one's tokens.
fn generate<F: ForwardModel + 'static>(model: F) -> Vec<Vec<u32>> {
    let config = EngineConfig {
        num_blocks: BLOCKS,
        ..EngineConfig::default()
    };
    let engine = Engine::start::<Scheduler, F>(model, Arc::new(ByteCodec), config).unwrap();
    let subs: Vec<_> = (0..4u32)
        .map(|i| {
            let prompt: Vec<u32> = (0..(9 + 7 * i))
                .map(|j| (j * 13 + i * 29 + 3) % 500)
                .collect();
            let mut r = Request::new(Prompt::Tokens(prompt), 40);
            r.sampling = if i < 2 {
                SamplingParams {
                    temperature: 0.0,
                    ..SamplingParams::default()
                }
            } else {
                SamplingParams {
                    temperature: 0.9,
                    top_p: 0.95,
                    seed: Some(u64::from(i)),
                    ..SamplingParams::default()
                }
            };
            engine.submit(r).unwrap()
        })
        .collect();
    let out = subs
        .into_iter()
        .map(|s| {
            let mut tokens = Vec::new();
            for o in s.rx.iter() {
                tokens.extend(o.tokens);
                if o.finished.is_some() {
                    break;
                }
            }
            tokens
        })
        .collect();
    engine.shutdown().unwrap();
    out
}

#[test]
fn the_engine_on_two_ranks_gives_the_whole_models_tokens() {
    let c = config();
    let w = random_weights(&c, 11, WeightDtype::F32);
    let want = generate(whole(&c, &w));
    assert!(want.iter().all(|t| t.len() == 40), "{want:?}");
    assert_eq!(generate(tp(&c, &w, 2)), want, "2 ranks");
    assert_eq!(generate(tp(&c, &w, 4)), want, "4 ranks");
}

fn as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn gathered_blocks_are_the_unsharded_layout_and_scatter_back() {
    let c = config();
    let w = random_weights(&c, 5, WeightDtype::F32);
    let (mut one, mut two) = (whole(&c, &w), tp(&c, &w, 2));
    let prompt: Vec<u32> = (0..21).map(|j| (j * 7 + 1) % 500).collect();
    let table = [3u32, 9];
    let chunk = SeqChunk {
        tokens: &prompt,
        start_pos: 0,
        block_table: &table,
    };
    one.forward(std::slice::from_ref(&chunk)).unwrap();
    two.forward(std::slice::from_ref(&chunk)).unwrap();
    assert_eq!(two.kv_layout(), one.kv_layout());
    for (block, tokens) in [(3u32, BS), (9, 5)] {
        let a = as_f32(&one.read_block(block, tokens).unwrap());
        let b = as_f32(&two.read_block(block, tokens).unwrap());
        assert_eq!(a.len(), b.len());
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0);
        let worst = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "block {block}: {worst} of {scale}"
        );
    }
    // Scatter into fresh ranks (whole and tail blocks), read back the same bytes; then the
    // restored ranks continue as the original ones do.
    let mut restored = tp(&c, &w, 2);
    for (block, tokens) in [(3u32, BS), (9, 5)] {
        let bytes = two.read_block(block, tokens).unwrap();
        restored.write_block(block, tokens, &bytes).unwrap();
        assert_eq!(restored.read_block(block, tokens).unwrap(), bytes);
    }
    let next = SeqChunk {
        tokens: &[42],
        start_pos: prompt.len(),
        block_table: &table,
    };
    let a = two.forward(std::slice::from_ref(&next)).unwrap();
    let b = restored.forward(std::slice::from_ref(&next)).unwrap();
    assert_eq!(a, b);
    assert!(restored.write_block(3, BS, &[0u8; 7]).is_err());
}
