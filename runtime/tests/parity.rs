//! Parity of sov's Llama forward pass (CPU backend, paged KV cache) with Hugging Face
//! transformers 5.17 on tiny random models (fixtures from `tests/fixtures/make_parity.py`).
//!
//! Every check compares logits per position with relative error `||a - b|| / ||b|| < 1e-4`:
//! whole-prompt prefill, token-by-token decode, chunked prefill, and one batch mixing a prefill
//! chunk, a decode token and a fresh prompt, with block sizes 4 and 16 and scattered block ids.

mod common;

use common::fixture::{Fixture, load, rel_err};
use sov::backend::cpu::CpuBackend;
use sov::model::batch::SeqChunk;
use sov::model::{KvCache, LlamaModel};

const TOL: f64 = 1e-4;
const VARIANTS: [&str; 3] = ["tiny_tied", "tiny_untied", "tiny_llama3"];
const NUM_BLOCKS: usize = 64;

/// The fixture's model; `tiny_untied` is built from owned tensors ([`LlamaModel::from_tensors`])
/// so both construction paths are checked against transformers.
fn model(f: &Fixture) -> LlamaModel<CpuBackend> {
    if f.weights.contains_key("lm_head.weight") {
        LlamaModel::from_tensors(CpuBackend::new(), &f.config, f.weights.clone())
    } else {
        LlamaModel::new(CpuBackend::new(), &f.config, &f.weights)
    }
    .expect("fixture builds")
}

/// Block tables from a scattered free list (odd ids descending, then even), so a table never
/// maps logical to physical blocks in order.
struct Blocks(Vec<u32>);

impl Blocks {
    fn new() -> Self {
        let mut ids: Vec<u32> = (0..NUM_BLOCKS as u32)
            .filter(|b| b % 2 == 1)
            .rev()
            .collect();
        ids.extend((0..NUM_BLOCKS as u32).filter(|b| b % 2 == 0));
        Blocks(ids)
    }
    /// A table holding `tokens` positions of `block_size`.
    fn table(&mut self, tokens: usize, block_size: usize) -> Vec<u32> {
        (0..tokens.div_ceil(block_size))
            .map(|_| self.0.pop().expect("enough blocks"))
            .collect()
    }
}

fn check_rows(what: &str, got: &[f32], want: &[f32], vocab: usize) {
    assert_eq!(got.len(), want.len(), "{what}: logits length");
    for (p, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let e = rel_err(g, w);
        assert!(e < TOL, "{what}: position {p}: relative error {e:.2e}");
    }
}

#[test]
fn prefill_matches_transformers() {
    for name in VARIANTS {
        let f = load(name);
        let m = model(&f);
        let vocab = f.config.vocab_size;
        for block_size in [4, 16] {
            for (i, (tokens, want)) in f.prompts.iter().enumerate() {
                let mut kv = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
                let table = Blocks::new().table(tokens.len(), block_size);
                let chunk = [SeqChunk {
                    tokens,
                    start_pos: 0,
                    block_table: &table,
                }];
                let all = m.forward_all_logits(&mut kv, &chunk).expect("forward");
                check_rows(
                    &format!("{name} bs={block_size} prompt {i} prefill"),
                    &all,
                    want,
                    vocab,
                );
                // `forward` returns the last row only, and must agree with a fresh run.
                let mut kv2 = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
                let last = m.forward(&mut kv2, &chunk).expect("forward");
                check_rows(
                    &format!("{name} prompt {i} last"),
                    &last,
                    &want[want.len() - vocab..],
                    vocab,
                );
            }
        }
    }
}

#[test]
fn token_by_token_decode_matches_transformers() {
    for name in VARIANTS {
        let f = load(name);
        let m = model(&f);
        let vocab = f.config.vocab_size;
        for block_size in [4, 16] {
            for (i, (tokens, want)) in f.prompts.iter().enumerate() {
                let mut kv: KvCache<CpuBackend> =
                    m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
                let table = Blocks::new().table(tokens.len(), block_size);
                for t in 0..tokens.len() {
                    let used = (t + 1).div_ceil(block_size);
                    let chunk = [SeqChunk {
                        tokens: &tokens[t..t + 1],
                        start_pos: t,
                        block_table: &table[..used],
                    }];
                    let got = m.forward(&mut kv, &chunk).expect("decode step");
                    check_rows(
                        &format!("{name} bs={block_size} prompt {i} decode step {t}"),
                        &got,
                        &want[t * vocab..(t + 1) * vocab],
                        vocab,
                    );
                }
            }
        }
    }
}

#[test]
fn chunked_prefill_matches_transformers() {
    for name in VARIANTS {
        let f = load(name);
        let m = model(&f);
        let vocab = f.config.vocab_size;
        let (tokens, want) = f.prompts.iter().max_by_key(|p| p.0.len()).expect("prompts");
        for (block_size, chunk_len) in [(4, 5), (16, 7), (4, 3)] {
            let mut kv = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
            let table = Blocks::new().table(tokens.len(), block_size);
            let mut start = 0;
            while start < tokens.len() {
                let end = (start + chunk_len).min(tokens.len());
                let chunk = [SeqChunk {
                    tokens: &tokens[start..end],
                    start_pos: start,
                    block_table: &table,
                }];
                let got = m.forward_all_logits(&mut kv, &chunk).expect("chunk");
                check_rows(
                    &format!("{name} bs={block_size} chunk {start}..{end}"),
                    &got,
                    &want[start * vocab..end * vocab],
                    vocab,
                );
                start = end;
            }
        }
    }
}

#[test]
fn mixed_batch_matches_transformers() {
    for name in VARIANTS {
        let f = load(name);
        let m = model(&f);
        let vocab = f.config.vocab_size;
        let mut by_len: Vec<&(Vec<u32>, Vec<f32>)> = f.prompts.iter().collect();
        by_len.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        let [long, mid, short] = [by_len[0], by_len[1], by_len[2]];
        assert!(
            long.0.len() > 8 && mid.0.len() > 1,
            "{name}: fixture prompts too short for this test"
        );
        for block_size in [4, 16] {
            let mut kv = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
            let mut blocks = Blocks::new();
            let (t_long, t_mid, t_short) = (
                blocks.table(long.0.len(), block_size),
                blocks.table(mid.0.len(), block_size),
                blocks.table(short.0.len(), block_size),
            );
            let split = 7;
            let m1 = mid.0.len() - 1;
            // Step 1: first chunk of the long prompt and all but the last token of the mid one.
            let step1 = [
                SeqChunk {
                    tokens: &long.0[..split],
                    start_pos: 0,
                    block_table: &t_long,
                },
                SeqChunk {
                    tokens: &mid.0[..m1],
                    start_pos: 0,
                    block_table: &t_mid,
                },
            ];
            let got = m.forward_all_logits(&mut kv, &step1).expect("step 1");
            let mut want: Vec<f32> = long.1[..split * vocab].to_vec();
            want.extend_from_slice(&mid.1[..m1 * vocab]);
            check_rows(
                &format!("{name} bs={block_size} step 1"),
                &got,
                &want,
                vocab,
            );
            // Step 2: rest of the long prompt, one decode token of the mid one, a new prompt.
            let step2 = [
                SeqChunk {
                    tokens: &long.0[split..],
                    start_pos: split,
                    block_table: &t_long,
                },
                SeqChunk {
                    tokens: &mid.0[m1..],
                    start_pos: m1,
                    block_table: &t_mid,
                },
                SeqChunk {
                    tokens: &short.0,
                    start_pos: 0,
                    block_table: &t_short,
                },
            ];
            let got = m.forward_all_logits(&mut kv, &step2).expect("step 2");
            let mut want: Vec<f32> = long.1[split * vocab..].to_vec();
            want.extend_from_slice(&mid.1[m1 * vocab..]);
            want.extend_from_slice(&short.1);
            check_rows(
                &format!("{name} bs={block_size} step 2"),
                &got,
                &want,
                vocab,
            );
            // `forward` on the same shapes returns each chunk's last row.
            let mut kv2 = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
            m.forward(&mut kv2, &step1).expect("step 1 again");
            let last = m.forward(&mut kv2, &step2).expect("step 2 again");
            let mut want_last = long.1[long.1.len() - vocab..].to_vec();
            want_last.extend_from_slice(&mid.1[mid.1.len() - vocab..]);
            want_last.extend_from_slice(&short.1[short.1.len() - vocab..]);
            check_rows(
                &format!("{name} bs={block_size} step 2 last rows"),
                &last,
                &want_last,
                vocab,
            );
        }
    }
}

#[test]
fn swapped_out_and_restored_blocks_give_the_same_logits() {
    let f = load("tiny_untied");
    let m = model(&f);
    let vocab = f.config.vocab_size;
    let (tokens, want) = f.prompts.iter().max_by_key(|p| p.0.len()).expect("prompts");
    let block_size = 4;
    let n = tokens.len() - 1;
    let mut kv = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
    let table = Blocks::new().table(tokens.len(), block_size);
    m.forward(
        &mut kv,
        &[SeqChunk {
            tokens: &tokens[..n],
            start_pos: 0,
            block_table: &table,
        }],
    )
    .expect("prefill");
    // Swap every block out to host bytes, into a fresh cache at other block ids.
    let mut kv2 = m.new_kv_cache(NUM_BLOCKS, block_size).expect("cache");
    let moved: Vec<u32> = table.iter().map(|b| (*b + 5) % NUM_BLOCKS as u32).collect();
    for (src, dst) in table.iter().zip(&moved) {
        let bytes = kv.read_block(m.backend(), *src).expect("read");
        assert_eq!(bytes.len(), kv.block_bytes());
        kv2.write_block(m.backend(), *dst, &bytes).expect("write");
    }
    let got = m
        .forward(
            &mut kv2,
            &[SeqChunk {
                tokens: &tokens[n..],
                start_pos: n,
                block_table: &moved,
            }],
        )
        .expect("decode after restore");
    check_rows("decode after swap-in", &got, &want[n * vocab..], vocab);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let f = load("tiny_tied");
    let m = model(&f);
    let mut kv = m.new_kv_cache(4, 4).expect("cache");
    let too_big = [f.config.vocab_size as u32];
    let ok = [1u32, 2, 3, 4, 5];
    assert!(
        m.forward(
            &mut kv,
            &[SeqChunk {
                tokens: &too_big,
                start_pos: 0,
                block_table: &[0]
            }]
        )
        .is_err()
    );
    assert!(
        m.forward(
            &mut kv,
            &[SeqChunk {
                tokens: &ok,
                start_pos: 0,
                block_table: &[0]
            }]
        )
        .is_err()
    );
    assert!(
        m.forward(
            &mut kv,
            &[SeqChunk {
                tokens: &ok,
                start_pos: 0,
                block_table: &[0, 9]
            }]
        )
        .is_err()
    );
    let mut missing = f.weights.clone();
    missing.remove("model.layers.1.mlp.down_proj.weight");
    let err = LlamaModel::new(CpuBackend::new(), &f.config, &missing)
        .err()
        .expect("missing tensor");
    assert!(
        err.to_string()
            .contains("model.layers.1.mlp.down_proj.weight"),
        "{err}"
    );
    let mut misshapen = f.weights.clone();
    misshapen.insert(
        "model.layers.0.self_attn.k_proj.weight".into(),
        sov::loader::tensor::HostTensor {
            shape: vec![16, 64],
            data: sov::loader::tensor::HostData::F32(vec![0.0; 1024]),
        },
    );
    let err = LlamaModel::new(CpuBackend::new(), &f.config, &misshapen)
        .err()
        .expect("wrong shape");
    assert!(
        err.to_string().contains("k_proj") && err.to_string().contains("[16, 64]"),
        "{err}"
    );
    let mut cfg = f.config.clone();
    cfg.intermediate_size += 1;
    assert!(
        LlamaModel::new(CpuBackend::new(), &cfg, &f.weights).is_err(),
        "wrong intermediate size"
    );
}

/// The checks above can fail: dropping the Llama-3.1 frequency scaling, or perturbing one norm
/// weight, moves the logits well past the tolerance.
#[test]
fn parity_checks_detect_a_wrong_model() {
    let f = load("tiny_llama3");
    let (tokens, want) = f.prompts.iter().max_by_key(|p| p.0.len()).expect("prompts");
    let worst = |m: &LlamaModel<CpuBackend>| {
        let mut kv = m.new_kv_cache(NUM_BLOCKS, 4).expect("cache");
        let table = Blocks::new().table(tokens.len(), 4);
        let got = m
            .forward_all_logits(
                &mut kv,
                &[SeqChunk {
                    tokens,
                    start_pos: 0,
                    block_table: &table,
                }],
            )
            .expect("forward");
        let v = f.config.vocab_size;
        got.chunks(v)
            .zip(want.chunks(v))
            .map(|(g, w)| rel_err(g, w))
            .fold(0.0, f64::max)
    };
    let right = worst(&model(&f));
    println!("tiny_llama3: worst relative error per position {right:.2e}");
    assert!(right < TOL);
    let mut no_scaling = f.config.clone();
    no_scaling.rope_scaling = None;
    let m = LlamaModel::new(CpuBackend::new(), &no_scaling, &f.weights).expect("builds");
    assert!(worst(&m) > 10.0 * TOL, "rope scaling made no difference");
    let mut weights = f.weights.clone();
    if let Some(sov::loader::tensor::HostData::F32(v)) = weights
        .get_mut("model.layers.1.post_attention_layernorm.weight")
        .map(|t| &mut t.data)
    {
        v[3] += 0.5;
    }
    let m = LlamaModel::new(CpuBackend::new(), &f.config, &weights).expect("builds");
    assert!(
        worst(&m) > 10.0 * TOL,
        "a perturbed norm weight went unnoticed"
    );
}
