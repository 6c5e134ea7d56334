//! GPU benchmarks, run on the device by `kernels/gpu-check.sh` (ignored by a plain `cargo test`):
//! `cargo test --release -p sov --lib backend::cuda::bench -- --ignored --nocapture --test-threads=1`.
//!
//! - `bench_decode_attention`: paged decode attention at Llama-3-8B heads (32 q / 8 kv, d 128) for
//!   (batch, context) = (1, 4096), (64, 2048), (256, 1024); bytes of K and V read per launch over the
//!   median time, next to a device-to-device copy measured in the same process.
//! - `bench_llama8b_decode`: the Llama-3-8B shape with random bf16 weights, prompt 128, 256 new
//!   tokens, greedy on the device, EOS ignored, at batch 1 / 16 / 64 / 256: a forward loop written
//!   directly against the Backend ops (the model crate's loop is not used here).
//!   Reported: output tokens/s over prefill + decode wall time, and decode-only tokens/s; once
//!   with eager launches and once with decode steps replayed from a CUDA graph.
//! - `bench_decode_matmuls`: the products of a Llama-3-8B decode step (qkv, o, gate_up, down, lm
//!   head) at 1 and 4 rows, through cuBLAS (with its input cast) and through `gemv.cu`; weight
//!   bytes over the median time. Enough weight copies are cycled that none is served from L2.
//! - `bench_llama8b_model_forward`: the same shape through `LlamaModel<CudaBackend>::forward`
//!   (logits downloaded, argmax on the host), as the engine drives it today.
//!
//! Times are CUDA-event medians after warm-up.

use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::tests::device;
use super::{CudaBackend, CudaBuffer, SamplingRow};
use crate::backend::{
    AttentionShape, Backend, BatchMeta, DType, HeadShape, KvLayer, RmsNorm, RopeTables, SwiGluShape,
};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// Median milliseconds of `iters` runs of `f` (after `warmup` runs), timed with CUDA events.
fn time_ms(b: &CudaBackend, warmup: usize, iters: usize, mut f: impl FnMut() -> R<()>) -> R<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = b.ctx.new_event(flags)?;
        let end = b.ctx.new_event(flags)?;
        start.record(&b.stream)?;
        f()?;
        end.record(&b.stream)?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[iters / 2])
}

/// Milliseconds per call when `reps` calls are queued back to back between two events (median of
/// `iters` runs): the launch latency of every call but the first hides behind the work before it,
/// as in a decode step replayed from a graph, where no host launch sits between the kernels.
fn back_to_back_ms(
    b: &CudaBackend,
    reps: usize,
    iters: usize,
    mut f: impl FnMut() -> R<()>,
) -> R<f64> {
    let ms = time_ms(b, 1, iters, || {
        for _ in 0..reps {
            f()?;
        }
        Ok(())
    })?;
    Ok(ms / reps as f64)
}

/// Device-to-device copy bandwidth, (read + write) bytes per second.
fn copy_bandwidth(b: &CudaBackend) -> R<f64> {
    let bytes = 1usize << 30;
    let src = b.alloc(DType::U32, bytes / 4)?;
    let dst = b.alloc(DType::U32, bytes / 4)?;
    let ms = time_ms(b, 3, 20, || Ok(b.copy_raw(dst.ptr(), src.ptr(), bytes)?))?;
    Ok(2.0 * bytes as f64 / (ms * 1e-3))
}

/// Milliseconds per call when `reps` calls (`f(0)`, `f(1)`, ...) are captured into one CUDA graph
/// and replayed (median of `iters` replays, each between two events): no host launch sits between
/// the kernels, as in a decode step replayed by the engine. `f` runs once eagerly per index first,
/// so scratch and workspaces exist before the capture.
fn graph_ms(
    b: &CudaBackend,
    reps: usize,
    iters: usize,
    mut f: impl FnMut(usize) -> Result<(), crate::backend::BackendError>,
) -> R<f64> {
    for i in 0..reps {
        f(i)?;
    }
    let graph = b.capture(|| (0..reps).try_for_each(&mut f))?;
    let ms = time_ms(b, 2, iters, || Ok(b.replay(&graph)?))?;
    Ok(ms / reps as f64)
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_decode_attention() -> R<()> {
    let Some(b) = device() else { return Ok(()) };
    let copy = copy_bandwidth(&b)?;
    println!(
        "BENCH copy_d2d bytes=2GiB bandwidth={:.1} GB/s (read+write)",
        copy / 1e9
    );
    let heads = HeadShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let bs = 16;
    let mut rng = StdRng::seed_from_u64(7);
    // SOV_BENCH_ATTN_SHAPES=1x256,1x4096 replaces the three (batch, context) shapes
    // (contexts are rounded up to whole blocks).
    let shapes: Vec<(usize, usize)> = std::env::var("SOV_BENCH_ATTN_SHAPES")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|x| {
                    let (b, c) = x.trim().split_once('x')?;
                    Some((b.parse().ok()?, c.parse().ok()?))
                })
                .filter(|&(b, c): &(usize, usize)| b > 0 && c > 0)
                .collect()
        })
        .filter(|v: &Vec<(usize, usize)>| !v.is_empty())
        .unwrap_or_else(|| vec![(1, 4096), (64, 2048), (256, 1024)]);
    for (batch, ctx) in shapes {
        let ctx = ctx.div_ceil(bs) * bs;
        let blocks_per_seq = ctx / bs;
        let num_blocks = batch * blocks_per_seq;
        let cache_len = num_blocks * bs * heads.kv_width();
        // Enough cache copies (K and V: [num_blocks, bs, kv_width] bf16 each) are cycled that a call
        // finds its KV in DRAM, not in the 50 MB L2 a previous call left it in -- as the 32 layers of
        // a decode step do. The "warm" figures re-read copy 0, which at (1, 4096) (16.8 MB) is L2.
        let copies = (512usize << 20).div_ceil(2 * cache_len * 2).max(1);
        let mut caches = Vec::with_capacity(copies);
        for i in 0..copies as u32 {
            let mut kc = b.alloc(DType::BF16, cache_len)?;
            let mut vc = b.alloc(DType::BF16, cache_len)?;
            b.fill_random_bf16(&mut kc, 1 + 2 * i, 1.0)?;
            b.fill_random_bf16(&mut vc, 2 + 2 * i, 1.0)?;
            caches.push((kc, vc));
        }
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(&mut rng);
        let q: Vec<f32> = (0..batch * heads.qkv_width())
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let meta = BatchMeta::<CudaBackend> {
            n_tokens: batch,
            n_seqs: batch,
            max_q_len: 1,
            max_ctx_len: ctx,
            max_blocks_per_seq: blocks_per_seq,
            positions: b.upload_u32(&vec![ctx as u32 - 1; batch])?,
            slot_mapping: b.upload_u32(&vec![u32::MAX; batch])?,
            q_starts: b.upload_u32(&(0..=batch as u32).collect::<Vec<_>>())?,
            ctx_lens: b.upload_u32(&vec![ctx as u32; batch])?,
            block_tables: b.upload_u32(&ids)?,
        };
        let qb = b.upload_f32(&q)?;
        let mut out = b.alloc(DType::F32, batch * heads.q_width())?; // [batch, q_width] f32
        let shape = AttentionShape {
            heads,
            block_size: bs,
            scale: 1.0 / (128f32).sqrt(),
        };
        let mut call = |i: usize| {
            let (kc, vc) = &caches[i % copies];
            b.paged_attention(&qb, KvLayer { k: kc, v: vc }, &meta, &mut out, shape)
        };
        let ms = time_ms(&b, 5, 50, || Ok(call(0)?))?;
        let b2b_ms = back_to_back_ms(&b, 20, 20, || Ok(call(0)?))?;
        let graph_warm_ms = graph_ms(&b, 20, 20, &mut call)?;
        let mut next = 0;
        let cold_ms = time_ms(&b, 5, 50, || {
            next += 1;
            Ok(call(next)?)
        })?;
        let graph_cold_ms = graph_ms(&b, copies.max(20).next_multiple_of(copies), 20, &mut call)?;
        let kv_bytes = 2.0 * (batch * ctx * heads.kv_width() * 2) as f64;
        let pct = |ms: f64| 100.0 * kv_bytes / (ms * 1e-3) / copy;
        let plan = super::attention::plan_splits(
            batch,
            8,
            ctx,
            b.split_target_ctas,
            b.split_max_tokens,
            b.split_min_tokens,
        );
        println!(
            "BENCH decode_attention batch={batch} ctx={ctx} time_us={:.1} kv_bytes={:.1}MB bandwidth={:.1} GB/s \
             pct_of_copy={:.1}% back_to_back_us={:.1} back_to_back_pct_of_copy={:.1}% splits={} \
             split_tokens={}",
            ms * 1e3,
            kv_bytes / 1e6,
            kv_bytes / (ms * 1e-3) / 1e9,
            pct(ms),
            b2b_ms * 1e3,
            pct(b2b_ms),
            plan.splits,
            plan.split_tokens
        );
        println!(
            "BENCH decode_attention_graph batch={batch} ctx={ctx} cache_copies={copies} \
             warm_graph_us={:.1} warm_graph_pct_of_copy={:.1}% cold_one_us={:.1} cold_one_pct_of_copy={:.1}% \
             cold_graph_us={:.1} cold_graph_pct_of_copy={:.1}%",
            graph_warm_ms * 1e3,
            pct(graph_warm_ms),
            cold_ms * 1e3,
            pct(cold_ms),
            graph_cold_ms * 1e3,
            pct(graph_cold_ms)
        );
    }
    Ok(())
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_decode_matmuls() -> R<()> {
    let Some(mut b) = device() else { return Ok(()) };
    let gemv_max_rows = b.tuning.gemv_max_rows;
    // (name, k, m): x [n, k] @ w [m, k]^T.
    let shapes = [
        ("qkv", 4096usize, 6144usize),
        ("o", 4096, 4096),
        ("gate_up", 4096, 28672),
        ("down", 14336, 4096),
        ("lm_head", 4096, 128256),
    ];
    for (name, k, m) in shapes {
        let bytes = m * k * 2;
        let copies = (512usize << 20).div_ceil(bytes).max(2);
        let ws: Vec<CudaBuffer> = (0..copies)
            .map(|i| random_weight(&b, m * k, 40 + i as u32, k))
            .collect::<R<_>>()?;
        for n in [1usize, 4] {
            let x = b.upload_f32(&super::reference::random(n * k, 1.0, 5))?; // [n, k]
            let mut out = b.alloc(DType::F32, n * m)?; // [n, m]
            let mut us = [0f64; 2]; // [cuBLAS, GEMV] microseconds per product
            for (path, gemv) in [false, true].into_iter().enumerate() {
                b.tuning.gemv_max_rows = if gemv { 4 } else { 0 };
                let ms = time_ms(&b, 2, 10, || {
                    for w in &ws {
                        b.matmul(&x, w, &mut out, n, k, m)?;
                    }
                    Ok(())
                })?;
                us[path] = ms * 1e3 / copies as f64;
            }
            b.tuning.gemv_max_rows = gemv_max_rows;
            let gbps = |t: f64| bytes as f64 / (t * 1e-6) / 1e9;
            println!(
                "BENCH matmul {name} n={n} k={k} m={m} weight_mb={} cublas_us={:.1} cublas_gbps={:.0} \
                 gemv_us={:.1} gemv_gbps={:.0} gemv_speedup={:.2}",
                bytes >> 20,
                us[0],
                gbps(us[0]),
                us[1],
                gbps(us[1]),
                us[0] / us[1]
            );
        }
    }
    Ok(())
}

/// Weights of one Llama layer with fused projections, as the Backend contract lays them out.
struct Layer {
    attn_norm: CudaBuffer,
    wqkv: CudaBuffer,
    wo: CudaBuffer,
    mlp_norm: CudaBuffer,
    w_gate_up: CudaBuffer,
    w_down: CudaBuffer,
}

struct Llama {
    layers: Vec<Layer>,
    embed: CudaBuffer,
    norm: CudaBuffer,
    lm_head: CudaBuffer,
    cos: CudaBuffer,
    sin: CudaBuffer,
}

const HIDDEN: usize = 4096;
const INTER: usize = 14336;
const LAYERS: usize = 32;
const VOCAB: usize = 128256;
const HEADS: HeadShape = HeadShape {
    n_heads: 32,
    n_kv_heads: 8,
    head_dim: 128,
};

fn random_weight(b: &CudaBackend, len: usize, seed: u32, fan_in: usize) -> R<CudaBuffer> {
    let mut w = b.alloc(DType::BF16, len)?;
    b.fill_random_bf16(&mut w, seed, (3.0 / fan_in as f32).sqrt())?;
    Ok(w)
}

fn build_llama(b: &CudaBackend, max_pos: usize) -> R<Llama> {
    let ones = vec![1f32; HIDDEN];
    let mut layers = Vec::new();
    for l in 0..LAYERS as u32 {
        layers.push(Layer {
            attn_norm: b.upload_f32(&ones)?,
            wqkv: random_weight(b, HEADS.qkv_width() * HIDDEN, 10 * l + 1, HIDDEN)?,
            wo: random_weight(b, HIDDEN * HEADS.q_width(), 10 * l + 2, HIDDEN)?,
            mlp_norm: b.upload_f32(&ones)?,
            w_gate_up: random_weight(b, 2 * INTER * HIDDEN, 10 * l + 3, HIDDEN)?,
            w_down: random_weight(b, HIDDEN * INTER, 10 * l + 4, INTER)?,
        });
    }
    let half = HEADS.head_dim / 2;
    let mut cos = vec![0f32; max_pos * half];
    let mut sin = vec![0f32; max_pos * half];
    for p in 0..max_pos {
        for j in 0..half {
            let a = p as f64 * 500000f64.powf(-(2.0 * j as f64) / HEADS.head_dim as f64);
            cos[p * half + j] = a.cos() as f32;
            sin[p * half + j] = a.sin() as f32;
        }
    }
    Ok(Llama {
        layers,
        embed: random_weight(b, VOCAB * HIDDEN, 9001, 1)?,
        norm: b.upload_f32(&ones)?,
        lm_head: random_weight(b, VOCAB * HIDDEN, 9002, HIDDEN)?,
        cos: b.upload_f32(&cos)?,
        sin: b.upload_f32(&sin)?,
    })
}

/// Activation buffers for up to `n` tokens.
struct Acts {
    residual: CudaBuffer,
    h: CudaBuffer,
    qkv: CudaBuffer,
    attn: CudaBuffer,
    proj: CudaBuffer,
    gate_up: CudaBuffer,
    act: CudaBuffer,
    last: CudaBuffer,
    logits: CudaBuffer,
}

fn acts(b: &CudaBackend, n: usize, seqs: usize) -> R<Acts> {
    Ok(Acts {
        residual: b.alloc(DType::F32, n * HIDDEN)?,
        // Product inputs in the dtype the backend multiplies them in (as LlamaModel allocates).
        h: b.alloc(b.matmul_input_dtype(n), n * HIDDEN)?,
        qkv: b.alloc(DType::F32, n * HEADS.qkv_width())?,
        attn: b.alloc(DType::F32, n * HEADS.q_width())?,
        proj: b.alloc(DType::F32, n * HIDDEN)?,
        gate_up: b.alloc(DType::F32, n * 2 * INTER)?,
        act: b.alloc(b.matmul_input_dtype(n), n * INTER)?,
        last: b.alloc(DType::F32, seqs * HIDDEN)?,
        logits: b.alloc(DType::F32, seqs * VOCAB)?,
    })
}

/// One forward pass over `meta`'s tokens up to the logits of each sequence's `last_rows` token
/// (`a.logits`); only enqueues work, so it can be captured into a graph.
fn forward_logits(
    b: &CudaBackend,
    m: &Llama,
    kv: &mut [(CudaBuffer, CudaBuffer)],
    a: &mut Acts,
    ids: &CudaBuffer,
    meta: &BatchMeta<CudaBackend>,
    last_rows: &CudaBuffer,
) -> Result<(), crate::backend::BackendError> {
    let n = meta.n_tokens;
    let eps = 1e-5;
    b.embedding(&m.embed, ids, &mut a.residual, n, HIDDEN)?;
    for (l, layer) in m.layers.iter().enumerate() {
        if l == 0 {
            let norm = RmsNorm {
                weight: &layer.attn_norm,
                eps,
            };
            b.rms_norm(&a.residual, norm, &mut a.h, n, HIDDEN)?;
        } else {
            let norm = RmsNorm {
                weight: &layer.attn_norm,
                eps,
            };
            b.add_rms_norm(&mut a.residual, &a.proj, norm, &mut a.h, n, HIDDEN)?;
        }
        b.matmul(&a.h, &layer.wqkv, &mut a.qkv, n, HIDDEN, HEADS.qkv_width())?;
        let (kc, vc) = &mut kv[l];
        b.rope_kv_attention(
            &mut a.qkv,
            RopeTables {
                cos: &m.cos,
                sin: &m.sin,
            },
            KvLayer { k: kc, v: vc },
            meta,
            &mut a.attn,
            AttentionShape {
                heads: HEADS,
                block_size: 16,
                scale: 1.0 / (128f32).sqrt(),
            },
        )?;
        b.matmul(&a.attn, &layer.wo, &mut a.proj, n, HEADS.q_width(), HIDDEN)?;
        let norm = RmsNorm {
            weight: &layer.mlp_norm,
            eps,
        };
        b.add_rms_norm(&mut a.residual, &a.proj, norm, &mut a.h, n, HIDDEN)?;
        b.matmul_silu_mul(
            &a.h,
            &layer.w_gate_up,
            &mut a.gate_up,
            &mut a.act,
            SwiGluShape {
                n,
                k: HIDDEN,
                f: INTER,
            },
        )?;
        b.matmul(&a.act, &layer.w_down, &mut a.proj, n, INTER, HIDDEN)?;
    }
    let norm = RmsNorm {
        weight: &m.norm,
        eps,
    };
    b.add_rms_norm(&mut a.residual, &a.proj, norm, &mut a.h, n, HIDDEN)?;
    let seqs = meta.n_seqs;
    b.gather_rows(&a.h, last_rows, &mut a.last, seqs, HIDDEN)?;
    b.matmul(&a.last, &m.lm_head, &mut a.logits, seqs, HIDDEN, VOCAB)
}

/// One forward pass and the greedy next token of each sequence (chosen on the device).
fn forward(
    b: &CudaBackend,
    m: &Llama,
    kv: &mut [(CudaBuffer, CudaBuffer)],
    a: &mut Acts,
    ids: &CudaBuffer,
    meta: &BatchMeta<CudaBackend>,
    last_rows: &CudaBuffer,
) -> R<Vec<u32>> {
    forward_logits(b, m, kv, a, ids, meta, last_rows)?;
    Ok(b.sample(&a.logits, VOCAB, &vec![SamplingRow::greedy(); meta.n_seqs])?)
}

fn u32_bytes(v: &[u32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_llama8b_decode() -> R<()> {
    let Some(b) = device() else { return Ok(()) };
    let (prompt, new_tokens, bs) = (128usize, 256usize, 16usize);
    let max_ctx = prompt + new_tokens;
    let t0 = Instant::now();
    let model = build_llama(&b, max_ctx + 1)?;
    b.synchronize()?;
    println!(
        "BENCH llama8b random bf16 weights ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let blocks_per_seq = max_ctx.div_ceil(bs);
    // SOV_BENCH_BATCHES=1,16 narrows the sweep (quick A/B runs of kernel variants).
    let batches: Vec<usize> = std::env::var("SOV_BENCH_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    for batch in batches {
        let num_blocks = batch * blocks_per_seq;
        let mut kv = Vec::new();
        for _ in 0..LAYERS {
            kv.push((
                b.alloc(DType::BF16, num_blocks * bs * HEADS.kv_width())?,
                b.alloc(DType::BF16, num_blocks * bs * HEADS.kv_width())?,
            ));
        }
        let tables: Vec<u32> = (0..num_blocks as u32).collect();
        let slot = |s: usize, p: usize| (s * blocks_per_seq * bs + p) as u32;
        // Prefill and decode steps have their own activations: their row counts differ, and with
        // them the dtype the products take their inputs in (`matmul_input_dtype`), as in
        // LlamaModel, which allocates per step.
        let mut ap = acts(&b, batch * prompt, batch)?;
        let mut a = acts(&b, batch, batch)?;
        let prompt_ids: Vec<u32> = (0..batch * prompt)
            .map(|i| ((i * 2654435761) % VOCAB) as u32)
            .collect();

        // Every sequence's prompt in one prefill step; returns each sequence's next token.
        let prefill = |a: &mut Acts, kv: &mut Vec<(CudaBuffer, CudaBuffer)>| -> R<Vec<u32>> {
            let meta = BatchMeta::<CudaBackend> {
                n_tokens: batch * prompt,
                n_seqs: batch,
                max_q_len: prompt,
                max_ctx_len: prompt,
                max_blocks_per_seq: blocks_per_seq,
                positions: b.upload_u32(
                    &(0..batch * prompt)
                        .map(|i| (i % prompt) as u32)
                        .collect::<Vec<_>>(),
                )?,
                slot_mapping: b.upload_u32(
                    &(0..batch * prompt)
                        .map(|i| slot(i / prompt, i % prompt))
                        .collect::<Vec<_>>(),
                )?,
                q_starts: b
                    .upload_u32(&(0..=batch).map(|s| (s * prompt) as u32).collect::<Vec<_>>())?,
                ctx_lens: b.upload_u32(&vec![prompt as u32; batch])?,
                block_tables: b.upload_u32(&tables)?,
            };
            let ids = b.upload_u32(&prompt_ids)?;
            let last = b.upload_u32(
                &(0..batch)
                    .map(|s| (s * prompt + prompt - 1) as u32)
                    .collect::<Vec<_>>(),
            )?;
            forward(&b, &model, kv, a, &ids, &meta, &last)
        };

        let run = |ap: &mut Acts,
                   a: &mut Acts,
                   kv: &mut Vec<(CudaBuffer, CudaBuffer)>,
                   steps: usize|
         -> R<(f64, f64, Vec<u32>)> {
            let start = Instant::now();
            let mut next = prefill(ap, kv)?;
            let prefill_s = start.elapsed().as_secs_f64();
            let mut first_tokens = next.clone();
            let rows = b.upload_u32(&(0..batch as u32).collect::<Vec<_>>())?;
            let q_starts: Vec<u32> = (0..=batch as u32).collect();
            for step in 1..steps {
                let pos = prompt + step - 1;
                let meta = BatchMeta::<CudaBackend> {
                    n_tokens: batch,
                    n_seqs: batch,
                    max_q_len: 1,
                    max_ctx_len: pos + 1,
                    max_blocks_per_seq: blocks_per_seq,
                    positions: b.upload_u32(&vec![pos as u32; batch])?,
                    slot_mapping: b
                        .upload_u32(&(0..batch).map(|s| slot(s, pos)).collect::<Vec<_>>())?,
                    q_starts: b.upload_u32(&q_starts)?,
                    ctx_lens: b.upload_u32(&vec![pos as u32 + 1; batch])?,
                    block_tables: b.upload_u32(&tables)?,
                };
                let ids = b.upload_u32(&next)?;
                next = forward(&b, &model, kv, a, &ids, &meta, &rows)?;
                if step < 4 {
                    first_tokens.push(next[0]);
                }
            }
            Ok((prefill_s, start.elapsed().as_secs_f64(), first_tokens))
        };
        // The same run with decode steps replayed from a CUDA graph captured at step 2 (step 1 runs
        // eagerly on the same fixed-address buffers, warming scratch and library workspaces).
        let run_graph = |ap: &mut Acts,
                         a: &mut Acts,
                         kv: &mut Vec<(CudaBuffer, CudaBuffer)>,
                         steps: usize|
         -> R<(f64, f64, Vec<u32>)> {
            let start = Instant::now();
            let mut next = prefill(ap, kv)?;
            let prefill_s = start.elapsed().as_secs_f64();
            let mut first_tokens = next.clone();
            let rows = b.upload_u32(&(0..batch as u32).collect::<Vec<_>>())?;
            let mut ids = b.upload_u32(&next)?;
            let mut meta = BatchMeta::<CudaBackend> {
                n_tokens: batch,
                n_seqs: batch,
                max_q_len: 1,
                max_ctx_len: max_ctx,
                max_blocks_per_seq: blocks_per_seq,
                positions: b.alloc(DType::U32, batch)?,
                slot_mapping: b.alloc(DType::U32, batch)?,
                q_starts: b.upload_u32(&(0..=batch as u32).collect::<Vec<_>>())?,
                ctx_lens: b.alloc(DType::U32, batch)?,
                block_tables: b.upload_u32(&tables)?,
            };
            let mut graph = None;
            for step in 1..steps {
                let pos = prompt + step - 1;
                b.write_bytes(&mut ids, 0, u32_bytes(&next))?;
                b.write_bytes(&mut meta.positions, 0, u32_bytes(&vec![pos as u32; batch]))?;
                b.write_bytes(
                    &mut meta.slot_mapping,
                    0,
                    u32_bytes(&(0..batch).map(|s| slot(s, pos)).collect::<Vec<_>>()),
                )?;
                b.write_bytes(
                    &mut meta.ctx_lens,
                    0,
                    u32_bytes(&vec![pos as u32 + 1; batch]),
                )?;
                if step == 1 {
                    forward_logits(&b, &model, kv, a, &ids, &meta, &rows)?;
                } else {
                    if graph.is_none() {
                        graph =
                            Some(b.capture(|| {
                                forward_logits(&b, &model, kv, a, &ids, &meta, &rows)
                            })?);
                    }
                    if let Some(g) = &graph {
                        b.replay(g)?;
                    }
                }
                next = b.sample(&a.logits, VOCAB, &vec![SamplingRow::greedy(); batch])?;
                if step < 4 {
                    first_tokens.push(next[0]);
                }
            }
            Ok((prefill_s, start.elapsed().as_secs_f64(), first_tokens))
        };
        // Warm-up (compiles kernels, sizes scratch), then the timed runs.
        run(&mut ap, &mut a, &mut kv, 3)?;
        let (prefill_s, total_s, toks) = run(&mut ap, &mut a, &mut kv, new_tokens)?;
        match run_graph(&mut ap, &mut a, &mut kv, new_tokens) {
            Ok((gp, gt, gtoks)) => println!(
                "BENCH llama8b_decode_graph batch={batch} prompt={prompt} new={new_tokens} total_s={gt:.3} prefill_s={gp:.3} \
                 tok_per_s={:.1} decode_tok_per_s={:.1} ms_per_step={:.2} first_tokens_seq0={:?} same_as_eager={}",
                (batch * new_tokens) as f64 / gt,
                (batch * (new_tokens - 1)) as f64 / (gt - gp),
                (gt - gp) * 1e3 / (new_tokens - 1) as f64,
                &gtoks[..gtoks.len().min(4)],
                gtoks == toks
            ),
            Err(e) => println!("BENCH llama8b_decode_graph batch={batch}: graph run failed: {e}"),
        }
        let out_tokens = (batch * new_tokens) as f64;
        println!(
            "BENCH llama8b_decode batch={batch} prompt={prompt} new={new_tokens} total_s={total_s:.3} prefill_s={prefill_s:.3} \
             tok_per_s={:.1} decode_tok_per_s={:.1} ms_per_step={:.2} first_tokens_seq0={:?}",
            out_tokens / total_s,
            (batch * (new_tokens - 1)) as f64 / (total_s - prefill_s),
            (total_s - prefill_s) * 1e3 / (new_tokens - 1) as f64,
            &toks[..toks.len().min(4)]
        );
    }
    Ok(())
}

/// Host tensor of random bf16 values in `[-scale, scale)`, filled in parallel.
fn host_random(shape: Vec<usize>, seed: u64, scale: f32) -> crate::loader::tensor::HostTensor {
    use rayon::prelude::*;
    let n: usize = shape.iter().product();
    let mut data = vec![half::bf16::ZERO; n];
    data.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut z = seed ^ ((c as u64 + 1) * 0x9e3779b97f4a7c15);
            for v in chunk {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                *v = half::bf16::from_f32(((z >> 40) as f32 / 16777216.0 * 2.0 - 1.0) * scale);
            }
        });
    crate::loader::tensor::HostTensor {
        shape,
        data: crate::loader::tensor::HostData::BF16(data),
    }
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_llama8b_model_forward() -> R<()> {
    use crate::model::batch::SeqChunk;
    use crate::model::config::LlamaConfig;
    use crate::model::{KvCache, LlamaModel};
    if device().is_none() {
        return Ok(());
    }
    let config = LlamaConfig {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: INTER,
        num_hidden_layers: LAYERS,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        max_position_embeddings: 1024,
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: None,
        tie_word_embeddings: false,
        attention_bias: false,
    };
    let t0 = Instant::now();
    let mut w = std::collections::HashMap::new();
    let ones = |n: usize| crate::loader::tensor::HostTensor {
        shape: vec![n],
        data: crate::loader::tensor::HostData::F32(vec![1.0; n]),
    };
    let s = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
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
        w.insert(
            format!("{p}.self_attn.q_proj.weight"),
            host_random(vec![4096, HIDDEN], seed, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.self_attn.k_proj.weight"),
            host_random(vec![1024, HIDDEN], seed + 1, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.self_attn.v_proj.weight"),
            host_random(vec![1024, HIDDEN], seed + 2, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.self_attn.o_proj.weight"),
            host_random(vec![HIDDEN, 4096], seed + 3, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.mlp.gate_proj.weight"),
            host_random(vec![INTER, HIDDEN], seed + 4, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.mlp.up_proj.weight"),
            host_random(vec![INTER, HIDDEN], seed + 5, s(HIDDEN)),
        );
        w.insert(
            format!("{p}.mlp.down_proj.weight"),
            host_random(vec![HIDDEN, INTER], seed + 6, s(INTER)),
        );
    }
    let model = LlamaModel::new(CudaBackend::new(0)?, &config, &w)?;
    drop(w);
    println!(
        "BENCH model_forward: LlamaModel<CudaBackend> built in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let (prompt, new_tokens, bs) = (128usize, 256usize, 16usize);
    let per_seq = (prompt + new_tokens).div_ceil(bs);
    for batch in [1usize, 16, 64, 256] {
        let mut kv: KvCache<CudaBackend> = model.new_kv_cache(batch * per_seq, bs)?;
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|s| (0..per_seq).map(|j| (s * per_seq + j) as u32).collect())
            .collect();
        let mut seqs: Vec<Vec<u32>> = (0..batch)
            .map(|s| {
                (0..prompt)
                    .map(|i| ((s * 7919 + i * 104729) % VOCAB) as u32)
                    .collect()
            })
            .collect();
        let start = Instant::now();
        let mut fed = vec![0usize; batch];
        let mut prefill_s = 0.0;
        for step in 0..new_tokens {
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
            let logits = model.forward(&mut kv, &chunks)?;
            for (i, s) in seqs.iter_mut().enumerate() {
                fed[i] = s.len();
                let row = &logits[i * VOCAB..(i + 1) * VOCAB];
                s.push(super::reference::argmax(row));
            }
            if step == 0 {
                prefill_s = start.elapsed().as_secs_f64();
            }
        }
        let total_s = start.elapsed().as_secs_f64();
        println!(
            "BENCH model_forward batch={batch} prompt={prompt} new={new_tokens} total_s={total_s:.3} prefill_s={prefill_s:.3} \
             tok_per_s={:.1} decode_tok_per_s={:.1} (host argmax over downloaded logits)",
            (batch * new_tokens) as f64 / total_s,
            (batch * (new_tokens - 1)) as f64 / (total_s - prefill_s)
        );
    }
    Ok(())
}
