//! Plain CPU references for the GPU tests: straightforward f64 loops written from the op
//! definitions in the Backend contract (and Hugging Face's Llama), independent of the CUDA code.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::{AttentionShape, KvLayer};

/// `n` values uniform in `[-scale, scale)` (never all zero).
pub fn random(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// Values rounded through bf16, as the device stores them.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect()
}

/// ‖out − ref‖ / ‖ref‖.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        num += (o as f64 - r as f64).powi(2);
        den += (r as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn rms_norm(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for i in 0..d {
            o[i] = (row[i] as f64 * inv * w[i] as f64) as f32;
        }
    }
    out
}

/// `x[n, k] @ w[m, k]^T`.
pub fn matmul(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            let mut acc = 0f64;
            for t in 0..k {
                acc += x[i * k + t] as f64 * w[j * k + t] as f64;
            }
            out[i * m + j] = acc as f32;
        }
    }
    out
}

pub fn silu_mul(gate_up: &[f32], n: usize, f: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * f];
    for t in 0..n {
        for j in 0..f {
            let g = gate_up[t * 2 * f + j] as f64;
            out[t * f + j] = (g / (1.0 + (-g).exp()) * gate_up[t * 2 * f + f + j] as f64) as f32;
        }
    }
    out
}

/// RoPE (rotate_half) on the first `rot_heads` heads of each row, tables `[max_pos, d/2]`.
pub fn rope(
    qkv: &mut [f32],
    pos: &[u32],
    cos: &[f32],
    sin: &[f32],
    row: usize,
    rot_heads: usize,
    d: usize,
) {
    let half = d / 2;
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..rot_heads {
            let base = t * row + h * d;
            for j in 0..half {
                let (c, s) = (
                    cos[p as usize * half + j] as f64,
                    sin[p as usize * half + j] as f64,
                );
                let (a, b) = (qkv[base + j] as f64, qkv[base + j + half] as f64);
                qkv[base + j] = (a * c - b * s) as f32;
                qkv[base + j + half] = (b * c + a * s) as f32;
            }
        }
    }
}

/// One sequence of a paged-attention case.
pub struct RefSeq {
    /// Context length after the step.
    pub ctx: usize,
    /// New tokens (the last `n_new` positions), rows `q_start .. q_start + n_new` of q/out.
    pub n_new: usize,
    pub q_start: usize,
    pub blocks: Vec<u32>,
}

/// Causal attention through block tables. `qkv: [n, (h + 2 * kvh) * d]` (q heads read), `kv`:
/// `[slots, kvh, d]` each (f32 values of the bf16 cache), out `[n, h * d]`.
pub fn paged_attention(
    qkv: &[f32],
    kv: KvLayer<&[f32]>,
    seqs: &[RefSeq],
    shape: AttentionShape,
) -> Vec<f32> {
    let AttentionShape {
        heads,
        block_size,
        scale,
    } = shape;
    let (h, kvh, d) = (heads.n_heads, heads.n_kv_heads, heads.head_dim);
    let (q, q_stride, k_cache, v_cache) = (qkv, heads.qkv_width(), kv.k, kv.v);
    let n: usize = seqs.iter().map(|s| s.n_new).sum();
    let mut out = vec![0f32; n * h * d];
    let group = h / kvh;
    for s in seqs {
        for i in 0..s.n_new {
            let row = s.q_start + i;
            let pos = s.ctx - s.n_new + i;
            for head in 0..h {
                let g = head / group;
                let qv = &q[row * q_stride + head * d..row * q_stride + (head + 1) * d];
                let slot = |j: usize| {
                    (s.blocks[j / block_size] as usize * block_size + j % block_size) * kvh * d
                        + g * d
                };
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &k_cache[slot(j)..slot(j) + d];
                        qv.iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
                let z: f64 = p.iter().sum();
                for dd in 0..d {
                    let acc: f64 = (0..=pos).map(|j| p[j] * v_cache[slot(j) + dd] as f64).sum();
                    out[row * h * d + head * d + dd] = (acc / z) as f32;
                }
            }
        }
    }
    out
}
