//! Causal paged attention on the CPU for a mixed batch of prefill chunks and decode tokens.
//!
//! Each (token, kv head) pair is one independent task, so both a long prefill and a batch-1
//! decode step (one token, `KVH` kv heads) spread over the threads; the task's query heads share
//! the kv head's keys and values while they are in cache. A head walks its keys through the
//! sequence's block table ([`super::attend`]: scores, a numerically stable softmax, the weighted
//! sum of values, in SIMD). GQA: query head `h` reads kv head `h / (H / KVH)`.

use std::cell::RefCell;

use super::attend::{KeyRows, attend};
use super::pool::Pool;
use crate::backend::{BackendError, HeadShape, KvLayer};

/// Per-step batch layout read back from the metadata buffers.
pub struct AttnBatch<'a> {
    /// `[n_seqs + 1]`: first token row of each sequence.
    pub q_starts: &'a [u32],
    /// `[n_seqs]`: context length after this step.
    pub ctx_lens: &'a [u32],
    /// `[n_seqs, max_blocks_per_seq]`: block tables, row-major.
    pub block_tables: &'a [u32],
    /// Row stride of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Number of blocks in the cache.
    pub num_blocks: usize,
}

/// Sequence index and position of every token row, after checking the metadata against the
/// cache: rows partition `0 .. n_tokens`, each sequence has at least as many context tokens as
/// new ones, and every block its context touches exists.
pub fn token_positions(
    batch: &AttnBatch<'_>,
    n_tokens: usize,
) -> Result<Vec<(usize, usize)>, BackendError> {
    let err = |detail: String| BackendError::Shape {
        op: "paged_attention",
        detail,
    };
    let n_seqs = batch.ctx_lens.len();
    if batch.q_starts.len() != n_seqs + 1 || batch.q_starts.last().copied() != Some(n_tokens as u32)
    {
        return Err(err(format!(
            "q_starts must have {} entries ending at {n_tokens}",
            n_seqs + 1
        )));
    }
    let mut rows = Vec::with_capacity(n_tokens);
    for s in 0..n_seqs {
        let (q0, q1) = (batch.q_starts[s] as usize, batch.q_starts[s + 1] as usize);
        let ctx = batch.ctx_lens[s] as usize;
        if q1 < q0 || q1 - q0 > ctx {
            return Err(err(format!(
                "sequence {s}: {} new tokens but context length {ctx}",
                q1.wrapping_sub(q0)
            )));
        }
        let blocks = ctx.div_ceil(batch.block_size);
        if blocks > batch.max_blocks_per_seq {
            return Err(err(format!(
                "sequence {s}: context {ctx} needs {blocks} blocks, table has {}",
                batch.max_blocks_per_seq
            )));
        }
        let table = &batch.block_tables
            [s * batch.max_blocks_per_seq..s * batch.max_blocks_per_seq + blocks];
        if let Some(b) = table.iter().find(|b| **b as usize >= batch.num_blocks) {
            return Err(err(format!(
                "sequence {s}: block {b} out of range ({} blocks)",
                batch.num_blocks
            )));
        }
        let first_pos = ctx - (q1 - q0);
        rows.extend((0..q1 - q0).map(|t| (s, first_pos + t)));
    }
    Ok(rows)
}

/// `out[i, h] = softmax(scale * q[i, h] . K[s, 0..=p]) @ V[s, 0..=p]` for every token row `i`
/// (sequence `s`, position `p` from [`token_positions`]) and query head `h`.
/// `qkv: [n_tokens, (H + 2*KVH) * D]`, `kv.k`, `kv.v`: `[num_blocks * block_size, KVH * D]`,
/// `out: [n_tokens, H * D]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &Pool,
    qkv: &[f32],
    kv: KvLayer<&[f32]>,
    batch: &AttnBatch<'_>,
    rows: &[(usize, usize)],
    out: &mut [f32],
    heads: HeadShape,
    scale: f32,
) {
    let d = heads.head_dim;
    let width = heads.qkv_width();
    let kvw = heads.kv_width();
    let group = heads.n_heads / heads.n_kv_heads;
    let KvLayer {
        k: k_cache,
        v: v_cache,
    } = kv;
    // One task per (token, kv head): its `group` query heads run one after another on the same
    // thread, so the first pulls the kv head's keys and values into cache for the others.
    pool.rows_mut(out, group * d, 1, &|task, o| {
        let (i, g) = (task / heads.n_kv_heads, task % heads.n_kv_heads);
        let (s, pos) = rows[i];
        let keys = KeyRows {
            table: &batch.block_tables[s * batch.max_blocks_per_seq..],
            block_size: batch.block_size,
            stride: kvw,
            offset: g * d,
            len: pos + 1,
        };
        SCORES.with(|scores| {
            let scores = &mut scores.borrow_mut();
            for (t, o) in o.chunks_exact_mut(d).enumerate() {
                let h = g * group + t;
                let q = &qkv[i * width + h * d..i * width + (h + 1) * d];
                attend(q, k_cache, v_cache, keys, scale, scores, o);
            }
        });
    });
}

thread_local! {
    /// Per-thread score row of the head being computed (`[context]`, reused across calls).
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed ^ 0x2545F4914F6CDD1D;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Dense causal attention over contiguous per-sequence K/V, f64 (test reference).
    fn dense(q: &[f32], k: &[f32], v: &[f32], pos: usize, d: usize, scale: f32) -> Vec<f32> {
        let sc: Vec<f64> = (0..=pos)
            .map(|j| {
                (0..d)
                    .map(|t| q[t] as f64 * k[j * d + t] as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..d)
            .map(|t| (0..=pos).map(|j| e[j] * v[j * d + t] as f64).sum::<f64>() / z)
            .map(|x| x as f32)
            .collect()
    }

    #[test]
    fn paged_attention_matches_dense_causal_attention_across_blocks_and_sequences() {
        let heads = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
        };
        let (bs, num_blocks) = (4usize, 12usize);
        // Sequence 0: 6 cached + 5 new (crosses blocks); sequence 1: 9 cached + 1 new (decode).
        let seqs = [(6usize, 5usize, vec![7u32, 2, 9]), (9, 1, vec![0, 11, 4])];
        let kvw = heads.kv_width();
        let d = heads.head_dim;
        let mut k_cache = vec![0f32; num_blocks * bs * kvw];
        let mut v_cache = vec![0f32; num_blocks * bs * kvw];
        // Logical per-sequence K/V [ctx, KVH, D], scattered into the paged cache.
        let mut logical = Vec::new();
        for (s, (cached, new, table)) in seqs.iter().enumerate() {
            let ctx = cached + new;
            let k = values(100 + s as u64, ctx * kvw);
            let v = values(200 + s as u64, ctx * kvw);
            for j in 0..ctx {
                let slot = table[j / bs] as usize * bs + j % bs;
                k_cache[slot * kvw..(slot + 1) * kvw].copy_from_slice(&k[j * kvw..(j + 1) * kvw]);
                v_cache[slot * kvw..(slot + 1) * kvw].copy_from_slice(&v[j * kvw..(j + 1) * kvw]);
            }
            logical.push((k, v));
        }
        let n_tokens = 6;
        let qkv = values(7, n_tokens * heads.qkv_width());
        let q_starts = [0u32, 5, 6];
        let ctx_lens = [11u32, 10];
        let block_tables = [7u32, 2, 9, 0, 11, 4];
        let batch = AttnBatch {
            q_starts: &q_starts,
            ctx_lens: &ctx_lens,
            block_tables: &block_tables,
            max_blocks_per_seq: 3,
            block_size: bs,
            num_blocks,
        };
        let rows = token_positions(&batch, n_tokens).unwrap();
        assert_eq!(rows, vec![(0, 6), (0, 7), (0, 8), (0, 9), (0, 10), (1, 9)]);
        let mut out = vec![f32::NAN; n_tokens * heads.q_width()];
        let scale = 1.0 / (d as f32).sqrt();
        let kv = KvLayer {
            k: &k_cache[..],
            v: &v_cache[..],
        };
        paged_attention(
            &crate::backend::cpu::pool::Pool::new(2).expect("pool"),
            &qkv,
            kv,
            &batch,
            &rows,
            &mut out,
            heads,
            scale,
        );
        for (i, &(s, pos)) in rows.iter().enumerate() {
            for h in 0..heads.n_heads {
                let g = h / 2;
                let (k, v) = &logical[s];
                // Contiguous [ctx, D] K/V of kv head g.
                let kg: Vec<f32> = (0..=pos)
                    .flat_map(|j| k[j * kvw + g * d..j * kvw + (g + 1) * d].to_vec())
                    .collect();
                let vg: Vec<f32> = (0..=pos)
                    .flat_map(|j| v[j * kvw + g * d..j * kvw + (g + 1) * d].to_vec())
                    .collect();
                let q = &qkv[i * heads.qkv_width() + h * d..i * heads.qkv_width() + (h + 1) * d];
                let want = dense(q, &kg, &vg, pos, d, scale);
                let got = &out[i * heads.q_width() + h * d..i * heads.q_width() + (h + 1) * d];
                for t in 0..d {
                    assert!(
                        (got[t] - want[t]).abs() < 1e-5,
                        "token {i} head {h}: {} vs {}",
                        got[t],
                        want[t]
                    );
                }
            }
        }
    }

    #[test]
    fn token_positions_rejects_bad_metadata() {
        let base = |ctx: u32, table: &'static [u32]| AttnBatch {
            q_starts: &[0, 2],
            ctx_lens: std::slice::from_ref(Box::leak(Box::new(ctx))),
            block_tables: table,
            max_blocks_per_seq: table.len(),
            block_size: 4,
            num_blocks: 3,
        };
        assert!(token_positions(&base(5, &[0, 1]), 2).is_ok());
        assert!(
            token_positions(&base(1, &[0, 1]), 2).is_err(),
            "more new tokens than context"
        );
        assert!(
            token_positions(&base(9, &[0, 1]), 2).is_err(),
            "table too short"
        );
        assert!(
            token_positions(&base(5, &[0, 3]), 2).is_err(),
            "block out of range"
        );
        assert!(
            token_positions(&base(5, &[0, 1]), 3).is_err(),
            "q_starts does not end at n_tokens"
        );
    }
}
