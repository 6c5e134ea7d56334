//! End to end on the GPU: greedy tokens of the tiny-random parity fixtures
//! (`runtime/tests/fixtures/tiny_*`, written by transformers, see `make_parity.py`) from
//! `LlamaModel<CudaBackend>` equal those of `LlamaModel<CpuBackend>` for 32 new tokens of several
//! prompts, one sequence at a time and all prompts batched together. Both backends get the same
//! weights, rounded to bf16 (the CUDA backend stores bf16), so the comparison isolates the compute.
//! The asserted run uses precise mode (f32-accurate matmul inputs and an f32 KV cache, as the CPU
//! backend); the default fast mode (bf16 matmul inputs and KV cache) is run too and its agreement
//! printed: on random tiny models near-tied logits make bf16 greedy runs drift from f32 ones after
//! some tokens.
//! The runner's GPU decode path ([`DecodeGraphs`]: padded batch buckets, CUDA graphs, argmax on
//! the device) is held to the same CPU tokens, and its device argmax to the host argmax of the
//! logits rows it leaves on the device, and a one-row step after a bigger batch keeps the one-row
//! path (its own activations in `matmul_input_dtype(1)`), bit for bit a fresh runner's logits.
//! Eager steps (prefill passes, mixed steps) that choose greedy ids on the device and download
//! only the rows the host samples give what downloading every row and picking on the host gives.
//! Without a usable GPU every test prints why and returns, so CI without CUDA stays green; the GPU
//! machine runs this target through `kernels/gpu-check.sh`.
//! Fixture directory: `$SOV_FIXTURE_DIR`, else `runtime/tests/fixtures` of the source tree.

use std::collections::HashMap;
use std::path::PathBuf;

use half::bf16;

use sov::backend::cpu::CpuBackend;
use sov::backend::cuda::CudaBackend;
use sov::backend::{Backend, DType};
use sov::engine::draw::DrawSpec;
use sov::engine::forward::{ForwardModel, PickedRows, RowPick, pick_on_host};
use sov::loader::hf::{config::parse_config, weights::read_safetensors};
use sov::loader::tensor::{HostData, HostTensor};
use sov::model::batch::SeqChunk;
use sov::model::config::LlamaConfig;
use sov::model::{KvCache, LlamaModel};
use sov::runner::{DecodeGraphs, LlamaRunner};

const BLOCK: usize = 16;
const NEW: usize = 32;

fn fixture_dir() -> PathBuf {
    std::env::var_os("SOV_FIXTURE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")))
}

fn load(name: &str) -> Option<(LlamaConfig, HashMap<String, HostTensor>)> {
    let dir = fixture_dir().join(name);
    let cfg_path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&cfg_path) else {
        println!(
            "skipping {name}: {} not found (set SOV_FIXTURE_DIR)",
            cfg_path.display()
        );
        return None;
    };
    let config = parse_config(&cfg_path, &text).expect("fixture config parses");
    let mut tensors = HashMap::new();
    read_safetensors(
        &dir.join("model.safetensors"),
        &mut tensors,
        &mut HashMap::new(),
        &indicatif::ProgressBar::hidden(),
    )
    .expect("fixture weights read");
    for t in tensors.values_mut() {
        let rounded: Vec<bf16> = t.to_f32().iter().map(|&x| bf16::from_f32(x)).collect();
        t.data = HostData::BF16(rounded);
    }
    Some((config, tensors))
}

/// The GPU, or None after printing why the test is skipped.
fn device() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("skipping CUDA test: {e}");
            None
        }
    }
}

/// `||out - reference|| / ||reference||`.
fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        num += (o as f64 - r as f64).powi(2);
        den += (r as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// A KV cache with room for every prompt plus `NEW` tokens, and one block table per prompt:
/// interleaved, reversed block ids, so tables are neither contiguous nor the identity.
fn cache_and_tables<B: Backend>(
    model: &LlamaModel<B>,
    prompts: &[Vec<u32>],
) -> (KvCache<B>, Vec<Vec<u32>>) {
    let per_seq = (prompts.iter().map(Vec::len).max().unwrap_or(0) + NEW).div_ceil(BLOCK);
    let kv = model
        .new_kv_cache(per_seq * prompts.len(), BLOCK)
        .expect("kv cache");
    let tables = (0..prompts.len())
        .map(|s| {
            (0..per_seq)
                .rev()
                .map(|j| (j * prompts.len() + s) as u32)
                .collect()
        })
        .collect();
    (kv, tables)
}

/// Greedy continuation of every prompt, all sequences in one batch per step.
/// Returns the tokens and the logits of every step (for diagnostics).
fn greedy<B: Backend>(
    model: &LlamaModel<B>,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let vocab = model.config().vocab_size;
    let (mut kv, tables) = cache_and_tables(model, prompts);
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut fed: Vec<usize> = vec![0; prompts.len()];
    let mut all_logits = Vec::new();
    for _ in 0..NEW {
        let chunks: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&fed)
            .zip(&tables)
            .map(|((s, &f), t)| SeqChunk {
                tokens: &s[f..],
                start_pos: f,
                block_table: t,
            })
            .collect();
        let logits = model.forward(&mut kv, &chunks).expect("forward");
        for (i, s) in seqs.iter_mut().enumerate() {
            fed[i] = s.len();
            s.push(argmax(&logits[i * vocab..(i + 1) * vocab]));
        }
        all_logits.push(logits);
    }
    let new = seqs
        .iter()
        .zip(prompts)
        .map(|(s, p)| s[p.len()..].to_vec())
        .collect();
    (new, all_logits)
}

/// Five prompts of lengths 1, 5, 16, 17, 40 (block boundaries and a chunk), ids below `vocab`.
fn fixture_prompts(vocab: u32) -> Vec<Vec<u32>> {
    [1usize, 5, 16, 17, 40]
        .iter()
        .map(|&len| {
            (0..len as u32)
                .map(|i| (i * 37 + len as u32 * 11 + 3) % vocab)
                .collect()
        })
        .collect()
}

/// The fixture on the CPU and on the GPU in precise mode (f32 KV, hi/lo bf16 matmul).
fn cpu_and_precise_gpu(
    config: &LlamaConfig,
    weights: &HashMap<String, HostTensor>,
) -> (LlamaModel<CpuBackend>, LlamaModel<CudaBackend>) {
    let cpu_model = LlamaModel::new(CpuBackend::new(), config, weights).expect("cpu model");
    let gpu = CudaBackend::new(0)
        .expect("device opened above")
        .with_precise(true);
    let gpu_model = LlamaModel::new(gpu, config, weights).expect("cuda model");
    (cpu_model, gpu_model)
}

#[test]
fn tiny_fixtures_greedy_tokens_match_cpu() {
    if device().is_none() {
        return;
    }
    for name in ["tiny_llama3", "tiny_tied", "tiny_untied"] {
        let Some((config, weights)) = load(name) else {
            return;
        };
        let prompts = fixture_prompts(config.vocab_size as u32);
        let (cpu_model, gpu_model) = cpu_and_precise_gpu(&config, &weights);
        let fast = CudaBackend::new(0).expect("device opened above");
        let fast_model = LlamaModel::new(fast, &config, &weights).expect("cuda model");
        let (cpu_tokens, cpu_logits) = greedy(&cpu_model, &prompts);
        let (gpu_tokens, gpu_logits) = greedy(&gpu_model, &prompts);
        let (fast_tokens, fast_logits) = greedy(&fast_model, &prompts);
        let first_diff: Vec<Option<usize>> = fast_tokens
            .iter()
            .zip(&cpu_tokens)
            .map(|(f, c)| f.iter().zip(c).position(|(a, b)| a != b))
            .collect();
        let fast_err = rel_err(&fast_logits[0], &cpu_logits[0]);
        println!(
            "{name}: fast mode: first-step logits rel err {fast_err:.2e}, first differing token per prompt {first_diff:?}"
        );
        let worst = cpu_logits
            .iter()
            .zip(&gpu_logits)
            .map(|(c, g)| rel_err(g, c))
            .fold(0f64, f64::max);
        println!("{name}: batched, worst logits rel err over {NEW} steps {worst:.2e}");
        assert_eq!(
            gpu_tokens, cpu_tokens,
            "{name}: batched greedy tokens differ"
        );
        for p in &prompts {
            let (c, _) = greedy(&cpu_model, std::slice::from_ref(p));
            let (g, _) = greedy(&gpu_model, std::slice::from_ref(p));
            assert_eq!(
                g,
                c,
                "{name}: greedy tokens differ for prompt of {} tokens",
                p.len()
            );
        }
        println!(
            "{name}: {} prompts x {NEW} greedy tokens equal on CPU and CUDA",
            prompts.len()
        );
    }
}

/// Products fed in bf16 by their producers ([`Backend::matmul_input_dtype`]: the RMSNorm and SwiGLU
/// kernels write bf16, no cast kernel) give the very logits of products fed in f32 and cast, bit
/// for bit, over a batched prefill (row gather of the last rows) and 32 batched decode steps.
#[test]
fn bf16_product_inputs_give_the_same_bits() {
    if device().is_none() {
        return;
    }
    for name in ["tiny_llama3", "tiny_tied", "tiny_untied"] {
        let Some((config, weights)) = load(name) else {
            return;
        };
        let prompts = fixture_prompts(config.vocab_size as u32);
        let model = |bf16_inputs: bool| {
            let b = CudaBackend::new(0)
                .expect("device opened above")
                .with_bf16_inputs(bf16_inputs);
            LlamaModel::new(b, &config, &weights).expect("cuda model")
        };
        let (cast, direct) = (model(false), model(true));
        assert_eq!(cast.backend().matmul_input_dtype(5), DType::F32);
        assert_eq!(direct.backend().matmul_input_dtype(5), DType::BF16);
        let (cast_tokens, cast_logits) = greedy(&cast, &prompts);
        let (direct_tokens, direct_logits) = greedy(&direct, &prompts);
        let bits = |l: &[Vec<f32>]| -> Vec<Vec<u32>> {
            l.iter()
                .map(|s| s.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert!(
            bits(&cast_logits) == bits(&direct_logits),
            "{name}: logits differ between bf16 and f32 product inputs"
        );
        assert_eq!(cast_tokens, direct_tokens);
        println!(
            "{name}: {} steps of {} prompts: logits equal bit for bit with bf16 and f32 product inputs",
            cast_logits.len(),
            prompts.len()
        );
    }
}

/// The prompts through one `LlamaModel::forward` pass on a fresh cache: the cache, each
/// sequence's block table, and each prompt with its first greedy token.
fn prefilled(
    model: &LlamaModel<CudaBackend>,
    prompts: &[Vec<u32>],
) -> (KvCache<CudaBackend>, Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let vocab = model.config().vocab_size;
    let (mut kv, tables) = cache_and_tables(model, prompts);
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
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    for (i, s) in seqs.iter_mut().enumerate() {
        s.push(argmax(&logits[i * vocab..(i + 1) * vocab]));
    }
    (kv, tables, seqs)
}

/// Greedy continuation as the engine runs it on CUDA: the prompts through `LlamaModel::forward`,
/// every decode step through [`DecodeGraphs`] (graphs replayed from the third step on).
/// Also checks each step's device argmax against the host argmax of the rows it left on the device.
fn greedy_graphs(model: &LlamaModel<CudaBackend>, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let vocab = model.config().vocab_size;
    let (mut kv, tables, mut seqs) = prefilled(model, prompts);
    let mut graphs = DecodeGraphs::new();
    let mut row = vec![0f32; vocab];
    for _ in 1..NEW {
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
        for (i, &id) in ids.iter().enumerate() {
            graphs
                .download_logits_row(model.backend(), i, &mut row)
                .expect("logits row");
            assert_eq!(id, argmax(&row), "device argmax of row {i}");
        }
        for (s, id) in seqs.iter_mut().zip(ids) {
            s.push(id);
        }
    }
    seqs.iter()
        .zip(prompts)
        .map(|(s, p)| s[p.len()..].to_vec())
        .collect()
}

/// Launches a decode step of the sequences `rows` (indices into `seqs`, each prefilled up to its
/// last token): with `fed`, one token later, each row's token taken on the device from row
/// `fed[i]` of the step in flight.
fn launch_rows(
    graphs: &mut DecodeGraphs,
    model: &LlamaModel<CudaBackend>,
    kv: &mut KvCache<CudaBackend>,
    (seqs, tables): (&[Vec<u32>], &[Vec<u32>]),
    rows: &[usize],
    fed: Option<&[u32]>,
) {
    let ahead = usize::from(fed.is_some());
    let chunks: Vec<SeqChunk<'_>> = rows
        .iter()
        .map(|&r| SeqChunk {
            tokens: &seqs[r][seqs[r].len() - 1..],
            start_pos: seqs[r].len() - 1 + ahead,
            block_table: &tables[r],
        })
        .collect();
    graphs
        .launch(model, kv, &chunks, &[], fed)
        .expect("decode step launched");
}

/// [`greedy_graphs`] with every decode step but the first launched before the step before it
/// came back, its token ids fed on the device from that step's picks
/// ([`DecodeGraphs::launch`] with a row map), as the engine's decode-ahead runs them; with
/// `leave: Some((s, step))`, sequence `s` leaves the batch after decode step `step` (its row
/// left out of the map from then on), so its tokens stop there.
fn greedy_fed(
    model: &LlamaModel<CudaBackend>,
    prompts: &[Vec<u32>],
    leave: Option<(usize, usize)>,
) -> Vec<Vec<u32>> {
    let (mut kv, tables, mut seqs) = prefilled(model, prompts);
    let mut graphs = DecodeGraphs::new();
    let mut in_flight: Vec<usize> = (0..seqs.len()).collect(); // [rows] sequence of each row
    launch_rows(
        &mut graphs,
        model,
        &mut kv,
        (&seqs, &tables),
        &in_flight,
        None,
    );
    for step in 1..NEW {
        let next: Vec<usize> = in_flight
            .iter()
            .copied()
            .filter(|&s| leave.is_none_or(|(gone, after)| s != gone || step < after))
            .collect();
        if step + 1 < NEW {
            let map: Vec<u32> = next
                .iter()
                .map(|s| in_flight.iter().position(|r| r == s).expect("a row") as u32)
                .collect();
            launch_rows(
                &mut graphs,
                model,
                &mut kv,
                (&seqs, &tables),
                &next,
                Some(&map),
            );
            assert_eq!(graphs.in_flight(), 2);
        }
        let ids = graphs.wait(model.backend()).expect("decode step");
        for (&s, id) in in_flight.iter().zip(ids) {
            seqs[s].push(id);
        }
        in_flight = next;
    }
    assert_eq!(graphs.in_flight(), 0);
    // A fed step needs a step in flight with the rows its map names.
    assert!(graphs.wait(model.backend()).is_err());
    let one = [0usize];
    let chunks: Vec<SeqChunk<'_>> = one
        .iter()
        .map(|&r| SeqChunk {
            tokens: &seqs[r][seqs[r].len() - 1..],
            start_pos: seqs[r].len() - 1,
            block_table: &tables[r],
        })
        .collect();
    assert!(
        graphs
            .launch(model, &mut kv, &chunks, &[], Some(&[0]))
            .is_err()
    );
    seqs.iter()
        .zip(prompts)
        .map(|(s, p)| s[p.len()..].to_vec())
        .collect()
}

#[test]
fn fed_decode_steps_give_the_cpu_greedy_tokens() {
    if device().is_none() {
        return;
    }
    for name in ["tiny_llama3", "tiny_untied"] {
        let Some((config, weights)) = load(name) else {
            return;
        };
        let prompts = fixture_prompts(config.vocab_size as u32);
        let (cpu_model, gpu_model) = cpu_and_precise_gpu(&config, &weights);
        let (cpu_tokens, _) = greedy(&cpu_model, &prompts);
        assert_eq!(
            greedy_fed(&gpu_model, &prompts, None),
            cpu_tokens,
            "{name}: decode steps launched ahead differ from CPU"
        );
        // Sequence 1 leaves after decode step 9: the others keep their tokens (rows are
        // independent), it keeps its first 10.
        let mut want = cpu_tokens.clone();
        want[1].truncate(10);
        assert_eq!(
            greedy_fed(&gpu_model, &prompts, Some((1, 9))),
            want,
            "{name}: a row leaving the fed steps changes the others' tokens"
        );
        let (cpu_one, _) = greedy(&cpu_model, &prompts[4..]);
        assert_eq!(
            greedy_fed(&gpu_model, &prompts[4..], None),
            cpu_one,
            "{name}: one sequence's steps launched ahead differ from CPU"
        );
        println!("{name}: decode steps fed on the device give the CPU's greedy tokens");
    }
}

#[test]
fn decode_graphs_greedy_tokens_match_cpu() {
    if device().is_none() {
        return;
    }
    for name in ["tiny_llama3", "tiny_tied", "tiny_untied"] {
        let Some((config, weights)) = load(name) else {
            return;
        };
        // 5 sequences run padded to a bucket of 8; one runs alone (bucket 1).
        let prompts = fixture_prompts(config.vocab_size as u32);
        let (cpu_model, gpu_model) = cpu_and_precise_gpu(&config, &weights);
        let (cpu_tokens, _) = greedy(&cpu_model, &prompts);
        assert_eq!(
            greedy_graphs(&gpu_model, &prompts),
            cpu_tokens,
            "{name}: batched decode-graph tokens differ from CPU"
        );
        let (cpu_one, _) = greedy(&cpu_model, &prompts[4..]);
        assert_eq!(
            greedy_graphs(&gpu_model, &prompts[4..]),
            cpu_one,
            "{name}: single-sequence decode-graph tokens differ from CPU"
        );
        println!("{name}: decode graphs (buckets 8 and 1) give the CPU's greedy tokens");
    }
}

/// One decode step of the last token of each of `seqs` (prefilled up to it) on `graphs`; the
/// logits of row 0.
fn decode_row0(
    graphs: &mut DecodeGraphs,
    model: &LlamaModel<CudaBackend>,
    kv: &mut KvCache<CudaBackend>,
    seqs: &[Vec<u32>],
    tables: &[Vec<u32>],
) -> Vec<f32> {
    let chunks: Vec<SeqChunk<'_>> = seqs
        .iter()
        .zip(tables)
        .map(|(s, t)| SeqChunk {
            tokens: &s[s.len() - 1..],
            start_pos: s.len() - 1,
            block_table: t,
        })
        .collect();
    graphs.step(model, kv, &chunks).expect("decode step");
    let mut row = vec![0f32; model.config().vocab_size];
    graphs
        .download_logits_row(model.backend(), 0, &mut row)
        .expect("logits row");
    row
}

#[test]
fn one_row_step_after_a_big_batch_keeps_the_one_row_path() {
    if device().is_none() {
        return;
    }
    let Some((config, weights)) = load("tiny_llama3") else {
        return;
    };
    // Default mode: the few-row GEMV reads f32 rows, bigger products bf16 ones.
    let backend = CudaBackend::new(0).expect("device opened above");
    let model = LlamaModel::new(backend, &config, &weights).expect("cuda model");
    let vocab = config.vocab_size as u32;
    let seqs: Vec<Vec<u32>> = (0..17u32)
        .map(|s| (0..9).map(|j| (s * 31 + j * 7 + 1) % vocab).collect())
        .collect();
    let (mut kv, tables) = cache_and_tables(&model, &seqs);
    // Prefill every prompt but its last token.
    let chunks: Vec<SeqChunk<'_>> = seqs
        .iter()
        .zip(&tables)
        .map(|(s, t)| SeqChunk {
            tokens: &s[..s.len() - 1],
            start_pos: 0,
            block_table: t,
        })
        .collect();
    model.forward(&mut kv, &chunks).expect("prefill");
    // Row 0 alone on a fresh runner, then on one that ran all 17 rows (bucket 32) first; each
    // step writes row 0's K/V at the same slot from its own products, so the one-row steps see
    // the same cache.
    let fresh = decode_row0(
        &mut DecodeGraphs::new(),
        &model,
        &mut kv,
        &seqs[..1],
        &tables,
    );
    let mut reused = DecodeGraphs::new();
    decode_row0(&mut reused, &model, &mut kv, &seqs, &tables);
    let after_big = decode_row0(&mut reused, &model, &mut kv, &seqs[..1], &tables);
    let b = model.backend();
    let (one, big) = (b.matmul_input_dtype(1), b.matmul_input_dtype(32));
    let sets = reused.activation_sets();
    assert!(
        sets.iter().any(|&(d, rows)| d == one && rows >= 1)
            && sets.iter().any(|&(d, rows)| d == big && rows >= 32)
            && sets.len() == if one == big { 1 } else { 2 },
        "activation sets {sets:?} for one-row inputs {one:?} and 32-row inputs {big:?}"
    );
    assert!(
        fresh
            .iter()
            .zip(&after_big)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "a one-row step after a 17-row step gave other logits than on a fresh runner"
    );
    println!(
        "one-row step after 17 rows: activation sets {sets:?}, logits bit for bit a fresh runner's"
    );
}

/// One eager step of `chunks` on `runner`, answered as `picks` asks: through the runner's own
/// `forward_pick` (`device`: on CUDA the ids are chosen and drawn on the device) or through `forward` and
/// the engine's host pick.
fn picked(
    runner: &mut LlamaRunner<CudaBackend>,
    chunks: &[SeqChunk<'_>],
    picks: &[RowPick],
    device: bool,
) -> PickedRows {
    if device {
        runner
            .forward_pick(chunks, picks)
            .expect("step on the device")
    } else {
        let logits = runner.forward(chunks).expect("step");
        pick_on_host(runner.vocab_size(), logits, picks).expect("host pick")
    }
}

#[test]
fn eager_steps_pick_on_the_device_as_the_host_would() {
    if device().is_none() {
        return;
    }
    let Some((config, weights)) = load("tiny_llama3") else {
        return;
    };
    let vocab = config.vocab_size as u32;
    let seqs: Vec<Vec<u32>> = (0..6u32)
        .map(|s| (0..12).map(|j| (s * 37 + j * 11 + 3) % vocab).collect())
        .collect();
    // Two runners of the same weights, each with its own cache, fed the same steps: one picks
    // through its device path (drawing sampled rows there), the other downloads every row and
    // picks on the host.
    let mut runners: Vec<LlamaRunner<CudaBackend>> = (0..2)
        .map(|r| {
            let backend = CudaBackend::new(0).expect("device opened above");
            let model = LlamaModel::new(backend, &config, &weights).expect("cuda model");
            let (_, tables) = cache_and_tables(&model, &seqs);
            let blocks = tables.iter().map(Vec::len).sum();
            let decode = DecodeGraphs::new().drawing_on_device(r == 0);
            LlamaRunner::with_decode(model, blocks, BLOCK, decode).expect("runner")
        })
        .collect();
    let (_, tables) = cache_and_tables(&runners[0].model, &seqs);
    let chunk = |s: usize, from: usize, to: usize| SeqChunk {
        tokens: &seqs[s][from..to],
        start_pos: from,
        block_table: &tables[s],
    };
    use RowPick::{Argmax, Draw, Logits, Skip};
    let spec = |temperature: f32, top_k: u32, top_p: f32, bits: u64| DrawSpec {
        temperature,
        top_k,
        top_p,
        min_p: 0.02,
        bits: bits << 40,
    };
    // A prefill pass of three whole prompts (less their last token); then a mixed step: those
    // three decode while three prompts run a chunk each (one ends its prompt); then a pass whose
    // rows are all sampled (on the host, or drawn), one of prompt chunks only, and a pure decode
    // step of drawn rows (the decode graphs' path).
    let steps: Vec<(Vec<SeqChunk<'_>>, Vec<RowPick>)> = vec![
        (
            vec![chunk(0, 0, 11), chunk(1, 0, 11), chunk(2, 0, 11)],
            vec![Argmax, Logits, Draw(spec(0.8, 0, 0.9, 4001))],
        ),
        (
            vec![
                chunk(0, 11, 12),
                chunk(1, 11, 12),
                chunk(2, 11, 12),
                chunk(3, 0, 5),
                chunk(4, 0, 12),
                chunk(5, 0, 2),
            ],
            vec![
                Argmax,
                Draw(spec(1.0, 40, 1.0, 77)),
                Argmax,
                Skip,
                Draw(spec(1.3, 0, 0.5, 8000)),
                Logits,
            ],
        ),
        (
            vec![chunk(3, 5, 12), chunk(5, 2, 12)],
            vec![Logits, Draw(spec(0.6, 5, 0.95, 1))],
        ),
        (vec![chunk(3, 5, 9), chunk(5, 2, 7)], vec![Skip, Skip]),
        (
            vec![chunk(3, 9, 10), chunk(5, 7, 8), chunk(4, 11, 12)],
            vec![
                Draw(spec(1.0, 0, 1.0, 5000)),
                Draw(spec(0.7, 3, 0.8, 123)),
                Argmax,
            ],
        ),
    ];
    for (i, (chunks, picks)) in steps.iter().enumerate() {
        let on_device = picked(&mut runners[0], chunks, picks, true);
        let on_host = picked(&mut runners[1], chunks, picks, false);
        assert_eq!(
            on_device.tokens, on_host.tokens,
            "step {i}: greedy ids differ"
        );
        assert!(
            on_device.logits.len() == on_host.logits.len()
                && on_device
                    .logits
                    .iter()
                    .zip(&on_host.logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
            "step {i}: the sampled rows' logits differ"
        );
        assert!(
            on_device
                .tokens
                .iter()
                .zip(picks)
                .all(|(t, p)| t.is_some() == p.is_token()),
            "step {i}: ids {:?} for picks {picks:?}",
            on_device.tokens
        );
    }
    println!(
        "eager steps: device picks and draws equal host picks over {} steps",
        steps.len()
    );
}
