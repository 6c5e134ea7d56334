//! Row-wise CPU ops of the Llama forward pass on plain slices: RMSNorm (plain and fused with the
//! residual add), bias add, RoPE on the fused qkv rows, SwiGLU and KV-cache writes.
//!
//! Shapes are checked by the caller (`super::CpuBackend`); these functions index within them.
//! Rows are processed in parallel on the backend's [`Pool`] once there are enough of them to pay
//! for it.

use super::pool::{Pool, SharedMut};
use crate::backend::HeadShape;

/// Rows per pool task for row-wise ops (up to this many rows the op runs on the calling thread).
const ROWS_PER_TASK: usize = 4;

/// `out = x / sqrt(mean(x^2) + eps) * weight` for one row (f32 math, as Hugging Face).
fn rms_norm_row(x: &[f32], weight: &[f32], out: &mut [f32], eps: f32) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// RMSNorm per row. `x: [n, d]`, `weight: [d]`, `out: [n, d]`.
pub fn rms_norm(pool: &Pool, x: &[f32], weight: &[f32], out: &mut [f32], d: usize, eps: f32) {
    pool.rows_mut(out, d, ROWS_PER_TASK, &|i, o| {
        rms_norm_row(&x[i * d..(i + 1) * d], weight, o, eps)
    });
}

/// `residual += x; out = rms_norm(residual) * weight`. `residual, x, out: [n, d]`, `weight: [d]`.
pub fn add_rms_norm(
    pool: &Pool,
    residual: &mut [f32],
    x: &[f32],
    weight: &[f32],
    out: &mut [f32],
    d: usize,
    eps: f32,
) {
    let o = SharedMut::new(out);
    pool.rows_mut(residual, d, ROWS_PER_TASK, &|i, r| {
        for (a, b) in r.iter_mut().zip(&x[i * d..(i + 1) * d]) {
            *a += b;
        }
        // SAFETY: row `i` of `out` is written by the task that owns row `i` of `residual` only.
        rms_norm_row(r, weight, unsafe { o.chunk(i * d, (i + 1) * d) }, eps);
    });
}

/// `x[i, :] += bias`. `x: [n, m]`, `bias: [m]`.
pub fn add_bias(x: &mut [f32], bias: &[f32], m: usize) {
    for row in x.chunks_mut(m) {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

/// Hugging Face `rotate_half` RoPE on the q and k heads of fused qkv rows, in place.
/// `qkv: [n, (H + 2*KVH) * D]`, `positions: [n]`, `cos`, `sin`: `[max_pos, D/2]`.
/// Positions are checked by the caller to be `< max_pos`.
pub fn rope(
    pool: &Pool,
    qkv: &mut [f32],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
    heads: HeadShape,
) {
    let d = heads.head_dim;
    let half = d / 2;
    let width = heads.qkv_width();
    let rotated_heads = heads.n_heads + heads.n_kv_heads;
    let rows = positions.len().min(qkv.len() / width.max(1));
    pool.rows_mut(&mut qkv[..rows * width], width, ROWS_PER_TASK, &|i, row| {
        let p = positions[i];
        let c = &cos[p as usize * half..(p as usize + 1) * half];
        let s = &sin[p as usize * half..(p as usize + 1) * half];
        for head in row[..rotated_heads * d].chunks_mut(d) {
            let (lo, hi) = head.split_at_mut(half);
            for j in 0..half {
                let (a, b) = (lo[j], hi[j]);
                lo[j] = a * c[j] - b * s[j];
                hi[j] = b * c[j] + a * s[j];
            }
        }
    });
}

/// `out[i, j] = silu(gate_up[i, j]) * gate_up[i, f + j]`. `gate_up: [n, 2f]`, `out: [n, f]`.
pub fn silu_mul(pool: &Pool, gate_up: &[f32], out: &mut [f32], f: usize) {
    pool.rows_mut(out, f, ROWS_PER_TASK, &|i, o| {
        let (g, u) = gate_up[2 * f * i..2 * f * (i + 1)].split_at(f);
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    });
}

/// Copies the k and v heads of each token into its cache slot.
/// `qkv: [n, (H + 2*KVH) * D]`, `slots: [n]` (each checked `< cache rows` by the caller),
/// `k_cache`, `v_cache`: `[num_slots, KVH * D]`.
pub fn kv_write(
    qkv: &[f32],
    slots: &[u32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    heads: HeadShape,
) {
    let width = heads.qkv_width();
    let kv = heads.kv_width();
    let k_off = heads.q_width();
    let v_off = k_off + kv;
    for (row, &slot) in qkv.chunks(width).zip(slots) {
        let s = slot as usize * kv;
        k_cache[s..s + kv].copy_from_slice(&row[k_off..k_off + kv]);
        v_cache[s..s + kv].copy_from_slice(&row[v_off..v_off + kv]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Pool {
        Pool::new(2).expect("pool")
    }

    #[test]
    fn rms_norm_matches_formula() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0];
        let w = [0.5f32, 2.0, 1.0];
        let mut out = [0f32; 6];
        rms_norm(&pool(), &x, &w, &mut out, 3, 1e-6);
        for r in 0..2 {
            let row = &x[r * 3..r * 3 + 3];
            let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / 3.0;
            for j in 0..3 {
                let want = row[j] as f64 / (ms + 1e-6).sqrt() * w[j] as f64;
                assert!((out[r * 3 + j] as f64 - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn add_rms_norm_updates_residual_and_normalizes_the_sum() {
        let mut res = vec![1.0f32, 2.0, 3.0, 4.0];
        let x = [0.5f32, -1.0, 2.0, 1.0];
        let w = [1.0f32, 3.0];
        let mut out = vec![0f32; 4];
        add_rms_norm(&pool(), &mut res, &x, &w, &mut out, 2, 1e-5);
        assert_eq!(res, vec![1.5, 1.0, 5.0, 5.0]);
        let mut want = vec![0f32; 4];
        rms_norm(&pool(), &res, &w, &mut want, 2, 1e-5);
        assert_eq!(out, want);
    }

    #[test]
    fn rope_rotates_q_and_k_pairs_and_leaves_v() {
        let heads = HeadShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let n = 2;
        let mut qkv: Vec<f32> = (0..n * heads.qkv_width())
            .map(|i| i as f32 * 0.1 + 0.3)
            .collect();
        let orig = qkv.clone();
        // max_pos 3, D/2 = 2
        let angles: Vec<f32> = (0..3)
            .flat_map(|p| [p as f32 * 0.7, p as f32 * 0.05])
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let positions = [2u32, 1];
        rope(&pool(), &mut qkv, &positions, &cos, &sin, heads);
        for i in 0..n {
            let p = positions[i] as usize;
            let row = &orig[i * 16..(i + 1) * 16];
            let got = &qkv[i * 16..(i + 1) * 16];
            for h in 0..3 {
                for j in 0..2 {
                    let (a, b) = (row[h * 4 + j], row[h * 4 + j + 2]);
                    let t = angles[p * 2 + j];
                    assert!((got[h * 4 + j] - (a * t.cos() - b * t.sin())).abs() < 1e-6);
                    assert!((got[h * 4 + j + 2] - (b * t.cos() + a * t.sin())).abs() < 1e-6);
                }
            }
            assert_eq!(&got[12..16], &row[12..16], "v must be untouched");
        }
    }

    #[test]
    fn silu_mul_matches_formula() {
        let gu = [1.0f32, -2.0, 3.0, 0.5];
        let mut out = [0f32; 2];
        silu_mul(&pool(), &gu, &mut out, 2);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert!((out[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((out[1] - silu(-2.0) * 0.5).abs() < 1e-6);
    }

    #[test]
    fn kv_write_places_k_and_v_heads_in_their_slots() {
        let heads = HeadShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
        };
        let qkv: Vec<f32> = (0..2 * 8).map(|i| i as f32).collect();
        let mut k = vec![0f32; 5 * 2];
        let mut v = vec![0f32; 5 * 2];
        kv_write(&qkv, &[3, 0], &mut k, &mut v, heads);
        assert_eq!(&k[6..8], &[4.0, 5.0]);
        assert_eq!(&v[6..8], &[6.0, 7.0]);
        assert_eq!(&k[0..2], &[12.0, 13.0]);
        assert_eq!(&v[0..2], &[14.0, 15.0]);
    }
}
