//! `out[n, m] = x[n, k] @ w[m, k]^T` on the CPU, threaded on the backend's [`Pool`].
//!
//! Two paths, chosen by the number of activation rows `n`:
//! - few rows (decode): a GEMV-style kernel reads each weight row once, widens it to f32 on the
//!   fly (quantized blocks are dequantized in registers, [`super::qdot`]) and dots it with up to
//!   four activation rows at a time (up to six for the AVX-512 kernels of the 32-value block
//!   types, which tile two weight rows by them; [`super::dot`]); threads split the weight rows.
//!   This path is bound by weight memory traffic, so 16-bit weights run ~2x faster than f32 and
//!   4-bit ones faster still.
//! - many rows (prefill; over 8 rows for f32 weights, 16 for quantized, 40 for 16-bit ones): f32
//!   weights go straight to the `gemm` crate; others are widened tile by tile (`TILE_ROWS` rows at
//!   a time, per thread) into f32 scratch and multiplied by `gemm`.

use gemm::Parallelism;
use half::{bf16, f16};
use std::cell::RefCell;

use super::pool::Pool;

use super::dot::{WeightRow, dot_rows};
use super::qdot::{Level, decode_rows, qdot_matrix};
use crate::loader::tensor::QuantType;

/// Activation row counts up to this use the GEMV kernel for f32 weights (`gemm` needs no
/// widening pass for them, so it wins early).
const GEMV_MAX_ROWS_F32: usize = 8;
/// Activation row counts up to this use the GEMV kernel for 16-bit weights: the GEMM path first
/// widens the whole matrix to f32, which costs about as much as ~40 rows of GEMV work.
const GEMV_MAX_ROWS_16BIT: usize = 40;
/// Activation row counts up to this use the GEMV kernel for quantized weights (above it, tiles
/// are dequantized to f32 once and multiplied by `gemm`).
const GEMV_MAX_ROWS_QUANT: usize = 16;
/// Weight rows widened to f32 per tile on the GEMM path.
const TILE_ROWS: usize = 64;

/// A whole weight matrix `[m, k]`, row-major, in its stored dtype.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// f32 weights.
    F32(&'a [f32]),
    /// f16 weights.
    F16(&'a [f16]),
    /// bf16 weights.
    BF16(&'a [bf16]),
    /// Quantized blocks (rows of `k / block_elems` blocks).
    Quant(QuantType, &'a [u8]),
}

impl<'a> Weights<'a> {
    /// Rows `r0 .. r1` of a matrix with `k` columns, flattened.
    fn rows(&self, r0: usize, r1: usize, k: usize) -> WeightRow<'a> {
        match *self {
            Weights::F32(w) => WeightRow::F32(&w[r0 * k..r1 * k]),
            Weights::F16(w) => WeightRow::F16(&w[r0 * k..r1 * k]),
            Weights::BF16(w) => WeightRow::BF16(&w[r0 * k..r1 * k]),
            Weights::Quant(t, w) => {
                let row = k / t.block_elems() * t.block_bytes();
                WeightRow::Quant(t, &w[r0 * row..r1 * row])
            }
        }
    }
}

/// Raw output pointer shared by threads that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every thread writes a disjoint set of output elements (distinct weight rows = distinct
// output columns), and the owning `&mut [f32]` outlives the parallel section.
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointer is only used for disjoint writes.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper, not the raw field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out = x @ w^T`. `x: [n, k]`, `w: [m, k]`, `out: [n, m]` (overwritten).
///
/// # Panics
/// When a slice is shorter than its shape says (the backend checks shapes before calling).
pub fn matmul(
    pool: &Pool,
    x: &[f32],
    w: Weights<'_>,
    out: &mut [f32],
    n: usize,
    k: usize,
    m: usize,
) {
    assert!(
        x.len() >= n * k && out.len() >= n * m,
        "matmul: slice shorter than shape"
    );
    match w {
        Weights::F32(wf) => assert!(wf.len() >= m * k, "matmul: weight shorter than shape"),
        Weights::F16(wf) => assert!(wf.len() >= m * k, "matmul: weight shorter than shape"),
        Weights::BF16(wf) => assert!(wf.len() >= m * k, "matmul: weight shorter than shape"),
        Weights::Quant(t, wq) => assert!(
            k.is_multiple_of(t.block_elems())
                && wq.len() >= m * (k / t.block_elems()) * t.block_bytes(),
            "matmul: quantized weight is not whole blocks of its shape"
        ),
    }
    if n == 0 || m == 0 {
        return;
    }
    if k == 0 {
        out[..n * m].fill(0.0);
        return;
    }
    let gemv_max_rows = match w {
        Weights::F32(_) => GEMV_MAX_ROWS_F32,
        Weights::F16(_) | Weights::BF16(_) => GEMV_MAX_ROWS_16BIT,
        Weights::Quant(..) => GEMV_MAX_ROWS_QUANT,
    };
    if n <= gemv_max_rows {
        gemv(pool, x, w, out, n, k, m);
    } else {
        gemm_tiled(pool, x, w, out, n, k, m);
    }
}

/// GEMV path: threads split the weight rows; each weight row is dotted with every activation row.
fn gemv(pool: &Pool, x: &[f32], w: Weights<'_>, out: &mut [f32], n: usize, k: usize, m: usize) {
    let threads = pool.threads();
    // A few chunks per thread for balance, but at least 16 rows per chunk.
    let chunk = m.div_ceil(threads * 4).max(16);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let xrows: Vec<&[f32]> = (0..n).map(|i| &x[i * k..(i + 1) * k]).collect();
    pool.run(m.div_ceil(chunk), &|c| {
        let r0 = c * chunk;
        let r1 = (r0 + chunk).min(m);
        if let (Weights::Quant(ty, _), WeightRow::Quant(_, bytes)) = (w, w.rows(r0, r1, k)) {
            quant_chunk(ty, bytes, k, &xrows, r0, m, out_ptr);
            return;
        }
        for j in r0..r1 {
            let wr = w.rows(j, j + 1, k);
            let store = |i: usize, sums: &[f32]| {
                for (t, s) in sums.iter().enumerate() {
                    // SAFETY: `(i + t) * m + j < n * m <= out.len()`; column `j` belongs to this
                    // chunk only, so no other thread writes this element.
                    unsafe { *out_ptr.get().add((i + t) * m + j) = *s };
                }
            };
            let mut i = 0;
            while i + 4 <= n {
                store(
                    i,
                    &dot_rows(wr, &[xrows[i], xrows[i + 1], xrows[i + 2], xrows[i + 3]]),
                );
                i += 4;
            }
            match n - i {
                1 => store(i, &dot_rows(wr, &[xrows[i]])),
                2 => store(i, &dot_rows(wr, &[xrows[i], xrows[i + 1]])),
                3 => store(i, &dot_rows(wr, &[xrows[i], xrows[i + 1], xrows[i + 2]])),
                _ => {}
            }
        }
    });
}

/// The quantized weight rows `r0 ..` of one GEMV chunk (`bytes`: whole rows of `k` values)
/// against every activation row, in groups of [`group_rows`] activation rows through
/// [`qdot_matrix`]; sums go to output columns `r0 + j`. A row's sums do not depend on its
/// group (every kernel adds each (weight row, activation row) pair in the same order).
fn quant_chunk(
    ty: QuantType,
    bytes: &[u8],
    k: usize,
    xrows: &[&[f32]],
    r0: usize,
    m: usize,
    out_ptr: OutPtr,
) {
    let row_bytes = k / ty.block_elems() * ty.block_bytes();
    let n = xrows.len();
    let mut i = 0;
    while i < n {
        let take = group_rows(ty, n - i);
        let store = |j: usize, sums: &[f32]| {
            for (t, s) in sums.iter().enumerate() {
                // SAFETY: `(i + t) * m + r0 + j < n * m <= out.len()`; column `r0 + j` belongs to
                // this chunk only, so no other thread writes this element.
                unsafe { *out_ptr.get().add((i + t) * m + r0 + j) = *s };
            }
        };
        let x = &xrows[i..i + take];
        macro_rules! run {
            ($n:literal) => {{
                let xs: [&[f32]; $n] = std::array::from_fn(|t| x[t]);
                qdot_matrix(ty, bytes, row_bytes, &xs, &mut |j, s| store(j, &s))
            }};
        }
        match take {
            8 => run!(8),
            7 => run!(7),
            6 => run!(6),
            5 => run!(5),
            4 => run!(4),
            3 => run!(3),
            2 => run!(2),
            _ => run!(1),
        }
        i += take;
    }
}

/// Activation rows per kernel call when `left` remain. AVX-512 kernels of the 32-value block
/// types (32 registers) tile two weight rows by up to six activation rows
/// ([`super::qdot_x86`]), so rows go in groups of at most six, split evenly (16 = 6 + 5 + 5);
/// other kernels take four.
fn group_rows(ty: QuantType, left: usize) -> usize {
    if Level::detect() == Level::Avx512
        && matches!(ty, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0)
    {
        left.div_ceil(left.div_ceil(6))
    } else {
        left.min(4)
    }
}

thread_local! {
    /// Per-thread f32 scratch for a widened weight tile (reused across calls).
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// GEMM path: `TILE_ROWS` weight rows at a time per task (16-bit and quantized ones widened to
/// f32 scratch first), multiplied by `gemm` on one thread.
fn gemm_tiled(
    pool: &Pool,
    x: &[f32],
    w: Weights<'_>,
    out: &mut [f32],
    n: usize,
    k: usize,
    m: usize,
) {
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool.run(m.div_ceil(TILE_ROWS), &|t| {
        let r0 = t * TILE_ROWS;
        let r1 = (r0 + TILE_ROWS).min(m);
        let rows = r1 - r0;
        if let WeightRow::F32(s) = w.rows(r0, r1, k) {
            // SAFETY: as below; f32 rows are multiplied in place.
            unsafe {
                gemm_f32(
                    x,
                    s,
                    out_ptr.get().add(r0),
                    n,
                    k,
                    rows,
                    m,
                    Parallelism::None,
                )
            };
            return;
        }
        TILE.with(|tile| {
            let mut tile = tile.borrow_mut();
            if tile.len() < rows * k {
                tile.resize(rows * k, 0.0);
            }
            let dst = &mut tile[..rows * k]; // [rows, k] f32
            match w.rows(r0, r1, k) {
                WeightRow::F32(s) => dst.copy_from_slice(s),
                WeightRow::F16(s) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(s, dst),
                WeightRow::BF16(s) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(s, dst),
                WeightRow::Quant(t, s) => decode_rows(t, s, dst),
            }
            // SAFETY: the tile writes output columns `r0 .. r1` of every row, which no other
            // tile writes; `out` holds `n * m` elements (checked in `matmul`).
            unsafe {
                gemm_f32(
                    x,
                    dst,
                    out_ptr.get().add(r0),
                    n,
                    k,
                    rows,
                    m,
                    Parallelism::None,
                )
            }
        });
    });
}

/// `dst[i * dst_stride + j] = sum_l x[i, l] * w[j, l]` for `i < n`, `j < m` through `gemm`.
///
/// # Safety
/// `x` holds `n * k` and `w` holds `m * k` elements; `dst` is valid for writes at
/// `i * dst_stride + j` for `i < n`, `j < m`, and no other thread writes those elements meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_f32(
    x: &[f32],
    w: &[f32],
    dst: *mut f32,
    n: usize,
    k: usize,
    m: usize,
    dst_stride: usize,
    parallelism: Parallelism,
) {
    // SAFETY: gemm computes dst[n x m] = x[n x k] * w^T[k x m] with the strides given:
    // x row stride k, column stride 1; w^T element (l, j) = w[j * k + l] (column stride k, row
    // stride 1); dst row stride `dst_stride`, column stride 1. All accesses stay inside the
    // ranges the caller guarantees. `read_dst = false`, so dst is overwritten.
    unsafe {
        gemm::gemm(
            n,
            m,
            k,
            dst,
            1,
            dst_stride as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(7);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Plain f64 reference product (test only).
    fn reference(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * m];
        for i in 0..n {
            for j in 0..m {
                let s: f64 = (0..k)
                    .map(|l| x[i * k + l] as f64 * w[j * k + l] as f64)
                    .sum();
                out[i * m + j] = s as f32;
            }
        }
        out
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        let num: f32 = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f32>()
            .sqrt();
        let den: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
        num / den
    }

    #[test]
    fn matmul_matches_reference_on_both_paths_and_all_dtypes() {
        for &(n, k, m) in &[
            (1, 64, 96),
            (3, 17, 33),
            (5, 576, 129),
            (8, 64, 64),
            (9, 40, 70),
            (33, 576, 200),
            (45, 64, 80),
        ] {
            let x = values(n as u64 * 31 + k as u64, n * k);
            let w32 = values(m as u64 * 17 + 3, m * k);
            let w16: Vec<f16> = w32.iter().map(|v| f16::from_f32(*v)).collect();
            let wb: Vec<bf16> = w32.iter().map(|v| bf16::from_f32(*v)).collect();
            let cases = [
                (Weights::F32(&w32), w32.clone()),
                (
                    Weights::F16(&w16),
                    w16.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                ),
                (
                    Weights::BF16(&wb),
                    wb.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                ),
            ];
            for (w, wide) in cases {
                let mut out = vec![f32::NAN; n * m];
                matmul(&Pool::new(2).expect("pool"), &x, w, &mut out, n, k, m);
                let want = reference(&x, &wide, n, k, m);
                let err = rel_err(&out, &want);
                assert!(err < 1e-6, "n={n} k={k} m={m}: rel err {err}");
            }
        }
    }
}

#[cfg(test)]
mod quant_tests {
    use super::*;
    use crate::backend::cpu::qdot::tests::{Rng, random_blocks};
    use crate::loader::gguf::quant::decode_blocks;

    /// Quantized weights through both paths (GEMV for few rows, dequantized tiles + `gemm` for
    /// many) against "dequantize to f32, then an f64 product", every type, ragged row counts.
    #[test]
    fn quantized_matmul_matches_dequantize_then_f32_on_both_paths() {
        for ty in QuantType::ALL {
            let be = ty.block_elems();
            for &(n, blocks, m) in &[
                (1, 3, 33),
                (3, 2, 70),
                (5, 1, 129),
                (11, 2, 40),
                (16, 3, 50),
                (17, 3, 65),
                (45, 2, 80),
            ] {
                let k = blocks * be;
                let mut rng = Rng::new((n * 1000 + m) as u64 + ty.block_bytes() as u64);
                let wq = random_blocks(ty, m * blocks, &mut rng);
                let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
                let mut wide = vec![0f32; m * k];
                decode_blocks(ty, &wq, &mut wide);
                let mut out = vec![f32::NAN; n * m];
                matmul(
                    &Pool::new(2).expect("pool"),
                    &x,
                    Weights::Quant(ty, &wq),
                    &mut out,
                    n,
                    k,
                    m,
                );
                for i in 0..n {
                    for j in 0..m {
                        let terms =
                            (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(wide[j * k + l]));
                        let exact: f64 = terms.clone().sum();
                        let scale: f64 = terms.map(f64::abs).sum();
                        let got = f64::from(out[i * m + j]);
                        assert!(
                            (got - exact).abs() <= 1e-5 * scale.max(1e-6),
                            "{ty:?} n={n} k={k} m={m} [{i},{j}]: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use std::time::Instant;

    use super::*;

    /// Prints the weight bandwidth the GEMV path reaches on the default model's shapes, next to a
    /// plain parallel read of the same bytes.
    /// `cargo test --release -p sov --lib gemv_bandwidth -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark"]
    fn gemv_bandwidth() {
        for (m, k) in [(49152usize, 576usize), (3072, 576), (576, 1536), (960, 576)] {
            let w: Vec<f16> = (0..m * k)
                .map(|i| f16::from_f32((i % 97) as f32 * 0.01))
                .collect();
            let x: Vec<f32> = (0..k).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut out = vec![0f32; m];
            let reps = (2_000_000_000 / (m * k * 2)).max(3);
            let pool = Pool::new(0).expect("pool");
            matmul(&pool, &x, Weights::F16(&w), &mut out, 1, k, m);
            let t = Instant::now();
            for _ in 0..reps {
                matmul(&pool, &x, Weights::F16(&w), &mut out, 1, k, m);
            }
            let gemv = t.elapsed().as_secs_f64() / reps as f64;
            let t = Instant::now();
            let mut sink = 0u64;
            for _ in 0..reps {
                let bytes: &[u64] = bytemuck::cast_slice(&w[..w.len() / 4 * 4]);
                sink = sink.wrapping_add(
                    bytes
                        .chunks(4096)
                        .map(|c| c.iter().fold(0u64, |a, b| a ^ b))
                        .fold(0, |a, b| a ^ b),
                );
            }
            let read = t.elapsed().as_secs_f64() / reps as f64;
            let gb = (m * k * 2) as f64 / 1e9;
            println!(
                "f16 [{m} x {k}] n=1: {:.1} us, {:.1} GB/s (plain read {:.1} GB/s) {}",
                gemv * 1e6,
                gb / gemv,
                gb / read,
                sink % 2
            );
        }
    }
}
