//! GPU checks of the deterministic mode through the whole model (every layer, the LM head and the
//! runner's decode graphs), bit for bit, on random bf16 weights of a SmolLM2-like shape:
//! - a sequence's greedy tokens and logits alone equal its tokens and logits inside batches of 5,
//!   16 and 33 sequences (different neighbours, odd batch sizes, padded graph buckets);
//! - the K/V that 64 decode steps wrote equal, byte for byte, the K/V one prefill of the same
//!   tokens writes (the recompute resume's rebuild), and the prefill's last logits equal the last
//!   decode step's.
//!
//! Skips with a printed reason without a GPU.

use crate::backend::cuda::{CudaBackend, CudaTuning};
use crate::model::batch::SeqChunk;
use crate::model::config::LlamaConfig;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::model::{KvCache, LlamaModel};
use crate::runner::DecodeGraphs;

const BLOCK: usize = 16;

fn config() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 4099,
        hidden_size: 576,
        intermediate_size: 1536,
        num_hidden_layers: 4,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: 64,
        tie_word_embeddings: false,
        ..tiny_config()
    }
}

fn model() -> Option<LlamaModel<CudaBackend>> {
    let tuning = CudaTuning {
        deterministic: true,
        ..CudaTuning::default()
    };
    let b = match CudaBackend::with_tuning(0, tuning) {
        Ok(b) => b,
        Err(e) => {
            println!("skipping CUDA test: {e}");
            return None;
        }
    };
    let c = config();
    Some(LlamaModel::new(b, &c, &random_weights(&c, 7, WeightDtype::BF16)).expect("model"))
}

/// A prompt of `len` ids for sequence `s`.
fn prompt(s: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 131 + s * 977 + 5) % 4099) as u32)
        .collect()
}

/// Greedy decoding of `prompts` together: prefill all, then `steps` decode steps through the
/// decode graphs. Returns each sequence's tokens, its logits at every step, the cache and the
/// block tables.
#[allow(clippy::type_complexity)]
fn greedy(
    model: &LlamaModel<CudaBackend>,
    prompts: &[Vec<u32>],
    steps: usize,
) -> (
    Vec<Vec<u32>>,
    Vec<Vec<Vec<f32>>>,
    KvCache<CudaBackend>,
    Vec<Vec<u32>>,
) {
    let vocab = model.config().vocab_size;
    let per_seq = (prompts.iter().map(Vec::len).max().unwrap_or(0) + steps + 1).div_ceil(BLOCK);
    let mut kv = model
        .new_kv_cache(per_seq * prompts.len(), BLOCK)
        .expect("kv");
    // Interleaved, reversed block ids: neither contiguous nor the identity.
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| {
            (0..per_seq)
                .rev()
                .map(|j| (j * prompts.len() + s) as u32)
                .collect()
        })
        .collect();
    let chunks: Vec<SeqChunk<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqChunk {
            tokens: p,
            start_pos: 0,
            block_table: t,
        })
        .collect();
    let logits = model.forward(&mut kv, &chunks).expect("prefill");
    let argmax = |row: &[f32]| {
        (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
    };
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut all: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    for (s, seq) in seqs.iter_mut().enumerate() {
        let row = logits[s * vocab..(s + 1) * vocab].to_vec();
        seq.push(argmax(&row));
        all[s].push(row);
    }
    let mut graphs = DecodeGraphs::new();
    for _ in 0..steps {
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, t)| SeqChunk {
                tokens: &s[s.len() - 1..],
                start_pos: s.len() - 1,
                block_table: t,
            })
            .collect();
        let ids = graphs.step(model, &mut kv, &chunks).expect("decode step");
        for (s, id) in ids.into_iter().enumerate() {
            let mut row = vec![0f32; vocab];
            graphs
                .download_logits_row(model.backend(), s, &mut row)
                .expect("logits");
            assert_eq!(id, argmax(&row), "device argmax");
            seqs[s].push(id);
            all[s].push(row);
        }
    }
    (seqs, all, kv, tables)
}

#[test]
fn a_sequence_decodes_the_same_in_any_batch() {
    let Some(model) = model() else { return };
    const STEPS: usize = 40;
    let four: Vec<Vec<u32>> = (0..4).map(|s| prompt(s, 3 + 11 * s)).collect();
    let alone: Vec<_> = four
        .iter()
        .map(|p| greedy(&model, std::slice::from_ref(p), STEPS))
        .collect();
    for batch in [5usize, 16, 33] {
        // The four first, then neighbours of other lengths.
        let mut prompts = four.clone();
        prompts.extend((4..batch).map(|s| prompt(s * 3, 1 + (s * 7) % 60)));
        let (tokens, logits, _, _) = greedy(&model, &prompts, STEPS);
        for (s, (t, l, _, _)) in alone.iter().enumerate() {
            assert_eq!(
                tokens[s], t[0],
                "sequence {s}: tokens in a batch of {batch}"
            );
            for (step, (a, b)) in l[0].iter().zip(&logits[s]).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "sequence {s}: logits of step {step} differ in a batch of {batch}"
                );
            }
        }
        println!(
            "deterministic model: 4 sequences alone == inside a batch of {batch} ({STEPS} steps, logits bit for bit)"
        );
    }
}

#[test]
fn a_prefill_rebuilds_the_kv_decode_steps_wrote() {
    let Some(model) = model() else { return };
    const STEPS: usize = 64;
    for plen in [1usize, 29] {
        let p = prompt(1, plen);
        let (tokens, logits, kv, tables) = greedy(&model, std::slice::from_ref(&p), STEPS);
        // One prefill of every token the decode steps consumed (the last generated token is not
        // in the cache yet).
        let fed = &tokens[0][..plen + STEPS];
        let mut kv2 = model.new_kv_cache(kv.num_blocks(), BLOCK).expect("kv");
        let chunk = SeqChunk {
            tokens: fed,
            start_pos: 0,
            block_table: &tables[0],
        };
        let last = model.forward(&mut kv2, &[chunk]).expect("prefill");
        let want = &logits[0][STEPS];
        assert!(
            last.iter()
                .zip(want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "prompt {plen}: the prefill's last logits differ from the last decode step's"
        );
        let b = model.backend();
        let blocks = fed.len().div_ceil(BLOCK);
        for &blk in &tables[0][..blocks] {
            let (a, c) = (
                kv.read_block(b, blk).expect("read"),
                kv2.read_block(b, blk).expect("read"),
            );
            // A block's last rows past the fed tokens were never written on either side.
            assert!(
                a == c,
                "prompt {plen}: block {blk}'s K/V differ between decode and prefill"
            );
        }
        println!(
            "deterministic model: prefill of {} tokens == {STEPS} decode steps after a prompt of {plen} (K/V of every layer, last logits)",
            fed.len()
        );
    }
}
