//! GPU checks of every CUDA op against the CPU references in [`super::reference`], on fresh
//! random inputs and several shapes (odd sizes, block boundaries, long contexts that need split-K).
//! Without a usable GPU each test prints why and returns, so CI without CUDA stays green.
//! Bound: ‖out − ref‖ / ‖ref‖ ≤ 1e-2 (bf16 weights/KV cache, f32 accumulation).

use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::reference as cpu;
use super::{CudaBackend, CudaBuffer, CudaTuning, DrawRow};
use crate::backend::{
    AttentionShape, Backend, BatchMeta, DType, HeadShape, KvLayer, NewTokens, RmsNorm, RopeTables,
    SwiGluShape,
};
use crate::loader::tensor::{HostData, HostTensor};

const TOL: f64 = 1e-2;

/// The GPU, or None after printing why the test is skipped. Its tuning is read from the `SOV_*`
/// tuning variables ([`CudaTuning::from_vars`]; this test binary is a program's edge), so the GPU
/// checks can run every test and benchmark with a kernel variant.
pub(super) fn device() -> Option<CudaBackend> {
    device_with(|_| {})
}

/// [`device`] with `change` applied to its tuning.
pub(super) fn device_with(change: impl FnOnce(&mut CudaTuning)) -> Option<CudaBackend> {
    let mut tuning = CudaTuning::from_vars(|k| std::env::var(k).ok())
        .unwrap_or_else(|e| panic!("bad tuning variable: {e}"));
    change(&mut tuning);
    match CudaBackend::with_tuning(0, tuning) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("skipping CUDA test: {e}");
            None
        }
    }
}

fn download(b: &CudaBackend, buf: &CudaBuffer, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    b.download_f32(buf, &mut out).unwrap();
    out
}

pub(super) fn weight(b: &CudaBackend, data: &[f32], shape: Vec<usize>) -> CudaBuffer {
    let t = HostTensor {
        shape,
        data: HostData::BF16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
    };
    b.upload_weight(&t).unwrap()
}

fn check(what: &str, out: &[f32], reference: &[f32]) {
    let e = cpu::rel_err(out, reference);
    println!("{what}: rel err {e:.2e}");
    assert!(e <= TOL, "{what}: relative error {e} > {TOL}");
}

#[test]
fn embedding_rmsnorm_bias_silu_gather_match_cpu() {
    let Some(b) = device() else { return };
    for (n, d, vocab, f) in [
        (1, 64, 256, 8),
        (7, 576, 1000, 1536),
        (33, 4096, 517, 77),
        (300, 64, 256, 14336),
        // RMSNorm's scalar form (d % 4 != 0), and a row past what its vector form keeps.
        (3, 1001, 300, 64),
        (2, 16388, 300, 64),
        (300, 4096, 300, 64),
    ] {
        let seed = (n * 1000 + d) as u64;
        let table = cpu::round_bf16(&cpu::random(vocab * d, 1.0, seed));
        let mut rng = StdRng::seed_from_u64(seed);
        let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let tb = weight(&b, &table, vec![vocab, d]);
        let ib = b.upload_u32(&ids).unwrap();
        let mut eb = b.alloc(DType::F32, n * d).unwrap();
        b.embedding(&tb, &ib, &mut eb, n, d).unwrap();
        let emb_ref: Vec<f32> = ids
            .iter()
            .flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec())
            .collect();
        assert_eq!(download(&b, &eb, n * d), emb_ref, "embedding n={n} d={d}");

        let x = cpu::random(n * d, 2.0, seed + 1);
        let w = cpu::random(d, 1.5, seed + 2);
        let xb = b.upload_f32(&x).unwrap();
        let wb = b.upload_f32(&w).unwrap();
        let mut ob = b.alloc(DType::F32, n * d).unwrap();
        let norm = |eps| RmsNorm { weight: &wb, eps };
        b.rms_norm(&xb, norm(1e-5), &mut ob, n, d).unwrap();
        check(
            &format!("rms_norm n={n} d={d}"),
            &download(&b, &ob, n * d),
            &cpu::rms_norm(&x, &w, d, 1e-5),
        );

        let delta = cpu::random(n * d, 1.0, seed + 3);
        let mut rb = b.upload_f32(&x).unwrap();
        let db = b.upload_f32(&delta).unwrap();
        b.add_rms_norm(&mut rb, &db, norm(1e-6), &mut ob, n, d)
            .unwrap();
        let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, c)| a + c).collect();
        check(
            &format!("add_rms_norm residual n={n}"),
            &download(&b, &rb, n * d),
            &sum,
        );
        check(
            &format!("add_rms_norm n={n} d={d}"),
            &download(&b, &ob, n * d),
            &cpu::rms_norm(&sum, &w, d, 1e-6),
        );

        let bias = cpu::random(d, 1.0, seed + 4);
        let bb = b.upload_f32(&bias).unwrap();
        let mut xb2 = b.upload_f32(&x).unwrap();
        b.add_bias(&mut xb2, &bb, n, d).unwrap();
        let biased: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + bias[i % d]).collect();
        check("add_bias", &download(&b, &xb2, n * d), &biased);

        let gu = cpu::random(n * 2 * f, 4.0, seed + 5);
        let gub = b.upload_f32(&gu).unwrap();
        let mut sb = b.alloc(DType::F32, n * f).unwrap();
        b.silu_mul(&gub, &mut sb, n, f).unwrap();
        let silu = download(&b, &sb, n * f);
        check(
            &format!("silu_mul n={n} f={f}"),
            &silu,
            &cpu::silu_mul(&gu, n, f),
        );
        // The bf16 output (the input of a product that multiplies in bf16) is the f32 one rounded.
        let mut sbb = b.alloc(DType::BF16, n * f).unwrap();
        b.silu_mul(&gub, &mut sbb, n, f).unwrap();
        let mut raw = vec![0u8; n * f * 2];
        b.download_raw(&sbb, 0, &mut raw).unwrap();
        let got: Vec<f32> = raw
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect();
        let want = cpu::round_bf16(&silu);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, c)| a.to_bits() == c.to_bits()),
            "silu_mul n={n} f={f}: bf16 output is not the f32 output rounded"
        );

        let rows: Vec<u32> = (0..n as u32).rev().step_by(2).collect();
        let rbuf = b.upload_u32(&rows).unwrap();
        let mut gb = b.alloc(DType::F32, rows.len() * d).unwrap();
        b.gather_rows(&xb, &rbuf, &mut gb, rows.len(), d).unwrap();
        let gathered: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x[r as usize * d..(r as usize + 1) * d].to_vec())
            .collect();
        assert_eq!(download(&b, &gb, rows.len() * d), gathered, "gather_rows");
    }
}

#[test]
fn matmul_matches_cpu() {
    // cuBLAS for every row count, and the GEMV path (taken for up to 4 rows here, k % 8 == 0),
    // held to the same bound.
    let Some(b) = device_with(|t| t.gemv_max_rows = 0) else {
        return;
    };
    let Some(precise) = device().map(|d| d.with_precise(true)) else {
        return;
    };
    let Some(gemv) = device_with(|t| t.gemv_max_rows = 4) else {
        return;
    };
    // Each row over four warps: the split shares (and their order) are checked against the CPU.
    let Some(split4) = device_with(|t| {
        t.gemv_max_rows = 4;
        t.gemv_split = Some(4);
    }) else {
        return;
    };
    for (n, k, m) in [
        (1, 64, 256),
        (3, 576, 1536),
        (17, 333, 129),
        (64, 4096, 1024),
        (1, 4096, 6144),
        // GEMV path (n <= 4, k % 8 == 0): odd column counts, the widest k of Llama-3-8B.
        (2, 4096, 1001),
        (4, 14336, 520),
        (1, 8, 3),
    ] {
        let seed = (n * 7 + k * 3 + m) as u64;
        let x = cpu::random(n * k, 1.0, seed);
        let w = cpu::round_bf16(&cpu::random(m * k, 0.5, seed + 1));
        let xb = b.upload_f32(&x).unwrap();
        let wb = weight(&b, &w, vec![m, k]);
        let mut ob = b.alloc(DType::F32, n * m).unwrap();
        b.matmul(&xb, &wb, &mut ob, n, k, m).unwrap();
        let expect = cpu::matmul(&x, &w, n, k, m);
        check(
            &format!("matmul {n}x{k} @ {m}x{k}^T"),
            &download(&b, &ob, n * m),
            &expect,
        );
        gemv.matmul(&xb, &wb, &mut ob, n, k, m).unwrap();
        check(
            &format!("matmul (gemv where n <= 4) {n}x{k} @ {m}x{k}^T"),
            &download(&gemv, &ob, n * m),
            &expect,
        );
        split4.matmul(&xb, &wb, &mut ob, n, k, m).unwrap();
        check(
            &format!("matmul (gemv, 4 warps per row) {n}x{k} @ {m}x{k}^T"),
            &download(&split4, &ob, n * m),
            &expect,
        );
        precise.matmul(&xb, &wb, &mut ob, n, k, m).unwrap();
        let e = cpu::rel_err(&download(&precise, &ob, n * m), &expect);
        println!("matmul precise {n}x{k} @ {m}x{k}^T: rel err {e:.2e}");
        assert!(e <= 1e-4, "precise matmul rel err {e}");
    }
}

#[test]
fn matmul_silu_mul_matches_cpu() {
    // The fused GEMV + SwiGLU (one row here; up to four with gemv_max_rows = 4) against the CPU
    // products and activation, and bit for bit against the unfused GEMV + silu_mul on the device.
    let Some(fused) = device_with(|t| t.gemv_max_rows = 4) else {
        return;
    };
    // The unfused reference: the GEMV into gate_up, then silu_mul, called one after the other.
    let Some(unfused) = device_with(|t| {
        t.gemv_max_rows = 4;
        t.gemv_split = Some(1); // the fused kernels give each row one warp
    }) else {
        return;
    };
    let Some(default) = device() else { return };
    for (n, k, f) in [
        (1, 64, 128),
        (1, 4096, 1000),
        (3, 576, 77),
        (4, 8, 5),
        (2, 14336, 96),
    ] {
        let seed = (n * 5 + k + f * 11) as u64;
        let x = cpu::random(n * k, 1.0, seed);
        let w = cpu::round_bf16(&cpu::random(2 * f * k, 0.5, seed + 1));
        let expect = cpu::silu_mul(&cpu::matmul(&x, &w, n, k, 2 * f), n, f);
        let mut results = Vec::new();
        for (name, b) in [
            ("fused", &fused),
            ("unfused", &unfused),
            ("default", &default),
        ] {
            let xb = b.upload_f32(&x).unwrap();
            let wb = weight(b, &w, vec![2 * f, k]);
            let mut gate_up = b.alloc(DType::F32, n * 2 * f).unwrap();
            let mut out = b.alloc(DType::F32, n * f).unwrap();
            if name == "unfused" {
                b.matmul(&xb, &wb, &mut gate_up, n, k, 2 * f).unwrap();
                b.silu_mul(&gate_up, &mut out, n, f).unwrap();
            } else {
                b.matmul_silu_mul(&xb, &wb, &mut gate_up, &mut out, SwiGluShape { n, k, f })
                    .unwrap();
            }
            let got = download(b, &out, n * f);
            check(
                &format!("matmul_silu_mul ({name}) n={n} k={k} f={f}"),
                &got,
                &expect,
            );
            results.push(got);
        }
        assert!(
            results[0]
                .iter()
                .zip(&results[1])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "fused SwiGLU GEMV differs from GEMV + silu_mul at n={n} k={k} f={f}"
        );
    }
}

#[test]
fn rope_and_kv_write_match_cpu() {
    let Some(b) = device() else { return };
    for (h, kvh, d, n) in [(4, 2, 16, 5), (9, 3, 64, 19), (32, 8, 128, 3)] {
        let heads = HeadShape {
            n_heads: h,
            n_kv_heads: kvh,
            head_dim: d,
        };
        let row = heads.qkv_width();
        let max_pos = 5000;
        let half = d / 2;
        // Llama-3.1-style tables are the model's job; any cos/sin pair exercises the kernel.
        let mut cos = vec![0f32; max_pos * half];
        let mut sin = vec![0f32; max_pos * half];
        for p in 0..max_pos {
            for j in 0..half {
                let a = p as f64 * 500000f64.powf(-(2.0 * j as f64) / d as f64);
                cos[p * half + j] = a.cos() as f32;
                sin[p * half + j] = a.sin() as f32;
            }
        }
        let mut rng = StdRng::seed_from_u64(d as u64);
        let pos: Vec<u32> = (0..n).map(|_| rng.gen_range(0..max_pos as u32)).collect();
        let qkv = cpu::random(n * row, 2.0, 11 + d as u64);
        let mut qkv_b = b.upload_f32(&qkv).unwrap();
        let (pb, cb, sb) = (
            b.upload_u32(&pos).unwrap(),
            b.upload_f32(&cos).unwrap(),
            b.upload_f32(&sin).unwrap(),
        );
        let tables = RopeTables { cos: &cb, sin: &sb };
        b.rope(&mut qkv_b, &pb, tables, n, heads).unwrap();
        let mut expect = qkv.clone();
        cpu::rope(&mut expect, &pos, &cos, &sin, row, h + kvh, d);
        let got = download(&b, &qkv_b, n * row);
        check(&format!("rope h={h} kvh={kvh} d={d}"), &got, &expect);
        // v heads untouched.
        for t in 0..n {
            assert_eq!(
                got[t * row + (h + kvh) * d..(t + 1) * row],
                qkv[t * row + (h + kvh) * d..(t + 1) * row]
            );
        }

        // KV write into distinct random slots of a cache pre-filled with random values.
        let block_size = 16;
        let slots_total = 8 * block_size;
        let mut all: Vec<u32> = (0..slots_total as u32).collect();
        all.shuffle(&mut rng);
        let slots = &all[..n];
        let kvw = heads.kv_width();
        let init = cpu::round_bf16(&cpu::random(slots_total * kvw, 1.0, 99));
        let mut kc = weight(&b, &init, vec![slots_total * kvw]);
        let mut vc = weight(&b, &init, vec![slots_total * kvw]);
        let sbuf = b.upload_u32(slots).unwrap();
        let kv = KvLayer {
            k: &mut kc,
            v: &mut vc,
        };
        b.kv_write(&qkv_b, &sbuf, kv, n, heads).unwrap();
        let kbytes = b.read_bytes(&kc, 0, slots_total * kvw).unwrap();
        let vbytes = b.read_bytes(&vc, 0, slots_total * kvw).unwrap();
        let kgot: Vec<f32> = kbytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        let vgot: Vec<f32> = vbytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        let mut kexp = init.clone();
        let mut vexp = init.clone();
        for (t, &s) in slots.iter().enumerate() {
            for i in 0..kvw {
                kexp[s as usize * kvw + i] = bf16::from_f32(got[t * row + h * d + i]).to_f32();
                vexp[s as usize * kvw + i] =
                    bf16::from_f32(got[t * row + (h + kvh) * d + i]).to_f32();
            }
        }
        assert_eq!(kgot, kexp, "kv_write K d={d}");
        assert_eq!(vgot, vexp, "kv_write V d={d}");

        // The fused op gives exactly what rope then kv_write gave, in the activation and the cache.
        let mut qkv_f = b.upload_f32(&qkv).unwrap();
        let mut kf = weight(&b, &init, vec![slots_total * kvw]);
        let mut vf = weight(&b, &init, vec![slots_total * kvw]);
        let tokens = NewTokens {
            positions: &pb,
            slots: &sbuf,
            n,
        };
        let kv = KvLayer {
            k: &mut kf,
            v: &mut vf,
        };
        b.rope_kv_write(&mut qkv_f, tokens, tables, kv, heads)
            .unwrap();
        assert_eq!(
            download(&b, &qkv_f, n * row),
            got,
            "rope_kv_write qkv d={d}"
        );
        assert_eq!(
            b.read_bytes(&kf, 0, slots_total * kvw).unwrap(),
            kbytes,
            "rope_kv_write K d={d}"
        );
        assert_eq!(
            b.read_bytes(&vf, 0, slots_total * kvw).unwrap(),
            vbytes,
            "rope_kv_write V d={d}"
        );
    }
}

/// A paged-attention case: random bf16 cache, shuffled block tables, random q.
pub(super) struct AttnCase {
    pub(super) heads: HeadShape,
    pub(super) block_size: usize,
    /// (context length after the step, new tokens) per sequence.
    pub(super) seqs: Vec<(usize, usize)>,
}

pub(super) fn run_attention(b: &CudaBackend, case: &AttnCase, seed: u64) -> Vec<f32> {
    let heads = case.heads;
    let (h, kvh, d, bs) = (
        heads.n_heads,
        heads.n_kv_heads,
        heads.head_dim,
        case.block_size,
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let blocks_needed: usize = case.seqs.iter().map(|&(c, _)| c.div_ceil(bs)).sum();
    let num_blocks = blocks_needed + 3;
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    free.shuffle(&mut rng);
    let mut refs = Vec::new();
    let mut q_start = 0;
    for &(ctx, n_new) in &case.seqs {
        let nb = ctx.div_ceil(bs);
        let blocks: Vec<u32> = free.drain(..nb).collect();
        refs.push(cpu::RefSeq {
            ctx,
            n_new,
            q_start,
            blocks,
        });
        q_start += n_new;
    }
    let n = q_start;
    let max_blocks = refs.iter().map(|s| s.blocks.len()).max().unwrap_or(1);
    let cache_len = num_blocks * bs * heads.kv_width();
    let kc = cpu::round_bf16(&cpu::random(cache_len, 1.0, seed + 1));
    let vc = cpu::round_bf16(&cpu::random(cache_len, 1.0, seed + 2));
    let qkv = cpu::random(n * heads.qkv_width(), 1.0, seed + 3);
    let scale = 1.0 / (d as f32).sqrt() * 2.0;

    let mut tables = vec![0u32; refs.len() * max_blocks];
    for (i, s) in refs.iter().enumerate() {
        tables[i * max_blocks..i * max_blocks + s.blocks.len()].copy_from_slice(&s.blocks);
    }
    let mut q_starts: Vec<u32> = refs.iter().map(|s| s.q_start as u32).collect();
    q_starts.push(n as u32);
    let positions: Vec<u32> = refs
        .iter()
        .flat_map(|s| (s.ctx - s.n_new..s.ctx).map(|p| p as u32))
        .collect();
    let meta = BatchMeta::<CudaBackend> {
        n_tokens: n,
        n_seqs: refs.len(),
        max_q_len: refs.iter().map(|s| s.n_new).max().unwrap_or(0),
        max_ctx_len: refs.iter().map(|s| s.ctx).max().unwrap_or(0),
        max_blocks_per_seq: max_blocks,
        positions: b.upload_u32(&positions).unwrap(),
        slot_mapping: b.upload_u32(&vec![u32::MAX; n]).unwrap(),
        q_starts: b.upload_u32(&q_starts).unwrap(),
        ctx_lens: b
            .upload_u32(&refs.iter().map(|s| s.ctx as u32).collect::<Vec<_>>())
            .unwrap(),
        block_tables: b.upload_u32(&tables).unwrap(),
    };
    // The reference reads the values the cache holds (an e4m3 cache's codes times scales).
    let (kb, vb, kc, vc) = match b.kv_dtype() {
        DType::F32 => (
            b.upload_f32(&kc).unwrap(),
            b.upload_f32(&vc).unwrap(),
            kc,
            vc,
        ),
        DType::F8E4M3 => {
            let (kb, kc) = super::kv_e4m3_tests::e4m3_cache(b, &kc, heads);
            let (vb, vc) = super::kv_e4m3_tests::e4m3_cache(b, &vc, heads);
            (kb, vb, kc, vc)
        }
        _ => (
            weight(b, &kc, vec![cache_len]),
            weight(b, &vc, vec![cache_len]),
            kc,
            vc,
        ),
    };
    let qb = b.upload_f32(&qkv).unwrap();
    let mut ob = b.alloc(DType::F32, n * heads.q_width()).unwrap();
    let shape = AttentionShape {
        heads,
        block_size: bs,
        scale,
    };
    let kv = KvLayer { k: &kb, v: &vb };
    b.paged_attention(&qb, kv, &meta, &mut ob, shape).unwrap();
    let got = download(b, &ob, n * heads.q_width());
    let cpu_kv = KvLayer {
        k: &kc[..],
        v: &vc[..],
    };
    let expect = cpu::paged_attention(&qkv, cpu_kv, &refs, shape);
    let kind = match b.kv_dtype() {
        DType::F32 => "f32 cache",
        DType::F8E4M3 => "e4m3 cache",
        _ => "bf16 cache",
    };
    check(
        &format!(
            "paged_attention ({kind}) h={h} kvh={kvh} d={d} bs={bs} seqs={:?}",
            case.seqs
        ),
        &got,
        &expect,
    );
    // Twice in a row: the split counters must have been left at zero.
    b.paged_attention(&qb, kv, &meta, &mut ob, shape).unwrap();
    check(
        "paged_attention (second launch)",
        &download(b, &ob, n * heads.q_width()),
        &expect,
    );
    // A bf16 output (an o product that multiplies in bf16 reads it without a cast) holds the f32
    // result rounded to nearest even, bit for bit; precise mode (f32 cache) refuses one.
    let mut ob16 = b.alloc(DType::BF16, n * heads.q_width()).unwrap();
    let bf16_out = b.paged_attention(&qb, kv, &meta, &mut ob16, shape);
    if b.kv_dtype() == DType::F32 {
        assert!(
            bf16_out.is_err(),
            "precise mode took a bf16 attention output"
        );
        return got;
    }
    bf16_out.unwrap();
    let rounded: Vec<u8> = got
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    assert!(
        b.read_bytes(&ob16, 0, n * heads.q_width()).unwrap() == rounded,
        "paged_attention bf16 output != the f32 output rounded, h={h} kvh={kvh} d={d} bs={bs} \
         seqs={:?}",
        case.seqs
    );
    got
}

#[test]
fn decode_attention_matches_cpu() {
    let Some(b) = device() else { return };
    let llama8b = HeadShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let cases = [
        AttnCase {
            heads: llama8b,
            block_size: 16,
            seqs: vec![
                (1, 1),
                (15, 1),
                (16, 1),
                (17, 1),
                (100, 1),
                (1000, 1),
                (4097, 1),
            ],
        },
        AttnCase {
            heads: llama8b,
            block_size: 16,
            seqs: vec![(5000, 1)],
        },
        // Many sequences of mixed lengths in one launch: more CTAs than the GPU holds at once,
        // some split and some not.
        AttnCase {
            heads: llama8b,
            block_size: 16,
            seqs: (0..300).map(|i| ((i * 37) % 700 + 1, 1)).collect(),
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 9,
                n_kv_heads: 3,
                head_dim: 64,
            },
            block_size: 16,
            seqs: vec![(5, 1), (64, 1), (65, 1), (300, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 16,
            },
            block_size: 16,
            seqs: vec![(1, 1), (2, 1), (33, 1), (129, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 8,
                n_kv_heads: 8,
                head_dim: 32,
            },
            block_size: 7,
            seqs: vec![(50, 1), (777, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 16,
                n_kv_heads: 2,
                head_dim: 256,
            },
            block_size: 32,
            seqs: vec![(31, 1), (1500, 1)],
        },
        // Tensor-core kernel corners: one query head per KV head with 7-token blocks (chunks
        // crossing blocks), two per KV head with 24-token blocks, seven (Qwen2-7B) over many splits.
        AttnCase {
            heads: HeadShape {
                n_heads: 8,
                n_kv_heads: 8,
                head_dim: 128,
            },
            block_size: 7,
            seqs: vec![(1, 1), (50, 1), (301, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 8,
                n_kv_heads: 4,
                head_dim: 64,
            },
            block_size: 24,
            seqs: vec![(5, 1), (100, 1), (777, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 28,
                n_kv_heads: 4,
                head_dim: 128,
            },
            block_size: 16,
            seqs: vec![(4001, 1)],
        },
    ];
    // Tensor-core kernel where the shape allows (bf16 cache, head_dim >= 64), then the CUDA-core
    // kernel on every shape.
    for (i, c) in cases.iter().enumerate() {
        run_attention(&b, c, 100 + i as u64);
    }
    let Some(cuda_cores) = device_with(|t| t.decode_tensor_cores = false) else {
        return;
    };
    println!("decode attention on CUDA cores:");
    for (i, c) in cases.iter().enumerate() {
        run_attention(&cuda_cores, c, 100 + i as u64);
    }
    // f32 cache (precise mode) for the first two shapes.
    let precise = b.with_precise(true);
    for (i, c) in cases.iter().take(2).enumerate() {
        run_attention(&precise, c, 150 + i as u64);
    }
    let Some(warps) = device_with(|t| t.decode_warp_items_per_sm = 1) else {
        return;
    };
    println!("decode attention, a warp per (sequence, kv head):");
    for (i, c) in warp_item_cases(&[16, 16, 7, 32]).iter().enumerate() {
        assert_warp_items(&warps, c);
        run_attention(&warps, c, 160 + i as u64);
    }
}

/// Decode cases that the tensor-core kernel takes as warp items at one item per SM
/// ([`CudaTuning::decode_warp_items_per_sm`] = 1; asserted): many sequences of mixed lengths at
/// the Llama-3-8B heads, 3 kv heads (each CTA's fourth warp idle), 8 kv heads of one query head
/// each, and head_dim 256 with 2 kv heads (two idle warps), with the given block sizes.
pub(super) fn warp_item_cases(block_sizes: &[usize; 4]) -> Vec<AttnCase> {
    let shape = |n_heads, n_kv_heads, head_dim| HeadShape {
        n_heads,
        n_kv_heads,
        head_dim,
    };
    let shapes = [
        (shape(32, 8, 128), 40),
        (shape(9, 3, 64), 100),
        (shape(8, 8, 128), 40),
        (shape(16, 2, 256), 140),
    ];
    shapes
        .iter()
        .zip(block_sizes)
        .map(|(&(heads, n), &block_size)| AttnCase {
            heads,
            block_size,
            seqs: (0..n).map(|i| ((i * 37) % 300 + 1, 1)).collect(),
        })
        .collect()
}

/// Asserts that `b` launches `case`'s decode rows as warp items.
pub(super) fn assert_warp_items(b: &CudaBackend, case: &AttnCase) {
    let (n, kvh) = (case.seqs.len(), case.heads.n_kv_heads);
    let max_ctx = case.seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let plan = b.decode_plan(n, kvh, max_ctx);
    assert!(
        b.warp_items(n, kvh, plan),
        "{n} sequences x {kvh} kv heads ({plan:?}) should be warp items on {} SMs",
        b.sm_count
    );
}

#[test]
fn prefill_attention_matches_cpu() {
    let Some(b) = device() else { return };
    let llama8b = HeadShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let cases = [
        // Fresh prompts of odd lengths, a chunk continuing a prefix, and decode rows, in one launch.
        AttnCase {
            heads: llama8b,
            block_size: 16,
            seqs: vec![(1, 1), (17, 17), (45, 40), (170, 70), (130, 130), (300, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 9,
                n_kv_heads: 3,
                head_dim: 64,
            },
            block_size: 16,
            seqs: vec![(23, 23), (100, 37), (64, 1)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 16,
            },
            block_size: 16,
            seqs: vec![(7, 7), (40, 33), (16, 16)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 8,
                n_kv_heads: 1,
                head_dim: 128,
            },
            block_size: 5,
            seqs: vec![(81, 81)],
        },
        AttnCase {
            heads: HeadShape {
                n_heads: 4,
                n_kv_heads: 4,
                head_dim: 256,
            },
            block_size: 16,
            seqs: vec![(66, 66), (20, 3)],
        },
        // Long chunks over prefixes (many key stages, partial last tiles) beside a long decode row.
        AttnCase {
            heads: llama8b,
            block_size: 16,
            seqs: vec![(600, 200), (1000, 1), (97, 97)],
        },
    ];
    // Tensor-core kernel where the shape allows (bf16 cache, head_dim >= 64), then the CUDA-core
    // kernel on every shape.
    for (i, c) in cases.iter().enumerate() {
        run_attention(&b, c, 200 + i as u64);
    }
    let Some(cuda_cores) = device_with(|t| t.prefill_tensor_cores = false) else {
        return;
    };
    println!("prefill attention on CUDA cores:");
    for (i, c) in cases.iter().enumerate() {
        run_attention(&cuda_cores, c, 200 + i as u64);
    }
    // Deterministic mode runs a prefill through the decode kernel, one row a token, in chunks.
    let Some(det) = device_with(|t| t.deterministic = true) else {
        return;
    };
    println!("prefill attention in deterministic mode:");
    for (i, c) in cases.iter().take(3).enumerate() {
        run_attention(&det, c, 200 + i as u64);
    }
    let precise = b.with_precise(true);
    for (i, c) in cases.iter().take(2).enumerate() {
        run_attention(&precise, c, 250 + i as u64);
    }
}

/// `draw_rows` against the engine's host `draw` (engine/draw.rs), token for token: the draw is
/// specified to the bit, so every draw must agree, with no margin for rounding. Random rows of
/// three vocabularies (Llama-3's among them), rows with exact ties (coarse logits), banned tokens
/// (-inf), NaNs, an all -inf row and a +inf row; every setting of temperature, top-k, top-p and
/// min-p the engine sends, the rows drawn out of order and one row drawn twice.
#[test]
fn draw_rows_match_the_engine_draw() {
    use crate::engine::draw::{DrawSpec, draw};
    let Some(b) = device() else { return };
    let mut rng = StdRng::seed_from_u64(17);
    let mut compared = 0;
    for vocab in [7, 1001, 128256] {
        let rows = 8;
        let mut logits = cpu::random(rows * vocab, 4.0, vocab as u64);
        let row = |r: usize| r * vocab..(r + 1) * vocab;
        // Row 1: coarse (many ties); row 2: heavy tokens and banned ones; row 3: NaNs;
        // row 4: all -inf; row 5: a +inf; row 6: one dominant token.
        for x in &mut logits[row(1)] {
            *x = (*x * 2.0).round();
        }
        for (j, x) in logits[row(2)].iter_mut().enumerate() {
            if j % 7 == 3 {
                *x = f32::NEG_INFINITY;
            }
            if j % 97 == 5 {
                *x += 8.0;
            }
        }
        logits[row(3)][0] = f32::NAN;
        logits[row(3)][vocab / 2] = f32::NAN;
        logits[row(4)].fill(f32::NEG_INFINITY);
        logits[row(5)][vocab / 3] = f32::INFINITY;
        logits[row(6)][vocab - 1] = 30.0;
        let lb = b.upload_f32(&logits).unwrap();
        let settings: [(f32, u32, f32, f32); 9] = [
            (1.0, 0, 1.0, 0.0),
            (0.7, 0, 1.0, 0.0),
            (0.8, 50, 1.0, 0.0),
            (1.3, 0, 0.9, 0.0),
            (0.6, 40, 0.8, 0.0),
            (2.0, 1000, 0.95, 0.05),
            (1.0, 5, 0.5, 0.0),
            (1.0, 0, 1.0, 0.1),
            (0.9, 3, 0.3, 0.2),
        ];
        for trial in 0..6 {
            let mut draws: Vec<(usize, DrawRow)> = Vec::new();
            for r in (0..rows).rev() {
                let (temperature, top_k, top_p, min_p) = settings[(r + trial) % settings.len()];
                let bits = rng.r#gen::<u64>() >> 11;
                draws.push((
                    r,
                    DrawRow {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        bits,
                    },
                ));
            }
            draws.push((
                1,
                DrawRow {
                    bits: 0,
                    ..draws[0].1
                },
            ));
            let got = b.draw_rows(&lb, vocab, &draws).unwrap();
            for (k, (r, d)) in draws.iter().enumerate() {
                let spec = DrawSpec {
                    temperature: d.temperature,
                    top_k: d.top_k,
                    top_p: d.top_p,
                    min_p: d.min_p,
                    bits: d.bits,
                };
                assert_eq!(
                    got[k],
                    draw(&logits[row(*r)], &spec),
                    "vocab {vocab} row {r} trial {trial}: {spec:?}"
                );
                compared += 1;
            }
            // By row (a decode step's one download): rows 0, 2 and 5 drawn into a buffer of
            // sentinels; each drawn row holds its draw's token, every other entry is untouched.
            let picked: Vec<(usize, DrawRow)> = draws
                .iter()
                .filter(|(r, _)| [0, 2, 5].contains(r))
                .copied()
                .collect();
            let mut at_rows = b.upload_u32(&vec![u32::MAX; rows + 3]).unwrap();
            b.enqueue_draws_at_rows(&lb, vocab, &picked, &mut at_rows)
                .unwrap();
            let mut ids = vec![0u32; rows + 3];
            b.download_u32(&at_rows, &mut ids).unwrap();
            for (r, id) in ids.iter().enumerate() {
                let want = match picked.iter().find(|(pr, _)| *pr == r) {
                    Some((_, d)) => got[draws.iter().position(|x| x == &(r, *d)).unwrap()],
                    None => u32::MAX,
                };
                assert_eq!(*id, want, "vocab {vocab} trial {trial}: entry {r} by row");
            }
        }
    }
    println!("draw_rows: {compared} draws equal to the host's, by row too");
}

/// `argmax_rows` against the engine's host `argmax` (engine/sampler.rs), the rule the engine's
/// greedy rows must follow on either side: random rows, exact ties (lowest id wins), NaNs (never
/// win), an all -inf row (first id) and an all-NaN row (last id).
#[test]
fn argmax_rows_matches_the_engine_sampler() {
    let Some(b) = device() else { return };
    for vocab in [7, 1001, 128256] {
        let rows = 8;
        let mut logits = cpu::random(rows * vocab, 4.0, 31 + vocab as u64);
        let row = |r: usize| r * vocab..(r + 1) * vocab;
        // Row 1: the maximum appears twice; row 2: NaNs around a maximum; row 3: all -inf;
        // row 4: all NaN; row 5: NaN first, then a tie at the end.
        logits[row(1)][vocab / 3] = 100.0;
        logits[row(1)][vocab - 1] = 100.0;
        logits[row(2)][0] = f32::NAN;
        logits[row(2)][vocab / 2] = f32::NAN;
        logits[row(2)][vocab / 2 + 1] = 50.0;
        logits[row(3)].fill(f32::NEG_INFINITY);
        logits[row(4)].fill(f32::NAN);
        logits[row(5)][0] = f32::NAN;
        logits[row(5)][vocab - 2] = 60.0;
        logits[row(5)][vocab - 1] = 60.0;
        let lb = b.upload_f32(&logits).unwrap();
        let mut out = b.alloc(DType::U32, rows).unwrap();
        b.argmax_rows(&lb, vocab, rows, &mut out).unwrap();
        let mut got = vec![0u32; rows];
        b.download_u32(&out, &mut got).unwrap();
        let want: Vec<u32> = (0..rows)
            .map(|r| crate::engine::sampler::argmax(&logits[row(r)]))
            .collect();
        assert_eq!(got, want, "vocab {vocab}");
        assert_eq!((want[3], want[4]), (0, vocab as u32 - 1));
    }
}
