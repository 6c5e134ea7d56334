//! GPU check of the fused RoPE + KV write + decode attention ([`Backend::rope_kv_attention`]):
//! on fresh random activations and caches it must give exactly -- bit for bit, in the attention
//! output and in both caches -- what `rope_kv_write` followed by `paged_attention` gives, over
//! head shapes, block sizes, contexts at block and chunk boundaries, contexts long enough for
//! split-K, several sequences in one launch and a padding row (context 0, no slot) as the decode
//! graphs add; with a bf16 cache and with an e4m3 one (`--kv-dtype fp8`); in the CTA form and in
//! warp items. Skips with a printed reason without a GPU.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::reference as cpu;
use super::tests::weight;
use super::{CudaBackend, CudaBuffer};
use crate::backend::{AttentionShape, Backend, BatchMeta, DType, HeadShape, KvLayer, RopeTables};

/// Rotation tables `[max_pos, d/2]` (Llama-3 base; any cos/sin pair exercises the kernels).
pub(super) fn rope_tables(max_pos: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let half = d / 2;
    let (mut cos, mut sin) = (vec![0f32; max_pos * half], vec![0f32; max_pos * half]);
    for p in 0..max_pos {
        for j in 0..half {
            let a = p as f64 * 500000f64.powf(-(2.0 * j as f64) / d as f64);
            cos[p * half + j] = a.cos() as f32;
            sin[p * half + j] = a.sin() as f32;
        }
    }
    (cos, sin)
}

/// One decode step over sequences of `ctxs` tokens (0 = a padding row), run both ways.
fn check_case(b: &CudaBackend, heads: HeadShape, block_size: usize, ctxs: &[usize], seed: u64) {
    let (d, bs) = (heads.head_dim, block_size);
    let mut rng = StdRng::seed_from_u64(seed);
    let blocks: usize = ctxs.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 2;
    let mut free: Vec<u32> = (0..blocks as u32).collect();
    free.shuffle(&mut rng);
    let max_blocks = ctxs
        .iter()
        .map(|c| c.div_ceil(bs))
        .max()
        .unwrap_or(1)
        .max(1);
    let n = ctxs.len();
    let mut tables = vec![0u32; n * max_blocks]; // [n, max_blocks]
    let mut slots = vec![u32::MAX; n]; // [n]
    let mut positions = vec![0u32; n]; // [n]
    for (s, &ctx) in ctxs.iter().enumerate() {
        let own: Vec<u32> = free.drain(..ctx.div_ceil(bs)).collect();
        tables[s * max_blocks..s * max_blocks + own.len()].copy_from_slice(&own);
        if ctx > 0 {
            let p = ctx - 1;
            positions[s] = p as u32;
            slots[s] = own[p / bs] * bs as u32 + (p % bs) as u32;
        }
    }
    let max_pos = ctxs.iter().copied().max().unwrap_or(1).max(1);
    let (cos, sin) = rope_tables(max_pos, d);
    let meta = BatchMeta::<CudaBackend> {
        n_tokens: n,
        n_seqs: n,
        max_q_len: 1,
        max_ctx_len: max_pos,
        max_blocks_per_seq: max_blocks,
        positions: b.upload_u32(&positions).unwrap(),
        slot_mapping: b.upload_u32(&slots).unwrap(),
        q_starts: b.upload_u32(&(0..=n as u32).collect::<Vec<_>>()).unwrap(),
        ctx_lens: b
            .upload_u32(&ctxs.iter().map(|&c| c as u32).collect::<Vec<_>>())
            .unwrap(),
        block_tables: b.upload_u32(&tables).unwrap(),
    };
    let values = blocks * bs * heads.kv_width();
    let kc = cpu::round_bf16(&cpu::random(values, 1.0, seed + 1)); // [blocks, bs, kvh, d]
    let vc = cpu::round_bf16(&cpu::random(values, 1.0, seed + 2)); // [blocks, bs, kvh, d]
    // Elements of the cache buffers: [blocks, bs, row] (an e4m3 row holds its scales too).
    let cache_len = blocks * bs * b.kv_row_elems(heads);
    let cache = |vals: &[f32]| -> CudaBuffer {
        match b.kv_dtype() {
            DType::F8E4M3 => super::kv_e4m3_tests::e4m3_cache(b, vals, heads).0,
            _ => weight(b, vals, vec![vals.len()]),
        }
    };
    let qkv = cpu::random(n * heads.qkv_width(), 1.0, seed + 3); // [n, (h + 2 kvh) d]
    let zeros = vec![0f32; n * heads.q_width()]; // [n, h d]
    let (cb, sb) = (b.upload_f32(&cos).unwrap(), b.upload_f32(&sin).unwrap());
    let scale = 1.0 / (d as f32).sqrt();
    let run = |fused: bool| -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let mut k = cache(&kc);
        let mut v = cache(&vc);
        let mut q = b.upload_f32(&qkv).unwrap();
        let mut out: CudaBuffer = b.upload_f32(&zeros).unwrap();
        let tables = RopeTables { cos: &cb, sin: &sb };
        let shape = AttentionShape {
            heads,
            block_size: bs,
            scale,
        };
        let kv = KvLayer {
            k: &mut k,
            v: &mut v,
        };
        if fused {
            b.rope_kv_attention(&mut q, tables, kv, &meta, &mut out, shape)
                .unwrap();
        } else {
            let mut kv = kv;
            b.rope_kv_write(&mut q, meta.new_tokens(), tables, kv.reborrow(), heads)
                .unwrap();
            b.paged_attention(&q, kv.as_shared(), &meta, &mut out, shape)
                .unwrap();
        }
        (
            b.read_bytes(&out, 0, out.len).unwrap(),
            b.read_bytes(&k, 0, cache_len).unwrap(),
            b.read_bytes(&v, 0, cache_len).unwrap(),
        )
    };
    let (unfused, fused) = (run(false), run(true));
    let what = format!(
        "h={} kvh={} d={d} bs={bs} ctxs={ctxs:?} cache {:?}",
        heads.n_heads,
        heads.n_kv_heads,
        b.kv_dtype()
    );
    assert!(fused.0 == unfused.0, "attention output differs: {what}");
    assert!(fused.1 == unfused.1, "K cache differs: {what}");
    assert!(fused.2 == unfused.2, "V cache differs: {what}");
    // The step's new rows did land in the cache (a slot that was never written would compare
    // equal on both sides).
    assert!(
        fused.1 != b.read_bytes(&cache(&kc), 0, cache_len).unwrap(),
        "K rows not written: {what}"
    );
    println!("fused rope + attention == rope_kv_write + paged_attention: {what}");
}

/// Head shapes, block sizes and contexts of the checks below.
fn cases() -> Vec<(HeadShape, usize, Vec<usize>)> {
    let llama8b = HeadShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let mut rng = StdRng::seed_from_u64(5);
    let many: Vec<usize> = (0..37).map(|_| rng.gen_range(1..700)).collect();
    vec![
        (llama8b, 16, vec![1]),
        (llama8b, 16, vec![16, 17, 63, 64, 65]),
        (llama8b, 16, vec![300]),
        (llama8b, 16, vec![4097]),
        (llama8b, 16, vec![129, 0, 2000]),
        (llama8b, 16, many),
        (
            HeadShape {
                n_heads: 8,
                n_kv_heads: 4,
                head_dim: 64,
            },
            24,
            vec![5, 100, 777],
        ),
        (
            HeadShape {
                n_heads: 8,
                n_kv_heads: 8,
                head_dim: 128,
            },
            7,
            vec![1, 50, 301],
        ),
        (
            HeadShape {
                n_heads: 16,
                n_kv_heads: 2,
                head_dim: 256,
            },
            32,
            vec![31, 1500],
        ),
        (
            HeadShape {
                n_heads: 28,
                n_kv_heads: 4,
                head_dim: 128,
            },
            16,
            vec![4001, 3],
        ),
    ]
}

/// A device that fuses the RoPE into every decode step it can, whatever its row count.
fn fused_device(kv_e4m3: bool) -> Option<CudaBackend> {
    super::tests::device_with(|t| {
        t.kv_e4m3 = kv_e4m3;
        t.decode_fused_rope_max_rows = usize::MAX;
    })
}

#[test]
fn fused_rope_attention_matches_the_unfused_ops() {
    let Some(b) = fused_device(false) else { return };
    if b.kv_dtype() != DType::BF16 {
        return;
    }
    for (i, (heads, bs, ctxs)) in cases().iter().enumerate() {
        check_case(&b, *heads, *bs, ctxs, 300 + i as u64);
    }
}

/// The e4m3 cache: the fused write quantizes as `rope_kv_write_e4m3` does, byte for byte.
#[test]
fn fused_rope_attention_matches_the_unfused_ops_e4m3() {
    let Some(b) = fused_device(true) else { return };
    // Its blocks are whole groups of 16 slots: the cases' block sizes 7 and 24 become 16 and 32.
    assert_eq!(b.kv_block_multiple(), 16);
    for (i, (heads, bs, ctxs)) in cases().iter().enumerate() {
        check_case(&b, *heads, bs.next_multiple_of(16), ctxs, 400 + i as u64);
    }
}

/// Warp items (`decode_attention_warp_item`): the warp that reads a (sequence, kv head) makes and
/// writes its newest token itself. Many sequences of mixed lengths, a padding row among them, at
/// three head shapes, with both caches; each case asserted to launch as warp items.
#[test]
fn fused_rope_warp_items_match_the_unfused_ops() {
    for kv_e4m3 in [false, true] {
        let Some(b) = super::tests::device_with(|t| {
            t.kv_e4m3 = kv_e4m3;
            t.decode_warp_items_per_sm = 1;
            t.decode_fused_rope_max_rows = 0;
            t.decode_warp_fused_rope = true;
        }) else {
            return;
        };
        let shapes = [(32, 8, 128), (8, 4, 64), (16, 2, 256)];
        for (i, &(n_heads, n_kv_heads, head_dim)) in shapes.iter().enumerate() {
            let heads = HeadShape {
                n_heads,
                n_kv_heads,
                head_dim,
            };
            // Enough sequences that the split planner keeps one split (three items an SM);
            // contexts at chunk edges and a padding row (context 0, no slot), as a decode graph's
            // bucket adds.
            let n = (3 * b.sm_count).div_ceil(n_kv_heads);
            let mut ctxs: Vec<usize> = (0..n).map(|s| (s * 37) % 300 + 1).collect();
            ctxs[1] = 16;
            ctxs[2] = 17;
            ctxs[3] = 0;
            let case = super::tests::AttnCase {
                heads,
                block_size: 16,
                seqs: ctxs.iter().map(|&c| (c.max(1), 1)).collect(),
            };
            super::tests::assert_warp_items(&b, &case);
            check_case(&b, heads, 16, &ctxs, 600 + i as u64 + 10 * kv_e4m3 as u64);
        }
    }
}
