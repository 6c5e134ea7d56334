//! Checkpoint overhead on real decoding (ignored by default; run in release):
//! `cargo test -p sov --release --lib engine::checkpointing::overhead_tests -- --ignored --nocapture`.
//!
//! A SmolLM2-135M-shaped Llama with random weights (30 layers, hidden 576, 9 heads / 3 KV heads,
//! head_dim 64, vocab 49152; f32 KV on the CPU backend) decodes a batch through the default machine (`seed`);
//! one run ignores the machine's `checkpoint` action, the other runs [`checkpoint_core`] each time
//! the machine takes it (every `checkpoint_every` = 64 decode steps), in both KV modes. Reported:
//! decode throughput of each run and the loss.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use super::core_io::checkpoint_core;
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo};
use crate::checkpoint::fixture::{MODEL, SPEC, key};
use crate::checkpoint::{CheckpointStore, KvMode};
use crate::engine::codec::ByteCodec;
use crate::engine::core::{CoreConfig, EngineCore};
use crate::engine::intake::{IntakeLimits, build_sequence};
use crate::engine::{Prompt, Request, SamplingParams};
use crate::model::LlamaModel;
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights};
use crate::runner::LlamaRunner;
use crate::scheduler::seed::Scheduler;
use crate::scheduler::{Machine, Slots};

const SEQS: usize = 4;
const PROMPT: usize = 64;
const NEW: usize = 256;

fn smollm2_135m_shape() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_hidden_layers: 30,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: 64,
        max_position_embeddings: 8192,
        rms_norm_eps: 1e-5,
        rope_theta: 100000.0,
        rope_scaling: None,
        tie_word_embeddings: true,
        attention_bias: false,
    }
}

fn llama_kv(r: &mut LlamaRunner<CpuBackend>) -> Option<&mut dyn KvBlockIo> {
    Some(r)
}

/// Decode tokens per second (prefill excluded), checkpoints taken, and the share of the decode
/// phase's wall time spent inside `checkpoint_core` (robust to load from other processes).
fn run(
    weights: &std::collections::HashMap<String, crate::loader::tensor::HostTensor>,
    mode: Option<KvMode>,
) -> (f64, usize, f64) {
    let config = smollm2_135m_shape();
    let model = LlamaModel::new(CpuBackend::new(), &config, weights).unwrap();
    let blocks = 128;
    let runner = LlamaRunner::new(model, blocks, 16).unwrap();
    let slots = Slots::new();
    let cfg = CoreConfig {
        num_blocks: blocks,
        block_size: 16,
        max_batch: SEQS,
        max_prefill_tokens: 512,
        context_len: 1024,
        max_tokens_cap: 2048,
        eos_ids: vec![],
        kv: Default::default(),
    };
    let limits = IntakeLimits {
        context_len: 1024,
        vocab_size: 49152,
        num_blocks: blocks,
        block_size: 16,
        max_tokens_cap: 2048,
    };
    let mut core = EngineCore::new(runner, Arc::new(ByteCodec), cfg, slots.clone());
    let mut rxs = Vec::new();
    for i in 0..SEQS {
        let (tx, rx) = mpsc::channel();
        let prompt: Vec<u32> = (0..PROMPT)
            .map(|j| ((i * 7919 + j * 131) % 49000) as u32 + 1)
            .collect();
        let mut req = Request::new(Prompt::Tokens(prompt), NEW);
        req.ignore_eos = true;
        req.sampling = SamplingParams::greedy();
        core.enqueue(build_sequence(i as u64 + 1, req, &ByteCodec, &limits, tx).unwrap());
        rxs.push(rx);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cp = mode.map(|m| {
        Checkpointer::new(
            CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap(),
            m,
        )
    });
    let mut machine = Scheduler::new();
    let mut start = None;
    let mut checkpoints = 0;
    let mut in_checkpoint = 0.0;
    let mut decoded_before = 0;
    while !core.is_idle() {
        core.publish();
        let t = machine.step(&mut core, &slots).unwrap();
        let names: Vec<&str> = t.actions.iter().map(|a| a.name()).collect();
        if start.is_none() && names.contains(&"decode") {
            start = Some(Instant::now());
            decoded_before = core.decode_steps();
        }
        if names.contains(&"checkpoint")
            && let Some(cp) = cp.as_mut()
        {
            let t = Instant::now();
            checkpoint_core(
                cp,
                &mut core,
                Scheduler::NAME,
                machine.state_name(),
                llama_kv,
                &|_| Vec::new(),
            )
            .unwrap();
            in_checkpoint += t.elapsed().as_secs_f64();
            checkpoints += 1;
        }
    }
    let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let tokens = (core.decode_steps() - decoded_before) as f64 * SEQS as f64;
    (tokens / secs, checkpoints, in_checkpoint / secs)
}

#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn checkpoint_overhead_on_cpu_decode() {
    let weights = random_weights(&smollm2_135m_shape(), 1, WeightDtype::F32);
    let (base, _, _) = run(&weights, None);
    let (blocks, n_b, share_b) = run(&weights, Some(KvMode::Blocks));
    let (base2, _, _) = run(&weights, None);
    let (recompute, n_r, share_r) = run(&weights, Some(KvMode::Recompute));
    let base = (base + base2) / 2.0;
    println!(
        "SmolLM2-135M shape, CPU, batch {SEQS}, {NEW} new tokens: no checkpoints {base:.1} tok/s; \
         Blocks {blocks:.1} tok/s ({n_b} checkpoints, {:.2}% of decode time in checkpoints); \
         Recompute {recompute:.1} tok/s ({n_r} checkpoints, {:.2}% in checkpoints)",
        share_b * 100.0,
        share_r * 100.0
    );
}
