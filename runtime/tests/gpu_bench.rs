//! Model-level GPU benchmarks, run on the device by `kernels/gpu-check.sh` (ignored by a plain
//! `cargo test`): `cargo test --release -p sov --test gpu_bench -- --ignored --nocapture
//! --test-threads=1`. The kernel-level benchmarks (decode attention, decode products) sit with the
//! kernels, in the library's `backend::cuda::bench`.
//!
//! `bench_llama8b_decode`: a `LlamaModel<CudaBackend>` of the Llama-3-8B shape with random bf16
//! weights, prompt 128, 256 new tokens, greedy, EOS ignored, at batch 1 / 16 / 64 / 256
//! (`SOV_BENCH_BATCHES=1,16` narrows the sweep). Every run is the model's own layer stack: the
//! prompts in one [`LlamaModel::forward`] step, then the decode steps three ways:
//! - `llama8b_decode`: the runner's [`DecodeGraphs`] launching every step eagerly (greedy ids on
//!   the device);
//! - `llama8b_decode_graph`: the same runner replaying each step from a CUDA graph, as the engine
//!   decodes (`same_as_eager` says the tokens agree);
//! - `model_forward`: [`LlamaModel::forward`] per step, logits downloaded, argmax on the host.
//!
//! Reported: output tokens/s over prefill + decode wall time, decode-only tokens/s and ms per
//! decode step. Without a usable GPU the benchmark prints why and returns.

use std::collections::HashMap;
use std::time::Instant;

use half::bf16;
use rayon::prelude::*;

use sov::backend::Backend;
use sov::backend::cuda::CudaBackend;
use sov::loader::tensor::{HostData, HostTensor};
use sov::model::batch::SeqChunk;
use sov::model::config::LlamaConfig;
use sov::model::{KvCache, LlamaModel};
use sov::runner::DecodeGraphs;

type R<T> = Result<T, Box<dyn std::error::Error>>;

const HIDDEN: usize = 4096;
const INTER: usize = 14336;
const LAYERS: usize = 32;
const VOCAB: usize = 128256;
const PROMPT: usize = 128;
const NEW_TOKENS: usize = 256;
const BLOCK: usize = 16;

/// Host tensor of random bf16 values in `[-scale, scale)`, filled in parallel.
fn host_random(shape: Vec<usize>, seed: u64, scale: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut data = vec![bf16::ZERO; n]; // [numel]
    data.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut z = seed ^ ((c as u64 + 1) * 0x9e3779b97f4a7c15);
            for v in chunk {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                *v = bf16::from_f32(((z >> 40) as f32 / 16777216.0 * 2.0 - 1.0) * scale);
            }
        });
    HostTensor {
        shape,
        data: HostData::BF16(data),
    }
}

/// Llama-3-8B's shape with `max_positions` positions.
fn config(max_positions: usize) -> LlamaConfig {
    LlamaConfig {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: INTER,
        num_hidden_layers: LAYERS,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        max_position_embeddings: max_positions,
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: None,
        tie_word_embeddings: false,
        attention_bias: false,
    }
}

/// Random weights under Hugging Face names: uniform with variance `1 / fan_in` for the products,
/// ones for the norms.
fn random_weights() -> HashMap<String, HostTensor> {
    let ones = |n: usize| HostTensor {
        shape: vec![n],
        data: HostData::F32(vec![1.0; n]),
    };
    let s = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
    let mut w = HashMap::new();
    w.insert(
        "model.embed_tokens.weight".to_string(),
        host_random(vec![VOCAB, HIDDEN], 1, 1.0),
    );
    w.insert(
        "lm_head.weight".to_string(),
        host_random(vec![VOCAB, HIDDEN], 2, s(HIDDEN)),
    );
    w.insert("model.norm.weight".to_string(), ones(HIDDEN));
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        let seed = 100 + 10 * l as u64;
        w.insert(format!("{p}.input_layernorm.weight"), ones(HIDDEN));
        w.insert(format!("{p}.post_attention_layernorm.weight"), ones(HIDDEN));
        let products = [
            ("self_attn.q_proj", 4096, HIDDEN),
            ("self_attn.k_proj", 1024, HIDDEN),
            ("self_attn.v_proj", 1024, HIDDEN),
            ("self_attn.o_proj", HIDDEN, 4096),
            ("mlp.gate_proj", INTER, HIDDEN),
            ("mlp.up_proj", INTER, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTER),
        ];
        for (i, (name, rows, cols)) in products.into_iter().enumerate() {
            w.insert(
                format!("{p}.{name}.weight"),
                host_random(vec![rows, cols], seed + i as u64, s(cols)),
            );
        }
    }
    w
}

/// How the decode steps of a run go.
#[derive(Clone, Copy, PartialEq)]
enum Decode {
    /// [`DecodeGraphs`], eager launches.
    Eager,
    /// [`DecodeGraphs`], replayed graphs.
    Graphs,
    /// [`LlamaModel::forward`], argmax on the host.
    Forward,
}

/// Timing of one run.
struct Run {
    prefill_s: f64,
    total_s: f64,
    /// Every new token of sequence 0.
    tokens_seq0: Vec<u32>,
    /// Graphs captured at the end (0 unless [`Decode::Graphs`] and capture worked).
    captured: usize,
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prompts of `batch` sequences, each in its own blocks, then `steps - 1` decode steps.
fn run(
    model: &LlamaModel<CudaBackend>,
    kv: &mut KvCache<CudaBackend>,
    batch: usize,
    steps: usize,
    how: Decode,
) -> R<Run> {
    let per_seq = (PROMPT + NEW_TOKENS).div_ceil(BLOCK);
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| (0..per_seq).map(|j| (s * per_seq + j) as u32).collect())
        .collect();
    let mut seqs: Vec<Vec<u32>> = (0..batch)
        .map(|s| {
            (0..PROMPT)
                .map(|i| ((s * 7919 + i * 104729) % VOCAB) as u32)
                .collect()
        })
        .collect();
    let mut graphs = DecodeGraphs::with_graphs(how == Decode::Graphs);
    let start = Instant::now();
    let mut prefill_s = 0.0;
    for step in 0..steps {
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, t)| {
                let fed = if step == 0 { 0 } else { s.len() - 1 };
                SeqChunk {
                    tokens: &s[fed..],
                    start_pos: fed,
                    block_table: t,
                }
            })
            .collect();
        let next: Vec<u32> = if step == 0 || how == Decode::Forward {
            let logits = model.forward(kv, &chunks)?; // [batch, vocab]
            logits.chunks(VOCAB).map(argmax).collect()
        } else {
            graphs.step(model, kv, &chunks)?
        };
        for (s, id) in seqs.iter_mut().zip(next) {
            s.push(id);
        }
        if step == 0 {
            prefill_s = start.elapsed().as_secs_f64();
        }
    }
    Ok(Run {
        prefill_s,
        total_s: start.elapsed().as_secs_f64(),
        tokens_seq0: seqs[0][PROMPT..].to_vec(),
        captured: graphs.captured(),
    })
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_llama8b_decode() -> R<()> {
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            println!("skipping CUDA benchmark: {e}");
            return Ok(());
        }
    };
    let t0 = Instant::now();
    let model = LlamaModel::from_tensors(backend, &config(1024), random_weights())?;
    model.backend().synchronize()?;
    println!(
        "BENCH llama8b random bf16 weights ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let batches: Vec<usize> = std::env::var("SOV_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    for batch in batches {
        let per_seq = (PROMPT + NEW_TOKENS).div_ceil(BLOCK);
        model.reserve_scratch(batch * PROMPT, batch, PROMPT + NEW_TOKENS)?;
        let mut kv = model.new_kv_cache(batch * per_seq, BLOCK)?;
        // Warm-up: compiles kernels, sizes scratch and library workspaces.
        run(&model, &mut kv, batch, 3, Decode::Eager)?;
        let eager = run(&model, &mut kv, batch, NEW_TOKENS, Decode::Eager)?;
        let graph = run(&model, &mut kv, batch, NEW_TOKENS, Decode::Graphs)?;
        let forward = run(&model, &mut kv, batch, NEW_TOKENS, Decode::Forward)?;
        let report = |name: &str, r: &Run, extra: String| {
            println!(
                "BENCH {name} batch={batch} prompt={PROMPT} new={NEW_TOKENS} total_s={:.3} prefill_s={:.3} \
                 tok_per_s={:.1} decode_tok_per_s={:.1} ms_per_step={:.2} first_tokens_seq0={:?}{extra}",
                r.total_s,
                r.prefill_s,
                (batch * NEW_TOKENS) as f64 / r.total_s,
                (batch * (NEW_TOKENS - 1)) as f64 / (r.total_s - r.prefill_s),
                (r.total_s - r.prefill_s) * 1e3 / (NEW_TOKENS - 1) as f64,
                &r.tokens_seq0[..r.tokens_seq0.len().min(4)],
            )
        };
        report(
            "llama8b_decode_graph",
            &graph,
            format!(
                " graphs={} same_as_eager={}",
                graph.captured,
                graph.tokens_seq0 == eager.tokens_seq0
            ),
        );
        report("llama8b_decode", &eager, String::new());
        report(
            "model_forward",
            &forward,
            " (host argmax over downloaded logits)".into(),
        );
    }
    Ok(())
}
