//! [`LlamaModel::forward_into`] (the forward pass on caller-held buffers that the runner's CUDA
//! decode graphs capture) against [`LlamaModel::forward_all_logits`] on the CPU, over a step that
//! mixes a prefill chunk and a decode token: the same ops in the same order, so the logits agree
//! bit for bit. And [`LlamaModel::plan_step`], the one planning function, refuses a KV cache of
//! another model's shape on every path.

mod common;

use common::fixture::load;
use sov::backend::cpu::CpuBackend;
use sov::backend::{Backend, BatchMeta, DType};
use sov::model::batch::SeqChunk;
use sov::model::{KvCache, LlamaModel, ModelError};

const BLOCK: usize = 4;

/// The step's metadata uploaded as the model's own forward pass uploads it.
fn meta(
    model: &LlamaModel<CpuBackend>,
    kv: &KvCache<CpuBackend>,
    chunks: &[SeqChunk<'_>],
) -> BatchMeta<CpuBackend> {
    let b = model.backend();
    let p = model.plan_step(kv, chunks).expect("plan");
    BatchMeta {
        n_tokens: p.tokens.len(),
        n_seqs: p.ctx_lens.len(),
        max_q_len: p.max_q_len,
        max_ctx_len: p.max_ctx_len,
        max_blocks_per_seq: p.max_blocks_per_seq,
        positions: b.upload_u32(&p.positions).expect("upload"),
        slot_mapping: b.upload_u32(&p.slot_mapping).expect("upload"),
        q_starts: b.upload_u32(&p.q_starts).expect("upload"),
        ctx_lens: b.upload_u32(&p.ctx_lens).expect("upload"),
        block_tables: b.upload_u32(&p.block_tables).expect("upload"),
    }
}

#[test]
fn forward_into_gives_the_logits_of_forward() {
    let f = load("tiny_llama3");
    let model = LlamaModel::new(CpuBackend::new(), &f.config, &f.weights).expect("model");
    let vocab = f.config.vocab_size;
    let prompt: Vec<u32> = (0..7).map(|i| (i * 13 + 5) % vocab as u32).collect();
    let other: Vec<u32> = (0..5).map(|i| (i * 7 + 2) % vocab as u32).collect();
    let tables: [&[u32]; 2] = [&[3, 0], &[5, 1, 2]];
    // Two caches, one per path, filled the same way: `other`'s first 4 tokens, then a step of
    // `prompt` (a prefill chunk) next to `other`'s fifth token (a decode token).
    let mut kvs = [(); 2].map(|_| model.new_kv_cache(8, BLOCK).expect("kv"));
    for kv in &mut kvs {
        let first = [SeqChunk {
            tokens: &other[..4],
            start_pos: 0,
            block_table: tables[1],
        }];
        model.forward(kv, &first).expect("first step");
    }
    let chunks = [
        SeqChunk {
            tokens: &prompt,
            start_pos: 0,
            block_table: tables[0],
        },
        SeqChunk {
            tokens: &other[4..],
            start_pos: 4,
            block_table: tables[1],
        },
    ];
    let [kv_a, kv_b] = &mut kvs;
    let expected = model.forward_all_logits(kv_a, &chunks).expect("forward"); // [8, vocab]
    let n = prompt.len() + 1;
    let b = model.backend();
    let step = meta(&model, kv_b, &chunks);
    let tokens: Vec<u32> = prompt.iter().chain(&other[4..]).copied().collect(); // [n]
    let ids = b.upload_u32(&tokens).expect("ids");
    let mut acts = model.alloc_activations(n).expect("activations");
    let mut logits = b.alloc(DType::F32, n * vocab).expect("logits"); // [n, vocab]
    model
        .forward_into(&ids, kv_b, &step, &mut acts, &mut logits, n)
        .expect("forward_into");
    let mut got = vec![0f32; n * vocab]; // [n, vocab]
    b.download_f32(&logits, &mut got).expect("download");
    assert_eq!(expected.len(), got.len());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&expected) == bits(&got),
        "forward_into logits differ from forward's"
    );
}

#[test]
fn plan_step_refuses_a_cache_of_another_shape() {
    let f = load("tiny_llama3");
    let model = LlamaModel::new(CpuBackend::new(), &f.config, &f.weights).expect("model");
    let mut smaller = f.config.clone();
    smaller.num_hidden_layers -= 1;
    let mut kv = KvCache::new(model.backend(), &smaller, 4, BLOCK).expect("kv");
    let chunks = [SeqChunk {
        tokens: &[1],
        start_pos: 0,
        block_table: &[0],
    }];
    assert!(matches!(
        model.plan_step(&kv, &chunks),
        Err(ModelError::InvalidBatch(_))
    ));
    assert!(model.forward(&mut kv, &chunks).is_err());
}
