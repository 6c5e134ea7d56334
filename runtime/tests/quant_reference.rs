//! The default model (SmolLM2-135M-Instruct, Q4_1/Q8_0 GGUF) with its weights kept quantized
//! against an f32 reference forward over the same weights dequantized once (gguf-py's arithmetic,
//! `sov::loader::gguf::quant::decode_block`), on the CPU backend.
//!
//! The quantized kernels dequantize in registers with f32 activations, so their greedy tokens
//! must follow the f32 reference at least as long as the previous storage did (every quantized
//! tensor widened to f16 at load, computed here from the same file). Runs only when the model is
//! in sov's cache; prints why it skips otherwise.

use std::collections::HashMap;

use half::f16;
use sov::backend::cpu::CpuBackend;
use sov::loader::tensor::{HostData, HostTensor};
use sov::loader::{ChatMessage, cached_default_model, load_model};
use sov::model::batch::SeqChunk;
use sov::model::{KvCache, LlamaModel};

const BLOCK_SIZE: usize = 16;
const NEW_TOKENS: usize = 48;

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// `NEW_TOKENS` greedy tokens after `prompt` (no EOS stop, so runs compare over equal lengths).
fn greedy(model: &LlamaModel<CpuBackend>, prompt: &[u32]) -> Vec<u32> {
    let blocks = (prompt.len() + NEW_TOKENS).div_ceil(BLOCK_SIZE);
    let mut kv: KvCache<CpuBackend> = model.new_kv_cache(blocks, BLOCK_SIZE).expect("cache");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut chunk = |tokens: &[u32], start_pos| {
        let c = [SeqChunk {
            tokens,
            start_pos,
            block_table: &table,
        }];
        model.forward(&mut kv, &c).expect("forward")
    };
    let logits = chunk(prompt, 0);
    let mut out = vec![argmax(&logits)];
    while out.len() < NEW_TOKENS {
        let last = [*out.last().expect("one token")];
        let pos = prompt.len() + out.len() - 1;
        let logits = chunk(&last, pos);
        out.push(argmax(&logits));
    }
    out
}

/// Every quantized tensor widened by `widen`.
fn widened(
    tensors: &HashMap<String, HostTensor>,
    widen: impl Fn(Vec<f32>) -> HostData,
) -> HashMap<String, HostTensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            let data = match &t.data {
                HostData::Quant(_) => widen(t.to_f32()),
                other => other.clone(),
            };
            let shape = t.shape.clone();
            (name.clone(), HostTensor { shape, data })
        })
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn quantized_kernels_follow_the_f32_reference_at_least_as_long_as_f16_storage() {
    let Some(path) = sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| cached_default_model(&d.cache))
    else {
        println!("skipped: the default model is not in sov's cache (run `sov` once to fetch it)");
        return;
    };
    let loaded = load_model(&path, false).expect("default model loads");
    assert!(
        loaded
            .tensors
            .values()
            .any(|t| matches!(t.data, HostData::Quant(_))),
        "the default model's weights stay quantized"
    );
    // Resident weight bytes (what the CPU backend's buffers hold: blocks as they are, f32 norms)
    // against the GGUF's tensor bytes.
    let file = std::fs::read(&path).expect("model readable");
    let gguf = sov::loader::gguf::reader::Gguf::parse(&file, &path).expect("parses");
    let file_bytes: u64 = gguf
        .tensors
        .iter()
        .filter_map(|t| t.ggml_type.byte_size(&t.ne))
        .sum();
    let host_bytes: usize = loaded
        .tensors
        .values()
        .map(|t| match &t.data {
            HostData::Quant(q) => q.bytes.len(),
            HostData::F32(v) => 4 * v.len(),
            HostData::F16(v) => 2 * v.len(),
            HostData::BF16(v) => 2 * v.len(),
            HostData::Fp8(q) => q.codes.len() + 4 * q.scales.len(),
        })
        .sum();
    let ratio = host_bytes as f64 / file_bytes as f64;
    println!("weights: {host_bytes} bytes resident, {file_bytes} in the GGUF ({ratio:.3}x)");
    assert!(
        ratio <= 1.1,
        "weights take {ratio:.3}x the file's tensor bytes"
    );
    drop(file);
    let build = |tensors: &HashMap<String, HostTensor>| {
        LlamaModel::new(CpuBackend::new(), &loaded.config, tensors).expect("model builds")
    };
    let quant = build(&loaded.tensors);
    let f32_ref = build(&widened(&loaded.tensors, HostData::F32));
    let f16_store = build(&widened(&loaded.tensors, |v| {
        HostData::F16(v.into_iter().map(f16::from_f32).collect())
    }));
    let chat = loaded
        .chat_template
        .as_ref()
        .expect("chat template")
        .apply(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .expect("renders");
    let prompts = [
        loaded
            .tokenizer
            .encode("Once upon a time, there was a little", true)
            .expect("encode"),
        loaded.tokenizer.encode(&chat, false).expect("encode"),
    ];
    for prompt in &prompts {
        let reference = greedy(&f32_ref, prompt);
        let q = common_prefix(&greedy(&quant, prompt), &reference);
        let h = common_prefix(&greedy(&f16_store, prompt), &reference);
        println!(
            "prompt of {} tokens: quantized kernels match the f32 reference for {q} of \
             {NEW_TOKENS} tokens, f16 storage for {h}",
            prompt.len()
        );
        assert!(q >= h, "quantized {q} < f16 storage {h} tokens");
    }
}
