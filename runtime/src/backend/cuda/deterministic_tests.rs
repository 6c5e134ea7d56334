//! GPU checks of the deterministic (batch-invariant) mode, bit for bit: a product's rows alone
//! equal the same rows inside a product of 1024 rows, at every count 1..=256 and some up to 1024
//! (so across the small-row kernel's crossover to cuBLASLt); a decode row's
//! attention alone equals it beside other sequences; and a prefill -- over a cached prefix, with
//! another sequence in the same launch -- writes exactly the K/V and attention outputs that decode
//! steps of the same tokens write. Products are also held to the CPU reference (bf16 bounds).
//! Skips with a printed reason without a GPU.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::product_dims::ProductDims;
use super::reference as cpu;
use super::tests::{device_with, weight};
use super::{CudaBackend, CudaBuffer};
use crate::backend::{AttentionShape, Backend, BatchMeta, DType, HeadShape, KvLayer, RopeTables};

fn deterministic() -> Option<CudaBackend> {
    device_with(|t| t.deterministic = true)
}

fn f32s(b: &CudaBackend, buf: &CudaBuffer, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    b.download_f32(buf, &mut out).unwrap();
    out
}

#[test]
fn products_are_batch_invariant() {
    let Some(b) = deterministic() else { return };
    let Some(fast) = device_with(|_| {}) else {
        return;
    };
    // Rows of the reference product; every count 1..=256 (the small-row kernel's range and the
    // crossover to cuBLASLt included) and a spread of longer ones up to N.
    const N: usize = 1024;
    const LONG: [usize; 9] = [257, 300, 383, 511, 512, 513, 777, 1000, 1024];
    // Llama-3-8B's qkv, o and down shapes, SmolLM2's gate/up, and an odd one.
    for (k, m) in [
        (4096, 6144),
        (4096, 4096),
        (14336, 4096),
        (576, 3072),
        (333, 1001),
    ] {
        let seed = (k * 3 + m) as u64;
        let x = cpu::round_bf16(&cpu::random(N * k, 1.0, seed)); // [N, k], exact in bf16
        let w = cpu::round_bf16(&cpu::random(m * k, 0.5, seed + 1)); // [m, k]
        let wb = weight(&b, &w, vec![m, k]);
        let full_x = b.upload_f32(&x).unwrap();
        let mut full = b.alloc(DType::F32, N * m).unwrap();
        b.matmul(&full_x, &wb, &mut full, N, k, m).unwrap();
        let full = f32s(&b, &full, N * m);
        let expect = cpu::matmul(&x[..8 * k], &w, 8, k, m);
        let e = cpu::rel_err(&full[..8 * m], &expect);
        assert!(e <= 1e-2, "{k}x{m}: relative error {e} against the CPU");
        let mut rng = StdRng::seed_from_u64(seed + 2);
        let (mut fast_differs, mut fast_counts) = (0, 0);
        for rows in (1..=256).chain(LONG) {
            // `rows` consecutive rows from a random offset, as bf16 inputs (what the model's
            // producers write in this mode).
            let off = rng.gen_range(0..=N - rows);
            let xs = &x[off * k..(off + rows) * k];
            let xb = weight(&b, xs, vec![rows, k]);
            let mut ob = b.alloc(DType::F32, rows * m).unwrap();
            b.matmul(&xb, &wb, &mut ob, rows, k, m).unwrap();
            let got = f32s(&b, &ob, rows * m);
            let want = &full[off * m..(off + rows) * m];
            if let Some(i) = (0..rows * m).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                panic!(
                    "{k}x{m}: {rows} rows from row {off}: row {} col {} is {} alone, {} in {N}",
                    i / m,
                    i % m,
                    got[i],
                    want[i]
                );
            }
            if rows <= 256 && (rows.is_power_of_two() || rows % 37 == 0) {
                let xf = fast.upload_f32(xs).unwrap();
                let mut of = fast.alloc(DType::F32, rows * m).unwrap();
                fast.matmul(&xf, &wb, &mut of, rows, k, m).unwrap();
                fast_differs += usize::from(f32s(&fast, &of, rows * m) != got);
                fast_counts += 1;
            }
        }
        // A prefill-sized product (2048 rows, 256 of them the rows above) gives the same rows.
        let mut big = x.clone();
        big.extend(cpu::round_bf16(&cpu::random((2048 - N) * k, 1.0, seed + 3)));
        let bx = weight(&b, &big, vec![2048, k]);
        let mut bo = b.alloc(DType::F32, 2048 * m).unwrap();
        b.matmul(&bx, &wb, &mut bo, 2048, k, m).unwrap();
        let bo = f32s(&b, &bo, 2048 * m);
        assert!(
            bo[..N * m]
                .iter()
                .zip(&full)
                .all(|(a, c)| a.to_bits() == c.to_bits()),
            "{k}x{m}: rows of a 2048-row product differ from the same rows in {N}"
        );
        // And one that is not a multiple of a launch's rows (1024 + 476: the remainder runs with
        // the algorithm chosen for 1024 rows).
        let (odd, ob) = (1500, weight(&b, &big[..1500 * k], vec![1500, k]));
        let mut oo = b.alloc(DType::F32, odd * m).unwrap();
        b.matmul(&ob, &wb, &mut oo, odd, k, m).unwrap();
        let oo = f32s(&b, &oo, odd * m);
        assert!(
            oo.iter().zip(&bo).all(|(a, c)| a.to_bits() == c.to_bits()),
            "{k}x{m}: rows of a {odd}-row product differ from the same rows in 2048"
        );
        let split = b.det_k_split(k, m);
        let part = ProductDims {
            k: k / split,
            ..ProductDims::new(1, k, m)
        };
        let small = b
            .pinned
            .as_ref()
            .map(|p| p.chain_ok(part.weight()))
            .transpose()
            .unwrap()
            .flatten();
        println!(
            "deterministic products {k}x{m} (K in {split}): 1..=256, {LONG:?}, 1500 and 2048 rows \
             equal bit for bit (rel err {e:.2e}); reference chain {}; default mode differs from \
             them at {fast_differs} of {fast_counts} row counts",
            match small {
                Some(true) =>
                    "equal to the pinned algorithm on the probe (per-row-count algorithms on)",
                Some(false) => "differs from the pinned algorithm (pinned algorithm only)",
                None => "not applicable (k % 16 != 0; pinned algorithm only)",
            }
        );
    }
}

/// Every small-row kernel (`DET_GEMV_KERNELS`), whichever the timing would pick, gives the
/// reference chain's bits (`det_mma_16`) at every row count 1..=16, with beta 0 and 1, on
/// Llama-3-8B's o and down shapes and odd ones (k not a multiple of the 512- or 1024-column
/// stage, m not of the CTA's rows); with K in two parts (where `k % 32 == 0`) it gives
/// `r1 + (r0 + beta * out)` of the reference chains over the halves, the order cuBLASLt's two
/// products give (`det_split.rs`); and both are within bf16 bounds of the CPU product.
#[test]
fn small_row_kernels_give_the_reference_chain() {
    let Some(b) = deterministic() else { return };
    for (k, m) in [
        (4096, 4096),
        (14336, 4096),
        (1008, 1000),
        (1040, 333),
        (1088, 1000),
        (576, 3072),
    ] {
        let seed = (k * 7 + m) as u64;
        let x = cpu::round_bf16(&cpu::random(16 * k, 1.0, seed)); // [16, k]
        let w = cpu::round_bf16(&cpu::random(m * k, 0.5, seed + 1)); // [m, k]
        let (xb, wb) = (weight(&b, &x, vec![16, k]), weight(&b, &w, vec![m, k]));
        let cpu_product = cpu::matmul(&x, &w, 16, k, m); // [16, m]
        // The reference chain over `parts` consecutive parts of K: one [16, m] result a part.
        let chains = |parts: usize| -> Vec<Vec<f32>> {
            (0..parts)
                .map(|p| {
                    let reference = b.alloc(DType::F32, 16 * m).unwrap(); // [16, m]
                    let dims = ProductDims {
                        k: k / parts,
                        ..ProductDims::new(16, k, m)
                    };
                    let offset = (p * dims.k * 2) as u64;
                    // SAFETY: xb holds 16*k bf16, wb m*k, reference 16*m f32; part p's columns
                    // lie inside every row; k / parts % 16 == 0; fresh allocations are aligned;
                    // all live until the download below waits for the stream.
                    unsafe {
                        b.launch_reference_chain(
                            xb.ptr() + offset,
                            wb.ptr() + offset,
                            reference.ptr(),
                            dims,
                        )
                    }
                    .unwrap();
                    f32s(&b, &reference, 16 * m)
                })
                .collect()
        };
        let old = cpu::random(16 * m, 1.0, seed + 2); // [16, m]: what beta = 1 adds
        let splits: &[usize] = if k % 32 == 0 { &[1, 2] } else { &[1] };
        for &split in splits {
            let parts = chains(split);
            // What the kernels must store at element i with `beta`.
            let expect = |i: usize, beta: f32| {
                let first = if beta == 0.0 {
                    parts[0][i]
                } else {
                    parts[0][i] + old[i]
                };
                if split == 2 {
                    parts[1][i] + first
                } else {
                    first
                }
            };
            let whole: Vec<f32> = (0..16 * m).map(|i| expect(i, 0.0)).collect();
            let e = cpu::rel_err(&whole, &cpu_product);
            assert!(
                e <= 1e-2,
                "{k}x{m} in {split}: reference chains off the CPU by {e}"
            );
            let dims = |n| ProductDims {
                k: k / split,
                ..ProductDims::new(n, k, m)
            };
            for kernel in sov_kernels::DET_GEMV_KERNELS {
                for rows in 1..=16 {
                    for beta in [0.0f32, 1.0] {
                        let start: Vec<f32> = if beta == 0.0 {
                            vec![f32::NAN; rows * m] // never read
                        } else {
                            old[..rows * m].to_vec()
                        };
                        let out = b.upload_f32(&start).unwrap(); // [rows, m]
                        // SAFETY: as above, for `rows` rows; rows <= 16, ld = k % 8 == 0.
                        unsafe {
                            b.launch_det_gemv(
                                kernel,
                                (xb.ptr(), wb.ptr(), out.ptr()),
                                dims(rows),
                                beta,
                                split,
                            )
                        }
                        .unwrap();
                        let got = f32s(&b, &out, rows * m);
                        let bad =
                            (0..rows * m).find(|&i| got[i].to_bits() != expect(i, beta).to_bits());
                        if let Some(i) = bad {
                            panic!(
                                "{} {k}x{m} in {split}, {rows} rows, beta {beta}: row {} col {} \
                                 is {}, the reference chains give {}",
                                kernel.name,
                                i / m,
                                i % m,
                                got[i],
                                expect(i, beta)
                            );
                        }
                    }
                }
            }
            let names: Vec<&str> = sov_kernels::DET_GEMV_KERNELS
                .iter()
                .map(|d| d.name)
                .collect();
            println!(
                "{} {k}x{m}, K in {split}: 1..=16 rows, beta 0 and 1, equal to the reference \
                 chains bit for bit (chains vs CPU: rel err {e:.2e})",
                names.join(", ")
            );
        }
    }
}

/// Sequences in a random paged bf16 cache.
struct Paged {
    heads: HeadShape,
    bs: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Per sequence, its blocks.
    tables: Vec<Vec<u32>>,
}

impl Paged {
    fn new(heads: HeadShape, bs: usize, lens: &[usize], seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let blocks: usize = lens.iter().map(|c| c.div_ceil(bs)).sum::<usize>() + 2;
        let mut free: Vec<u32> = (0..blocks as u32).collect();
        free.shuffle(&mut rng);
        let tables = lens
            .iter()
            .map(|c| free.drain(..c.div_ceil(bs)).collect())
            .collect();
        let len = blocks * bs * heads.kv_width();
        Self {
            heads,
            bs,
            k: cpu::round_bf16(&cpu::random(len, 1.0, seed + 1)),
            v: cpu::round_bf16(&cpu::random(len, 1.0, seed + 2)),
            tables,
        }
    }

    fn slot(&self, seq: usize, pos: usize) -> u32 {
        self.tables[seq][pos / self.bs] * self.bs as u32 + (pos % self.bs) as u32
    }

    /// A step over `(sequence, first new position, new tokens)`.
    fn meta(&self, b: &CudaBackend, step: &[(usize, usize, usize)]) -> BatchMeta<CudaBackend> {
        let max_blocks = self.tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let (mut positions, mut slots, mut starts, mut ctx, mut tables) =
            (vec![], vec![], vec![0u32], vec![], vec![]);
        for &(s, p0, n) in step {
            for p in p0..p0 + n {
                positions.push(p as u32);
                slots.push(self.slot(s, p));
            }
            starts.push(positions.len() as u32);
            ctx.push((p0 + n) as u32);
            let mut row = self.tables[s].clone();
            row.resize(max_blocks, 0);
            tables.extend(row);
        }
        BatchMeta {
            n_tokens: positions.len(),
            n_seqs: step.len(),
            max_q_len: step.iter().map(|s| s.2).max().unwrap_or(1),
            max_ctx_len: ctx.iter().copied().max().unwrap_or(1) as usize,
            max_blocks_per_seq: max_blocks,
            positions: b.upload_u32(&positions).unwrap(),
            slot_mapping: b.upload_u32(&slots).unwrap(),
            q_starts: b.upload_u32(&starts).unwrap(),
            ctx_lens: b.upload_u32(&ctx).unwrap(),
            block_tables: b.upload_u32(&tables).unwrap(),
        }
    }
}

fn rope_tables(b: &CudaBackend, max_pos: usize, d: usize) -> (CudaBuffer, CudaBuffer) {
    let half = d / 2;
    let (mut cos, mut sin) = (vec![0f32; max_pos * half], vec![0f32; max_pos * half]);
    for p in 0..max_pos {
        for j in 0..half {
            let a = p as f64 * 500000f64.powf(-(2.0 * j as f64) / d as f64);
            cos[p * half + j] = a.cos() as f32;
            sin[p * half + j] = a.sin() as f32;
        }
    }
    (b.upload_f32(&cos).unwrap(), b.upload_f32(&sin).unwrap())
}

/// Runs `rope_kv_attention` of `step` with the raw qkv rows `qkv` on fresh copies of the cache;
/// returns the attention output and both caches as bytes.
fn attend(
    b: &CudaBackend,
    paged: &Paged,
    step: &[(usize, usize, usize)],
    qkv: &[f32],
) -> (Vec<f32>, Vec<u8>, Vec<u8>) {
    let heads = paged.heads;
    let meta = paged.meta(b, step);
    let (cos, sin) = rope_tables(b, 4096 + 512, heads.head_dim);
    let mut k = weight(b, &paged.k, vec![paged.k.len()]);
    let mut v = weight(b, &paged.v, vec![paged.v.len()]);
    let mut q = b.upload_f32(qkv).unwrap();
    let n = meta.n_tokens;
    let mut out = b.alloc(DType::F32, n * heads.q_width()).unwrap();
    let shape = AttentionShape {
        heads,
        block_size: paged.bs,
        scale: 1.0 / (heads.head_dim as f32).sqrt(),
    };
    let kv = KvLayer {
        k: &mut k,
        v: &mut v,
    };
    let tables = RopeTables {
        cos: &cos,
        sin: &sin,
    };
    b.rope_kv_attention(&mut q, tables, kv, &meta, &mut out, shape)
        .unwrap();
    (
        f32s(b, &out, n * heads.q_width()),
        b.read_bytes(&k, 0, paged.k.len()).unwrap(),
        b.read_bytes(&v, 0, paged.v.len()).unwrap(),
    )
}

const LLAMA8B: HeadShape = HeadShape {
    n_heads: 32,
    n_kv_heads: 8,
    head_dim: 128,
};
const SMOLLM2: HeadShape = HeadShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
};

#[test]
fn decode_attention_is_batch_invariant() {
    let Some(b) = deterministic() else { return };
    for (heads, bs) in [(LLAMA8B, 16), (SMOLLM2, 16)] {
        let mut rng = StdRng::seed_from_u64(17);
        let ctxs: Vec<usize> = (0..40).map(|_| rng.gen_range(1..3000)).collect();
        let paged = Paged::new(heads, bs, &ctxs, 18);
        let (w, qw) = (heads.qkv_width(), heads.q_width());
        let qkv = cpu::random(ctxs.len() * w, 1.0, 19);
        let all: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(s, &c)| (s, c - 1, 1))
            .collect();
        let (together, _, _) = attend(&b, &paged, &all, &qkv);
        for s in [0, 7, 39] {
            let (alone, _, _) = attend(&b, &paged, &all[s..=s], &qkv[s * w..(s + 1) * w]);
            assert!(
                alone == together[s * qw..(s + 1) * qw],
                "{heads:?}: sequence {s} (context {}) alone differs from its row in a batch of 40",
                ctxs[s]
            );
            // Beside a few other neighbours.
            let pick = [s, (s + 5) % 40, (s + 11) % 40];
            let step: Vec<_> = pick.iter().map(|&i| all[i]).collect();
            let q: Vec<f32> = pick
                .iter()
                .flat_map(|&i| qkv[i * w..(i + 1) * w].to_vec())
                .collect();
            let (three, _, _) = attend(&b, &paged, &step, &q);
            assert!(
                three[..qw] == together[s * qw..(s + 1) * qw],
                "{heads:?}: sequence {s}"
            );
        }
        println!("deterministic decode attention {heads:?}: rows alone == rows in a batch of 40");
    }
}

#[test]
fn prefill_writes_what_decode_steps_write() {
    let Some(b) = deterministic() else { return };
    // Odd token counts, and prefills whose tokens straddle the first 256-token split boundary
    // (positions 201..292 and 255..288: one split and two).
    for (heads, bs, prefix, new) in [
        (LLAMA8B, 16, 100, 90),
        (LLAMA8B, 16, 0, 64),
        (LLAMA8B, 16, 201, 91),
        (SMOLLM2, 16, 300, 70),
        (SMOLLM2, 16, 255, 33),
    ] {
        // Sequence 0 is checked; sequence 1 prefills beside it in the prefill launch.
        let paged = Paged::new(heads, bs, &[prefix + new, 150], 40 + prefix as u64);
        let w = heads.qkv_width();
        let qkv = cpu::random(new * w, 1.0, 41);
        let other = cpu::random(150 * w, 1.0, 42);
        let mut batch = qkv.clone();
        batch.extend_from_slice(&other);
        let (pre_out, pre_k, pre_v) = attend(&b, &paged, &[(0, prefix, new), (1, 0, 150)], &batch);
        // The decode steps, one token at a time, each on the cache the previous one left.
        let mut paged_dec = Paged {
            k: paged.k.clone(),
            v: paged.v.clone(),
            tables: paged.tables.clone(),
            ..paged
        };
        let qw = heads.q_width();
        let mut dec_out = Vec::new();
        let (mut k_bytes, mut v_bytes) = (Vec::new(), Vec::new());
        for i in 0..new {
            let (o, k, v) = attend(
                &b,
                &paged_dec,
                &[(0, prefix + i, 1)],
                &qkv[i * w..(i + 1) * w],
            );
            dec_out.extend(o);
            paged_dec.k = bf16_bytes_to_f32(&k);
            paged_dec.v = bf16_bytes_to_f32(&v);
            (k_bytes, v_bytes) = (k, v);
        }
        let what = format!("{heads:?} prefix {prefix}, {new} new tokens");
        if let Some(i) = (0..new * qw).find(|&i| pre_out[i].to_bits() != dec_out[i].to_bits()) {
            panic!(
                "{what}: attention of token {} differs: prefill {} decode {}",
                i / qw,
                pre_out[i],
                dec_out[i]
            );
        }
        // Sequence 0's cache rows; sequence 1's rows only the prefill wrote.
        let kvw = heads.kv_width();
        for p in 0..prefix + new {
            let at = paged.slot(0, p) as usize * kvw * 2;
            let r = at..at + kvw * 2;
            assert!(
                pre_k[r.clone()] == k_bytes[r.clone()],
                "{what}: K of position {p} differs"
            );
            assert!(
                pre_v[r.clone()] == v_bytes[r],
                "{what}: V of position {p} differs"
            );
        }
        println!("deterministic prefill == decode steps: {what}: outputs and K/V bit for bit");
    }
}

fn bf16_bytes_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}
