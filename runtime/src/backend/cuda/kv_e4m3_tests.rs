//! GPU checks of the e4m3 KV cache (`--kv-dtype fp8`, `kv_e4m3.rs`) against host references:
//! - the writes (`rope_kv_write`, `kv_write`): every code and scale byte equals the host's
//!   quantization (the OCP e4m3 encoder of `fp8_tests`: round to nearest, ties to even,
//!   saturated) of the values the bf16 path's `rope_kv_write` leaves in qkv -- whose rotation
//!   the e4m3 write matches bit for bit --; a skipped token's slot stays untouched, a head of
//!   zeros stores scale 0;
//! - decode and prefill attention over such a cache (the tensor-core kernels with f16
//!   operands, and deterministic mode's prefill as decode rows) against the f64 reference over
//!   the values the cache holds (code x scale), within the bf16 tests' bound.
//!
//! The fused RoPE + write + decode attention is checked against the unfused ops, byte for byte,
//! in `fused_rope_tests`. Skips with a printed reason without a GPU.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sov_kernels::{KV_E4M3_GROUP, kv_e4m3_row_bytes};

use super::fp8_tests::encode;
use super::fused_rope_tests::rope_tables;
use super::reference as cpu;
use super::tests::{AttnCase, device_with, run_attention};
use super::{CudaBackend, CudaBuffer};
use crate::backend::{Backend, DType, HeadShape, KvLayer, NewTokens, RopeTables};
use crate::loader::fp8::e4m3_to_f32;

/// One head's values as every writer stores them (`kv_quant_inv` / `kv_quant_scale` in
/// `common.cuh`): codes of `x * (448 / amax)` and the scale `amax / 448`.
fn quantize_head(x: &[f32]) -> (Vec<u8>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let inv = if amax > 0.0 { 448.0 / amax } else { 0.0 };
    (x.iter().map(|&v| encode(v * inv)).collect(), amax / 448.0)
}

/// Byte offsets of slot `slot`'s codes and scale of head `head` in an e4m3 cache of `kvh` heads
/// of `d`: groups of 16 slots, `[kvh][16][d]` codes then `[kvh][16]` f32 scales
/// (`kv8_codes_at` / `kv8_scale_at` in `common.cuh`).
pub(super) fn e4m3_offsets(kvh: usize, d: usize, slot: usize, head: usize) -> (usize, usize) {
    let group = slot / KV_E4M3_GROUP * KV_E4M3_GROUP * kv_e4m3_row_bytes(kvh, d);
    let i = head * KV_E4M3_GROUP + slot % KV_E4M3_GROUP;
    (group + i * d, group + kvh * KV_E4M3_GROUP * d + i * 4)
}

/// An e4m3 cache holding `values` (`[slots, KVH, D]` f32, slots a multiple of 16), and the
/// values it holds (code x scale) in that layout.
pub(super) fn e4m3_cache(
    b: &CudaBackend,
    values: &[f32],
    heads: HeadShape,
) -> (CudaBuffer, Vec<f32>) {
    let (kvh, d) = (heads.n_kv_heads, heads.head_dim);
    let row = kv_e4m3_row_bytes(kvh, d);
    let slots = values.len() / (kvh * d);
    assert!(
        slots.is_multiple_of(KV_E4M3_GROUP),
        "{slots} slots: not whole groups"
    );
    let mut bytes = vec![0u8; slots * row]; // slots * row bytes, groups of 16 slots
    let mut held = vec![0f32; values.len()]; // [slots, kvh, d]
    for s in 0..slots {
        for h in 0..kvh {
            let at = (s * kvh + h) * d;
            let (codes, scale) = quantize_head(&values[at..at + d]);
            let (c, sc) = e4m3_offsets(kvh, d, s, h);
            bytes[c..c + d].copy_from_slice(&codes);
            bytes[sc..sc + 4].copy_from_slice(&scale.to_le_bytes());
            for (j, &c) in codes.iter().enumerate() {
                held[at + j] = e4m3_to_f32(c) * scale;
            }
        }
    }
    (b.upload_bytes(DType::F8E4M3, &bytes).unwrap(), held)
}

/// The e4m3 bytes `qkv`'s k and v heads (`[n, (H + 2 KVH) D]`) give at `slots`, in caches of
/// `total` slots (a multiple of 16; zero elsewhere): (K bytes, V bytes).
fn expected_rows(qkv: &[f32], slots: &[u32], heads: HeadShape, total: usize) -> [Vec<u8>; 2] {
    let (h, kvh, d) = (heads.n_heads, heads.n_kv_heads, heads.head_dim);
    let row = kv_e4m3_row_bytes(kvh, d);
    let mut out = [vec![0u8; total * row], vec![0u8; total * row]]; // total * row bytes each
    for (t, &slot) in slots.iter().enumerate() {
        if slot == u32::MAX {
            continue;
        }
        for (which, cache) in out.iter_mut().enumerate() {
            for g in 0..kvh {
                let at = t * heads.qkv_width() + (h + which * kvh + g) * d;
                let (codes, scale) = quantize_head(&qkv[at..at + d]);
                let (c, sc) = e4m3_offsets(kvh, d, slot as usize, g);
                cache[c..c + d].copy_from_slice(&codes);
                cache[sc..sc + 4].copy_from_slice(&scale.to_le_bytes());
            }
        }
    }
    out
}

#[test]
fn writes_store_the_reference_codes_and_scales() {
    let Some(e4m3) = device_with(|t| t.kv_e4m3 = true) else {
        return;
    };
    let Some(bf16) = device_with(|_| {}) else {
        return;
    };
    let shapes = [
        (32, 8, 128, 37),
        (9, 3, 64, 20),
        (4, 1, 256, 5),
        (8, 8, 128, 300),
    ];
    for (i, &(n_heads, n_kv_heads, head_dim, n)) in shapes.iter().enumerate() {
        let heads = HeadShape {
            n_heads,
            n_kv_heads,
            head_dim,
        };
        let (d, w) = (head_dim, heads.qkv_width());
        let mut rng = StdRng::seed_from_u64(700 + i as u64);
        let total = (n + 9usize).div_ceil(KV_E4M3_GROUP) * KV_E4M3_GROUP; // whole slot groups
        let mut free: Vec<u32> = (0..total as u32).collect();
        free.shuffle(&mut rng);
        let mut slots = free[..n].to_vec(); // [n]
        slots[n / 2] = u32::MAX; // a token without a slot
        let positions: Vec<u32> = (0..n).map(|_| rng.gen_range(0..64)).collect(); // [n]
        let mut qkv = cpu::random(n * w, 3.0, 710 + i as u64); // [n, (h + 2 kvh) d]
        // A k head of zeros (scale 0) and one huge value (its head's others round to few codes).
        qkv[n_heads * d..(n_heads + 1) * d].fill(0.0);
        qkv[w + (n_heads + n_kv_heads) * d + 3] = 5e4;
        let (cos, sin) = rope_tables(64, d);
        let (pb, sb) = (
            e4m3.upload_u32(&positions).unwrap(),
            e4m3.upload_u32(&slots).unwrap(),
        );
        let (cb, nb) = (
            e4m3.upload_f32(&cos).unwrap(),
            e4m3.upload_f32(&sin).unwrap(),
        );
        let tokens = NewTokens {
            positions: &pb,
            slots: &sb,
            n,
        };
        let tables = RopeTables { cos: &cb, sin: &nb };
        let row = e4m3.kv_row_elems(heads);
        assert_eq!(row, kv_e4m3_row_bytes(n_kv_heads, d));
        let mut k = e4m3.alloc(DType::F8E4M3, total * row).unwrap();
        let mut v = e4m3.alloc(DType::F8E4M3, total * row).unwrap();
        let mut q = e4m3.upload_f32(&qkv).unwrap();
        let kv = KvLayer {
            k: &mut k,
            v: &mut v,
        };
        e4m3.rope_kv_write(&mut q, tokens, tables, kv, heads)
            .unwrap();
        let mut rotated = vec![0f32; n * w];
        e4m3.download_f32(&q, &mut rotated).unwrap();
        // The bf16 path's rotation of the same input, bit for bit.
        let (pb2, sb2) = (
            bf16.upload_u32(&positions).unwrap(),
            bf16.upload_u32(&slots).unwrap(),
        );
        let (cb2, nb2) = (
            bf16.upload_f32(&cos).unwrap(),
            bf16.upload_f32(&sin).unwrap(),
        );
        let mut q2 = bf16.upload_f32(&qkv).unwrap();
        let mut k2 = bf16.alloc(DType::BF16, total * heads.kv_width()).unwrap();
        let mut v2 = bf16.alloc(DType::BF16, total * heads.kv_width()).unwrap();
        let tokens2 = NewTokens {
            positions: &pb2,
            slots: &sb2,
            n,
        };
        let kv2 = KvLayer {
            k: &mut k2,
            v: &mut v2,
        };
        let tables2 = RopeTables {
            cos: &cb2,
            sin: &nb2,
        };
        bf16.rope_kv_write(&mut q2, tokens2, tables2, kv2, heads)
            .unwrap();
        let mut rotated2 = vec![0f32; n * w];
        bf16.download_f32(&q2, &mut rotated2).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&rotated) == bits(&rotated2),
            "rotation differs from rope_kv_write's: {heads:?}"
        );
        let [ek, ev] = expected_rows(&rotated, &slots, heads, total);
        assert!(
            e4m3.read_bytes(&k, 0, total * row).unwrap() == ek,
            "K rows: {heads:?}"
        );
        assert!(
            e4m3.read_bytes(&v, 0, total * row).unwrap() == ev,
            "V rows: {heads:?}"
        );
        // kv_write: the same rows from values left as they are.
        let mut k = e4m3.alloc(DType::F8E4M3, total * row).unwrap();
        let mut v = e4m3.alloc(DType::F8E4M3, total * row).unwrap();
        let q = e4m3.upload_f32(&qkv).unwrap();
        let kv = KvLayer {
            k: &mut k,
            v: &mut v,
        };
        e4m3.kv_write(&q, &sb, kv, n, heads).unwrap();
        let [ek, ev] = expected_rows(&qkv, &slots, heads, total);
        assert!(
            e4m3.read_bytes(&k, 0, total * row).unwrap() == ek,
            "kv_write K rows: {heads:?}"
        );
        assert!(
            e4m3.read_bytes(&v, 0, total * row).unwrap() == ev,
            "kv_write V rows: {heads:?}"
        );
        println!("e4m3 writes == host quantization: {heads:?}, {n} tokens");
    }
}

#[test]
fn attention_over_an_e4m3_cache_matches_cpu() {
    let Some(b) = device_with(|t| t.kv_e4m3 = true) else {
        return;
    };
    let llama8b = HeadShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
    };
    let smollm2 = HeadShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let wide = HeadShape {
        n_heads: 16,
        n_kv_heads: 2,
        head_dim: 256,
    };
    let case = |heads, block_size, seqs: &[(usize, usize)]| AttnCase {
        heads,
        block_size,
        seqs: seqs.to_vec(),
    };
    let many: Vec<(usize, usize)> = (0..100).map(|i| ((i * 37) % 300 + 1, 1)).collect();
    let cases = [
        // Decode rows: block and chunk boundaries, split-K, a long context.
        case(
            llama8b,
            16,
            &[(1, 1), (15, 1), (16, 1), (17, 1), (100, 1), (4097, 1)],
        ),
        case(smollm2, 16, &[(5, 1), (64, 1), (65, 1), (300, 1)]),
        case(wide, 32, &[(31, 1), (1500, 1)]),
        case(llama8b, 48, &[(1, 1), (50, 1), (301, 1)]),
        // Many sequences of mixed lengths in one launch (more CTAs than the GPU holds at once).
        case(llama8b, 16, &many),
        // Prompts of odd lengths, chunks over prefixes and decode rows in one launch.
        case(
            llama8b,
            16,
            &[(1, 1), (17, 17), (45, 40), (170, 70), (300, 1)],
        ),
        case(smollm2, 16, &[(23, 23), (100, 37), (64, 1)]),
        case(wide, 16, &[(66, 66), (20, 3)]),
        case(llama8b, 16, &[(600, 200), (1000, 1), (97, 97)]),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_attention(&b, c, 500 + i as u64);
    }
    // A warp per (sequence, kv head): wide decode launches (block sizes multiples of 16).
    let Some(warps) = device_with(|t| {
        t.kv_e4m3 = true;
        t.decode_warp_items_per_sm = 1;
    }) else {
        return;
    };
    println!("e4m3 cache, a warp per (sequence, kv head):");
    for (i, c) in super::tests::warp_item_cases(&[16, 16, 48, 32])
        .iter()
        .enumerate()
    {
        super::tests::assert_warp_items(&warps, c);
        run_attention(&warps, c, 520 + i as u64);
    }
    // Deterministic mode: prefill as decode rows, fixed splits.
    let Some(det) = device_with(|t| {
        t.kv_e4m3 = true;
        t.deterministic = true;
    }) else {
        return;
    };
    println!("e4m3 cache, deterministic mode:");
    for (i, c) in cases.iter().enumerate() {
        run_attention(&det, c, 500 + i as u64);
    }
}
