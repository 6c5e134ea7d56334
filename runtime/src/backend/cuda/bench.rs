//! Kernel-level GPU benchmarks, run on the device by `kernels/gpu-check.sh` (ignored by a plain
//! `cargo test`):
//! `cargo test --release -p sov --lib backend::cuda::bench -- --ignored --nocapture --test-threads=1`.
//! They time single ops against the backend's internals (split plans, the GEMV switch, raw
//! copies); the model-level decode benchmark, which runs the model's own layer stack, is the
//! `gpu_bench` test target.
//!
//! - `bench_decode_attention`: paged decode attention at Llama-3-8B heads (32 q / 8 kv, d 128) for
//!   (batch, context) = (1, 4096), (64, 2048), (256, 1024); bytes of K and V read per launch over the
//!   median time, next to a device-to-device copy measured in the same process; then the launch a
//!   decode step makes, with the RoPE and the new token's K/V write fused in
//!   (`decode_attention_fused` lines, with the same two steps as separate launches).
//! - `bench_decode_matmuls`: the products of a Llama-3-8B decode step (qkv, o, gate_up, down, lm
//!   head) at 1 and 4 rows, through cuBLAS (with its input cast) and through `gemv.cu`; weight
//!   bytes over the median time. Enough weight copies are cycled that none is served from L2.
//!
//! - `bench_fp8_matmuls`: Llama-3-8B's layer products at 1..1024 rows in bf16 and FP8 (the input
//!   quantization alone, the small-M kernel, cuBLASLt; FP8 times include the quantization).
//! - `bench_row_kernels`: the row kernels between the products of a 1024- and 2048-row step at the
//!   Llama-3-8B widths (residual add + RMSNorm into f32, bf16 and e4m3 rows; SwiGLU of bf16 gate/up
//!   rows into e4m3 rows); bytes moved over the median time, next to a device-to-device copy.
//!   Launches cycle through 4 sets of buffers, so none is served from L2.
//!
//! Times are CUDA-event medians after warm-up.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::tests::device;
use super::{CudaBackend, CudaBuffer};
use crate::backend::{AttentionShape, Backend, BatchMeta, DType, HeadShape, KvLayer, RopeTables};

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
    // SOV_BENCH_ATTN_KV=bf16 or e4m3 runs one cache format (e.g. under a profiler); both otherwise.
    let only = std::env::var("SOV_BENCH_ATTN_KV").ok();
    if only.as_deref() != Some("e4m3") {
        let Some(b) = device() else { return Ok(()) };
        decode_attention_shapes(&b)?;
    }
    if only.as_deref() == Some("bf16") {
        return Ok(());
    }
    // The same shapes over an e4m3 cache (`--kv-dtype fp8`): 1056 bytes a token and layer's K
    // (or V) at this head shape against bf16's 2048.
    let Some(e4m3) = super::tests::device_with(|t| t.kv_e4m3 = true) else {
        return Ok(());
    };
    decode_attention_shapes(&e4m3)
}

/// `bench_decode_attention` on `b`'s cache format.
fn decode_attention_shapes(b: &CudaBackend) -> R<()> {
    let copy = copy_bandwidth(b)?;
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
        let row = b.kv_row_elems(heads);
        let cache_len = num_blocks * bs * row;
        let elem = b.kv_dtype().size_bytes();
        // Enough cache copies (K and V: [num_blocks, bs, row] each) are cycled that a call finds
        // its KV in DRAM, not in the 50 MB L2 a previous call left it in -- as the 32 layers of a
        // decode step do. The "warm" figures re-read copy 0, which at (1, 4096) (16.8 MB) is L2.
        let copies = (512usize << 20).div_ceil(2 * cache_len * elem).max(1);
        // An e4m3 cache: random finite codes of either sign and a scale of 1/64 per head, one
        // group of 16 slots (`[KVH][16][D]` codes, `[KVH][16]` scales, padding) repeated.
        let e4m3_rows = (b.kv_dtype() == DType::F8E4M3).then(|| {
            let mut r = StdRng::seed_from_u64(9);
            let (codes, scales) = (16 * heads.kv_width(), 16 * 4 * heads.n_kv_heads);
            let one: Vec<u8> = (0..16 * row)
                .map(|i| match i.checked_sub(codes) {
                    None => r.gen_range(0u8..0x7f) | (r.gen_range(0u8..2) << 7),
                    Some(j) if j < scales => (1f32 / 64.0).to_le_bytes()[j % 4],
                    Some(_) => 0,
                })
                .collect(); // 16 * row bytes
            one.repeat(num_blocks * bs / 16) // num_blocks * bs * row bytes
        });
        let mut caches = Vec::with_capacity(copies);
        for i in 0..copies as u32 {
            let (kc, vc) = match &e4m3_rows {
                Some(bytes) => (
                    b.upload_bytes(DType::F8E4M3, bytes)?,
                    b.upload_bytes(DType::F8E4M3, bytes)?,
                ),
                None => {
                    let mut kc = b.alloc(DType::BF16, cache_len)?;
                    let mut vc = b.alloc(DType::BF16, cache_len)?;
                    b.fill_random_bf16(&mut kc, 1 + 2 * i, 1.0)?;
                    b.fill_random_bf16(&mut vc, 2 + 2 * i, 1.0)?;
                    (kc, vc)
                }
            };
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
        let ms = time_ms(b, 5, 50, || Ok(call(0)?))?;
        let b2b_ms = back_to_back_ms(b, 20, 20, || Ok(call(0)?))?;
        let graph_warm_ms = graph_ms(b, 20, 20, &mut call)?;
        let mut next = 0;
        let cold_ms = time_ms(b, 5, 50, || {
            next += 1;
            Ok(call(next)?)
        })?;
        let graph_cold_ms = graph_ms(b, copies.max(20).next_multiple_of(copies), 20, &mut call)?;
        let kv_bytes = 2.0 * (batch * ctx * row * elem) as f64;
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
            "BENCH decode_attention kv={:?} batch={batch} ctx={ctx} time_us={:.1} kv_bytes={:.1}MB bandwidth={:.1} GB/s \
             pct_of_copy={:.1}% back_to_back_us={:.1} back_to_back_pct_of_copy={:.1}% splits={} \
             split_tokens={} warp_items={}",
            b.kv_dtype(),
            ms * 1e3,
            kv_bytes / 1e6,
            kv_bytes / (ms * 1e-3) / 1e9,
            pct(ms),
            b2b_ms * 1e3,
            pct(b2b_ms),
            plan.splits,
            plan.split_tokens,
            b.warp_items(batch, 8, plan)
        );
        println!(
            "BENCH decode_attention_graph kv={:?} batch={batch} ctx={ctx} cache_copies={copies} \
             warm_graph_us={:.1} warm_graph_pct_of_copy={:.1}% cold_one_us={:.1} cold_one_pct_of_copy={:.1}% \
             cold_graph_us={:.1} cold_graph_pct_of_copy={:.1}%",
            b.kv_dtype(),
            graph_warm_ms * 1e3,
            pct(graph_warm_ms),
            cold_ms * 1e3,
            pct(cold_ms),
            graph_cold_ms * 1e3,
            pct(graph_cold_ms)
        );
        // The launch a decode step makes: RoPE of the step's q and k and the new token's K/V
        // write fused into the attention (`rope_kv_attention`), each sequence's newest token at
        // position ctx - 1 written into its last slot.
        let slots: Vec<u32> = (0..batch)
            .map(|s| {
                let block = ids[s * blocks_per_seq + (ctx - 1) / bs];
                block * bs as u32 + ((ctx - 1) % bs) as u32
            })
            .collect(); // [batch]
        let fused_meta = BatchMeta::<CudaBackend> {
            positions: b.upload_u32(&vec![ctx as u32 - 1; batch])?,
            slot_mapping: b.upload_u32(&slots)?,
            q_starts: b.upload_u32(&(0..=batch as u32).collect::<Vec<_>>())?,
            ctx_lens: b.upload_u32(&vec![ctx as u32; batch])?,
            block_tables: b.upload_u32(&ids)?,
            ..meta
        };
        let (cos, sin) = super::fused_rope_tests::rope_tables(ctx, heads.head_dim);
        let (cos, sin) = (b.upload_f32(&cos)?, b.upload_f32(&sin)?); // [ctx, d / 2] each
        let mut qkv = b.upload_f32(&q)?; // [batch, qkv_width] f32, rotated in place by each call
        let mut fused = |i: usize| {
            let (kc, vc) = &mut caches[i % copies];
            let tables = RopeTables {
                cos: &cos,
                sin: &sin,
            };
            let kv = KvLayer { k: kc, v: vc };
            b.rope_kv_attention(&mut qkv, tables, kv, &fused_meta, &mut out, shape)
        };
        let fused_ms = time_ms(b, 5, 50, || Ok(fused(0)?))?;
        let mut next = 0;
        let fused_cold_ms = time_ms(b, 5, 50, || {
            next += 1;
            Ok(fused(next)?)
        })?;
        // The same two steps as separate launches: `rope_kv_write`, then `paged_attention`.
        let mut unfused = |i: usize| {
            let (kc, vc) = &mut caches[i % copies];
            let tables = RopeTables {
                cos: &cos,
                sin: &sin,
            };
            let kv = KvLayer { k: kc, v: vc };
            crate::backend::rope_kv_then_attention(
                b,
                &mut qkv,
                tables,
                kv,
                &fused_meta,
                &mut out,
                shape,
            )
        };
        let mut next = 0;
        let unfused_cold_ms = time_ms(b, 5, 50, || {
            next += 1;
            Ok(unfused(next)?)
        })?;
        println!(
            "BENCH decode_attention_fused kv={:?} batch={batch} ctx={ctx} time_us={:.1} \
             pct_of_copy={:.1}% cold_one_us={:.1} cold_one_pct_of_copy={:.1}% \
             unfused_cold_one_us={:.1}",
            b.kv_dtype(),
            fused_ms * 1e3,
            pct(fused_ms),
            fused_cold_ms * 1e3,
            pct(fused_cold_ms),
            unfused_cold_ms * 1e3
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

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_fp8_matmuls() -> R<()> {
    use super::{Fp8Path, Quantization};
    let Some(b) = super::tests::device_with(|t| {
        t.quantization = Quantization::Fp8W8A8;
        t.deterministic = false;
    }) else {
        return Ok(());
    };
    let rows: Vec<usize> = std::env::var("SOV_BENCH_FP8_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 24, 32, 64, 256, 1024]);
    // (name, k, m): x [n, k] @ w [m, k]^T, Llama-3-8B's layer products.
    let shapes = [
        ("qkv", 4096usize, 6144usize),
        ("o", 4096, 4096),
        ("gate_up", 4096, 28672),
        ("down", 14336, 4096),
    ];
    for (name, k, m) in shapes {
        let copies = (512usize << 20).div_ceil(m * k * 2).max(2);
        let ws: Vec<CudaBuffer> = (0..copies)
            .map(|i| random_weight(&b, m * k, 60 + i as u32, k))
            .collect::<R<_>>()?;
        let qs: Vec<CudaBuffer> = ws
            .iter()
            .map(|w| b.quantize_weight(w, m, k))
            .collect::<Result<_, _>>()?;
        for &n in &rows {
            let xf = super::reference::random(n * k, 1.0, 5);
            let x32 = b.upload_f32(&xf)?; // [n, k]
            let x16 = b.alloc(DType::BF16, n * k)?;
            b.cast_f32_bf16(x32.ptr(), x16.ptr(), n * k)?;
            // The engine's inputs: f32 at one row (the GEMV), bf16 above.
            let x = if n == 1 { &x32 } else { &x16 };
            let mut out = b.alloc(DType::F32, n * m)?; // [n, m]
            let per = |ms: f64| ms * 1e3 / copies as f64;
            let bf16_us = per(time_ms(&b, 2, 10, || {
                for w in &ws {
                    b.matmul(x, w, &mut out, n, k, m)?;
                }
                Ok(())
            })?);
            let quant_us = per(time_ms(&b, 2, 10, || {
                for _ in 0..copies {
                    b.quantize_input(x, n, k)?;
                }
                Ok(())
            })?);
            let mut fp8 = |path: Fp8Path| -> R<f64> {
                Ok(per(time_ms(&b, 2, 10, || {
                    for q in &qs {
                        b.matmul_fp8(x, q, &mut out, (n, k, m), path)?;
                    }
                    Ok(())
                })?))
            };
            let small_us = if n <= 32 {
                fp8(Fp8Path::Small)?
            } else {
                f64::NAN
            };
            let fused_us = if b.fp8_fused_applies(n, k) {
                fp8(Fp8Path::SmallFused)?
            } else {
                f64::NAN
            };
            let lt_us = fp8(Fp8Path::CublasLt)?;
            let best = small_us.min(lt_us).min(fused_us);
            let tflops = |us: f64| 2.0 * (n * k * m) as f64 / (us * 1e-6) / 1e12;
            println!(
                "BENCH fp8 {name} n={n} k={k} m={m} bf16_us={bf16_us:.1} quant_us={quant_us:.1} \
                 small_us={small_us:.1} fused_us={fused_us:.1} cublaslt_us={lt_us:.1} \
                 best_speedup={:.2} bf16_tflops={:.0} fp8_tflops={:.0}",
                bf16_us / best,
                tflops(bf16_us),
                tflops(best),
            );
        }
    }
    println!("BENCH fp8 cuBLASLt scale mode {:?}", b.fp8_scale_mode());
    Ok(())
}

/// A `[len]` bf16 weight, uniform with variance `1 / fan_in`.
fn random_weight(b: &CudaBackend, len: usize, seed: u32, fan_in: usize) -> R<CudaBuffer> {
    let mut w = b.alloc(DType::BF16, len)?;
    b.fill_random_bf16(&mut w, seed, (3.0 / fan_in as f32).sqrt())?;
    Ok(w)
}

#[test]
#[ignore = "GPU benchmark; run by kernels/gpu-check.sh"]
fn bench_row_kernels() -> R<()> {
    use super::ops::GateUpRows;
    use crate::backend::RmsNorm;
    let Some(b) = super::tests::device_with(|t| t.quantization = super::Quantization::Fp8W8A8)
    else {
        return Ok(());
    };
    let copy = copy_bandwidth(&b)?;
    println!(
        "BENCH copy_d2d bandwidth={:.1} GB/s (read+write)",
        copy / 1e9
    );
    let (d, f) = (4096usize, 14336usize);
    let weight = b.upload_f32(&super::reference::random(d, 1.0, 3))?; // [d]
    let norm = RmsNorm {
        weight: &weight,
        eps: 1e-5,
    };
    // Launches cycle through ROW_COPIES sets of buffers, so no launch finds its rows in L2 (a
    // 1024-row RMSNorm reads and writes 36 MB: one set fits the H100's 50 MB L2).
    const ROW_COPIES: usize = 4;
    for n in [1024usize, 2048] {
        let mut residuals: Vec<CudaBuffer> = (0..ROW_COPIES)
            .map(|i| b.upload_f32(&super::reference::random(n * d, 1.0, 4 + i as u64)))
            .collect::<Result<_, _>>()?; // each [n, d]
        let deltas: Vec<CudaBuffer> = (0..ROW_COPIES)
            .map(|i| b.upload_f32(&super::reference::random(n * d, 0.5, 9 + i as u64)))
            .collect::<Result<_, _>>()?; // each [n, d]
        // Read residual, delta, weight; write residual and the output.
        let rms_bytes = |out: usize| (3 * n * d * 4 + d * 4 + out) as f64;
        for (name, dtype, out_bytes) in [
            ("f32", DType::F32, n * d * 4),
            ("bf16", DType::BF16, n * d * 2),
            ("e4m3", DType::F8E4M3, n * d + 4 * n),
        ] {
            let mut outs: Vec<CudaBuffer> = (0..ROW_COPIES)
                .map(|_| {
                    if dtype == DType::F8E4M3 {
                        b.alloc_quantized_rows(n, d)
                    } else {
                        b.alloc(dtype, n * d)
                    }
                })
                .collect::<Result<_, _>>()?; // each [n, d]
            let mut i = 0;
            let ms = back_to_back_ms(&b, 20, 10, || {
                let c = i % ROW_COPIES;
                i += 1;
                Ok(b.add_rms_norm(&mut residuals[c], &deltas[c], norm, &mut outs[c], n, d)?)
            })?;
            let bw = rms_bytes(out_bytes) / (ms * 1e-3);
            println!(
                "BENCH add_rms_norm {name} n={n} d={d} us={:.1} bandwidth={:.1} GB/s copy_fraction={:.2}",
                ms * 1e3,
                bw / 1e9,
                bw / copy
            );
        }
        let mut sets = Vec::with_capacity(ROW_COPIES);
        for c in 0..ROW_COPIES {
            let mut gate_up = b.alloc(DType::BF16, n * 2 * f)?; // [n, 2f] bf16
            b.fill_random_bf16(&mut gate_up, 7 + c as u32, 4.0)?;
            let q = b.alloc_quantized_rows(n, f)?; // [n, f] e4m3 + [n] f32
            sets.push((gate_up, q));
        }
        let mut i = 0;
        let ms = back_to_back_ms(&b, 20, 10, || {
            let (gate_up, q) = &mut sets[i % ROW_COPIES];
            i += 1;
            let rows = GateUpRows {
                ptr: gate_up.ptr(),
                bf16: true,
            };
            // SAFETY: gate_up holds n * 2f bf16 and outlives the launches (timed synchronously).
            Ok(unsafe { b.silu_mul_from(rows, q, n, f) }?)
        })?;
        let bw = (n * 2 * f * 2 + n * f + 4 * n) as f64 / (ms * 1e-3);
        println!(
            "BENCH silu_mul e4m3_from_bf16 n={n} f={f} us={:.1} bandwidth={:.1} GB/s copy_fraction={:.2}",
            ms * 1e3,
            bw / 1e9,
            bw / copy
        );
    }
    Ok(())
}
