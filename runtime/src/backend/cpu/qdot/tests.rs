//! Every kernel level against the scalar reference and against "dequantize to f32, then an f64
//! dot", on random blocks (random codes and scales, never zeros), every block type, 1 to 4
//! and 8 activation rows, and block counts that exercise every unroll remainder.

use half::f16;

use super::{Level, qdot_rows_at};
use crate::loader::gguf::quant::decode_blocks;
use crate::loader::tensor::QuantType;

/// xorshift64* stream.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `blocks` random blocks of `ty`: random code bytes, f16 scales of magnitude 1e-3 .. 2e-2 (so
/// values stay in the range real weights have), signed where the format allows.
pub(crate) fn random_blocks(ty: QuantType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut out: Vec<u8> = (0..blocks * bb).map(|_| rng.next() as u8).collect();
    let scale_at: &[usize] = match ty {
        QuantType::Q4_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q6K => &[208],
    };
    for b in out.chunks_exact_mut(bb) {
        for &at in scale_at {
            let mag = 1e-3 + rng.f32().abs() * 2e-2;
            let sign = if at == 2 && ty == QuantType::Q4_1 && rng.next().is_multiple_of(2) {
                -1.0
            } else {
                1.0
            };
            b[at..at + 2].copy_from_slice(&f16::from_f32(sign * mag).to_le_bytes());
        }
    }
    out
}

fn check<const N: usize>(level: Level, ty: QuantType, blocks: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let w = random_blocks(ty, blocks, &mut rng);
    let k = blocks * ty.block_elems();
    let rows: Vec<Vec<f32>> = (0..N)
        .map(|_| (0..k).map(|_| rng.f32()).collect())
        .collect();
    let xs: [&[f32]; N] = std::array::from_fn(|r| rows[r].as_slice());
    let mut wide = vec![0f32; k];
    decode_blocks(ty, &w, &mut wide);
    assert!(
        wide.iter().any(|v| *v != 0.0),
        "random blocks decode to zeros"
    );
    let got = qdot_rows_at(level, ty, &w, &xs);
    let reference = qdot_rows_at(Level::Scalar, ty, &w, &xs);
    for r in 0..N {
        let exact: f64 = wide
            .iter()
            .zip(&rows[r])
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let scale: f64 = wide
            .iter()
            .zip(&rows[r])
            .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
            .sum();
        let tol = 1e-5 * scale.max(1e-6);
        for (what, v) in [("kernel", got[r]), ("scalar", reference[r])] {
            assert!(
                (f64::from(v) - exact).abs() <= tol,
                "{level:?} {ty:?} blocks={blocks} N={N} r={r} {what}: {v} vs {exact} (tol {tol})"
            );
        }
    }
}

#[test]
fn every_level_matches_the_reference_for_every_type_and_row_count() {
    for &level in Level::available() {
        for ty in QuantType::ALL {
            for (i, blocks) in [1usize, 2, 3, 5, 18, 48].into_iter().enumerate() {
                let seed = i as u64 * 131 + ty.block_bytes() as u64;
                check::<1>(level, ty, blocks, seed);
                check::<2>(level, ty, blocks, seed + 1);
                check::<3>(level, ty, blocks, seed + 2);
                check::<4>(level, ty, blocks, seed + 3);
                check::<8>(level, ty, blocks, seed + 4);
            }
        }
    }
}

#[test]
fn tile_decoding_equals_the_reference_decoder_bit_for_bit() {
    for ty in QuantType::ALL {
        let mut rng = Rng::new(ty.block_bytes() as u64);
        let blocks = 2 * 256 / ty.block_elems() + 1;
        let w = random_blocks(ty, blocks, &mut rng);
        let n = blocks * ty.block_elems();
        let (mut fast, mut want) = (vec![f32::NAN; n], vec![0f32; n]);
        super::decode_rows(ty, &w, &mut fast);
        decode_blocks(ty, &w, &mut want);
        assert!(
            fast.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty:?}"
        );
    }
}

#[test]
fn this_machine_detects_a_simd_level() {
    let levels = Level::available().to_vec();
    println!(
        "kernel levels on this CPU: {levels:?}; chosen {:?}",
        Level::detect()
    );
    assert_eq!(levels[0], Level::Scalar);
    assert_eq!(Level::detect(), *levels.last().unwrap_or(&Level::Scalar));
}

/// The matrix entry point runs, at every level, the same per-row kernel as [`qdot_rows_at`]:
/// bit-identical sums for every row of a ragged matrix, every type, 1 to 6 and 8 activation rows.
#[test]
fn matrix_rows_equal_the_row_kernel_at_every_level() {
    fn one<const N: usize>(level: Level, ty: QuantType, rows: usize, blocks: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let w = random_blocks(ty, rows * blocks, &mut rng);
        let k = blocks * ty.block_elems();
        let acts: Vec<Vec<f32>> = (0..N)
            .map(|_| (0..k).map(|_| rng.f32()).collect())
            .collect();
        let xs: [&[f32]; N] = std::array::from_fn(|r| acts[r].as_slice());
        let row_bytes = blocks * ty.block_bytes();
        let mut seen = vec![false; rows];
        super::qdot_matrix_at(level, ty, &w, row_bytes, &xs, &mut |j, got| {
            let want = qdot_rows_at(level, ty, &w[j * row_bytes..(j + 1) * row_bytes], &xs);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?} {ty:?} row {j}: {got:?} vs {want:?}"
            );
            seen[j] = true;
        });
        assert!(
            seen.iter().all(|s| *s),
            "{level:?} {ty:?}: a row was skipped"
        );
    }
    for &level in Level::available() {
        for ty in QuantType::ALL {
            for (i, (rows, blocks)) in [(1usize, 1usize), (7, 3), (33, 18)].into_iter().enumerate()
            {
                let seed = 7 + i as u64 * 17 + ty.block_bytes() as u64;
                one::<1>(level, ty, rows, blocks, seed);
                one::<2>(level, ty, rows, blocks, seed + 1);
                one::<3>(level, ty, rows, blocks, seed + 2);
                one::<4>(level, ty, rows, blocks, seed + 3);
                one::<5>(level, ty, rows, blocks, seed + 5);
                one::<6>(level, ty, rows, blocks, seed + 6);
                one::<8>(level, ty, rows, blocks, seed + 4);
            }
        }
    }
}

/// Single-thread kernel speed, nanoseconds per weight block per activation row, at every level
/// (the scalar reference only cache-resident) and, as "per-row", the one-weight-row kernel
/// ([`qdot_rows_at`]) called row after row: a 256 KiB matrix (L2-resident, as one thread's
/// chunk of a decode matmul) and a 64 MiB one read once per pass (memory-bound), 1 to 8
/// activation rows of 576 values. A benchmark command, not a check:
/// `cargo test --release -p sov --lib backend::cpu::qdot::tests::kernel_speed -- --ignored --nocapture`
#[test]
#[ignore = "benchmark: prints ns per block"]
fn kernel_speed() {
    use std::time::Instant;
    fn time<const N: usize>(
        level: Option<Level>,
        ty: QuantType,
        w: &[u8],
        row: usize,
        x: &[Vec<f32>],
    ) -> f64 {
        let xs: [&[f32]; N] = std::array::from_fn(|i| x[i].as_slice());
        let blocks = w.len() / ty.block_bytes();
        let reps = (64 << 20) / w.len().min(64 << 20) + 1;
        let mut best = f64::MAX;
        let mut sink = 0f32;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                match level {
                    Some(level) => super::qdot_matrix_at(level, ty, w, row, &xs, &mut |_, s| {
                        sink += s.iter().sum::<f32>()
                    }),
                    None => {
                        for r in w.chunks_exact(row) {
                            sink += qdot_rows_at(Level::detect(), ty, r, &xs)
                                .iter()
                                .sum::<f32>();
                        }
                    }
                }
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / (reps * blocks * N) as f64);
        }
        std::hint::black_box(sink);
        best
    }
    for ty in [QuantType::Q4_1, QuantType::Q8_0] {
        let mut rng = Rng::new(7);
        let row_blocks = 576 / 32;
        let row = row_blocks * ty.block_bytes();
        let k = row_blocks * 32;
        let x: Vec<Vec<f32>> = (0..8)
            .map(|_| (0..k).map(|_| rng.f32()).collect())
            .collect();
        for (what, bytes) in [("L2 256 KiB", 256 << 10), ("DRAM 64 MiB", 64 << 20)] {
            let w = random_blocks(ty, bytes / row * row_blocks, &mut rng);
            let mut levels: Vec<Option<Level>> =
                Level::available().iter().map(|l| Some(*l)).collect();
            levels.push(None);
            for level in levels {
                if level == Some(Level::Scalar) && bytes > 1 << 20 {
                    continue;
                }
                println!(
                    "{ty:?} {what} {}: ns/block/row N=1 {:.3}, N=2 {:.3}, N=4 {:.3}, N=5 {:.3}, N=6 {:.3}, N=8 {:.3}",
                    level.map_or("per-row".to_string(), |l| format!("{l:?}")),
                    time::<1>(level, ty, &w, row, &x),
                    time::<2>(level, ty, &w, row, &x),
                    time::<4>(level, ty, &w, row, &x),
                    time::<5>(level, ty, &w, row, &x),
                    time::<6>(level, ty, &w, row, &x),
                    time::<8>(level, ty, &w, row, &x)
                );
            }
        }
    }
}
