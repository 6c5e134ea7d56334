//! Checks of the FP8 W8A8 path (`fp8.cu`, [`super::fp8`], [`super::gemm_fp8`]):
//! - the host e4m3 encoder of these tests against values fixed by the OCP FP8 specification
//!   (OFP8 1.0, E4M3: bias 7, max 448, no infinities) -- CPU only;
//! - the device's weight and input quantization against that encoder, byte for byte, scales bit
//!   for bit (GPU);
//! - every product path (small-M tensor cores, cuBLASLt, scalar) against an f64 CPU product of
//!   the same quantized values with the same scale math, odd shapes included; the bound is that of
//!   f32 accumulation order, |out - ref| <= 1e-5 * sum_k |qx * qw| * sx * sw, for the small-M and
//!   scalar kernels, and 1e-4 for cuBLASLt, whose FP8 kernels on the H200 keep partial sums in
//!   Hopper's FP8 tensor-core accumulator (measured up to 6.8e-5; the small-M kernel's mma.sync
//!   stays within 3e-8) (GPU);
//! - the whole model (random bf16 weights, a SmolLM2-like shape, several layers) in FP8 against
//!   bf16: last-token logits within 15% relative L2 (e4m3 keeps 3 mantissa bits: one rounding is
//!   up to 6.25% of a value) (GPU);
//! - FP8 checkpoint weights (`HostData::Fp8`) upload byte for byte, and a model read from them
//!   gives the logits, bit for bit, of bf16 weights that quantize at load to the same codes (GPU).
//!
//! GPU tests print why and return without a usable GPU.

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::tests::device_with;
use super::{CudaBackend, CudaBuffer, Fp8Path, Quantization};
use crate::backend::{Backend, DType, ProjectionSite};
use crate::loader::fp8::e4m3_to_f32;
use crate::loader::tensor::{Fp8Rows, HostData, HostTensor};

/// e4m3 byte to f32 (exact; checked against ml_dtypes in `crate::loader::fp8`).
fn decode(b: u8) -> f32 {
    e4m3_to_f32(b)
}

/// f32 to e4m3 by its definition: the code nearest to |v| among all finite codes, ties to the even
/// code, saturated to +-448 (PTX `cvt.rn.satfinite.e4m3x2.f32`). A scan of the 127 magnitudes;
/// [`encode`] gives the same bytes faster.
fn encode_by_scan(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    let mut best = 0u8;
    for code in 0u8..=0x7e {
        let (d, db) = ((decode(code) - a).abs(), (decode(best) - a).abs());
        if d < db || (d == db && code & 1 == 0 && best & 1 == 1) {
            best = code;
        }
    }
    sign | best
}

/// [`encode_by_scan`] through a table of the 127 magnitudes (increasing with the code): the nearest
/// code is one of the two around |v|, a tie goes to the even one. Checked equal to the scan in
/// `encoder_matches_the_scan`; the e4m3 cache tests encode millions of values with it.
pub(super) fn encode(v: f32) -> u8 {
    static MAGNITUDES: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    let table = MAGNITUDES.get_or_init(|| (0u8..=0x7e).map(decode).collect()); // [127]
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    if a.is_nan() {
        return sign; // no distance compares below code 0's, as in the scan
    }
    let hi = table.partition_point(|&m| m < a);
    let code = match hi {
        0 => 0,
        _ if hi == table.len() => 0x7e,
        _ => {
            let lo = hi - 1;
            let (dl, dh) = (a - table[lo], table[hi] - a);
            if dl < dh || (dl == dh && lo % 2 == 0) {
                lo
            } else {
                hi
            }
        }
    };
    sign | code as u8
}

/// The W8A8 quantization of one row (see `fp8.cu`): e4m3 bytes and the scale.
pub(super) fn quantize_row(x: &[f32]) -> (Vec<u8>, f32) {
    let a = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (inv, scale) = if a > 0.0 {
        (448.0f32 / a, a / 448.0)
    } else {
        (0.0, 1.0)
    };
    // A zero row keeps each value's sign: -0.0 is e4m3 0x80, as the device's conversion writes it.
    (x.iter().map(|&v| encode(v * inv)).collect(), scale)
}

#[test]
fn encoder_matches_the_ofp8_table() {
    assert_eq!(encode(1.0), 0x38);
    assert_eq!(encode(-2.0), 0xc0);
    assert_eq!(encode(448.0), 0x7e);
    assert_eq!(encode(1e6), 0x7e); // saturated
    assert_eq!(encode(f32::MAX), 0x7e);
    assert_eq!(encode(f32::NEG_INFINITY), 0xfe);
    assert_eq!(encode(2f32.powi(-9)), 0x01); // smallest subnormal
    assert_eq!(encode(2f32.powi(-10)), 0x00); // tie between 0 and 2^-9: the even code
    assert_eq!(encode(1.0625), 0x38); // tie between 1.0 and 1.125: even
    assert_eq!(encode(1.1875), 0x3a); // tie between 1.125 and 1.25: even (1.25)
    assert_eq!(encode(0.0), 0);
    assert_eq!(encode(-0.0), 0x80);
    assert_eq!(encode(-(2f32.powi(-11))), 0x80); // rounds to -0
    for code in 0u8..=0x7e {
        assert_eq!(encode(decode(code)), code);
        assert_eq!(encode(-decode(code)), code | 0x80);
    }
}

/// The table encoder gives the scan's byte for every value tried: a sweep of magnitudes up to past
/// the saturation point, each midpoint between neighbouring codes and one ulp either side of it,
/// both signs. (Far past 448 the scan's distances round to one value and it stops saturating; the
/// table encoder saturates there too, as the device does: see `encoder_matches_the_ofp8_table`.)
#[test]
fn encoder_matches_the_scan() {
    let mut values: Vec<f32> = (0..0x43fa_0000u32)
        .step_by(1 << 12)
        .map(f32::from_bits)
        .collect();
    for code in 0u8..0x7e {
        let mid = (decode(code) + decode(code + 1)) / 2.0;
        values.extend([mid, mid.next_down(), mid.next_up()]);
    }
    values.extend([f32::NAN, 1e6, 0.0]);
    for v in values {
        for x in [v, -v] {
            assert_eq!(encode(x), encode_by_scan(x), "{x:e}");
        }
    }
}

/// A device in FP8 mode with every layer quantized (no bf16 edge layers), so the model-level tests
/// measure FP8 in all of them, and the fused small-M kernels taking every row count they can
/// (the default takes one row; the outputs are the same bits either way).
pub(super) fn fp8_device() -> Option<CudaBackend> {
    fp8_device_with(|_| {})
}

/// [`fp8_device`] whose small-M products of fewer than `wide_ctas` CTAs take the 16-warp form.
fn fp8_device_wide(wide_ctas: usize) -> Option<CudaBackend> {
    fp8_device_with(|t| t.fp8_small_wide_ctas = wide_ctas)
}

pub(super) fn fp8_device_with(change: impl FnOnce(&mut super::CudaTuning)) -> Option<CudaBackend> {
    device_with(|t| {
        t.quantization = Quantization::Fp8W8A8;
        t.deterministic = false;
        t.fp8_bf16_edge_layers = 0;
        t.fp8_fused_max_rows = super::tuning::FP8_FUSED_LIMIT;
        change(t);
    })
}

/// Random values, some rows scaled far up or down and one row of zeros (row 1, if any).
pub(super) fn values(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    for r in 0..rows {
        let f = match r % 4 {
            0 => 1.0,
            1 => 0.0,
            2 => 1e-3,
            _ => 37.0,
        };
        v[r * cols..(r + 1) * cols].iter_mut().for_each(|x| *x *= f);
    }
    v
}

pub(super) fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

pub(super) fn upload_bf16(b: &CudaBackend, v: &[f32], rows: usize, cols: usize) -> CudaBuffer {
    let t = HostTensor {
        shape: vec![rows, cols],
        data: HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
    };
    b.upload_weight(&t).expect("upload")
}

#[test]
fn weights_are_quantized_by_the_scale_math() {
    let Some(b) = fp8_device() else { return };
    let mut rng = StdRng::seed_from_u64(11);
    for (m, k) in [(8, 64), (5, 1001), (37, 4096)] {
        let w = bf16_round(&values(&mut rng, m, k));
        let q = b
            .quantize_weight(&upload_bf16(&b, &w, m, k), m, k)
            .expect("quantize");
        let (bytes, scales) = b.download_fp8(&q, m).expect("download");
        for r in 0..m {
            let (want, s) = quantize_row(&w[r * k..(r + 1) * k]);
            assert_eq!(scales[r].to_bits(), s.to_bits(), "{m}x{k} row {r} scale");
            let bad = (0..k).filter(|&i| bytes[r * k + i] != want[i]).count();
            assert_eq!(bad, 0, "{m}x{k} row {r}: {bad} of {k} bytes differ");
        }
    }
}

/// `out = x @ w^T` on `path` with an FP8 copy of `w`; None when the path refuses the shape.
fn product(
    b: &CudaBackend,
    x: &CudaBuffer,
    w: &CudaBuffer,
    (n, k, m): (usize, usize, usize),
    path: Fp8Path,
) -> Option<Vec<f32>> {
    let mut out = b.alloc(DType::F32, n * m).expect("alloc");
    match b.matmul_fp8(x, w, &mut out, (n, k, m), path) {
        Ok(()) => {}
        Err(crate::backend::BackendError::Unsupported(_)) => return None,
        Err(e) => panic!("{n}x{k} @ {m}x{k}^T on {path:?}: {e}"),
    }
    let mut v = vec![0f32; n * m];
    b.download_f32(&out, &mut v).expect("download");
    Some(v)
}

#[test]
fn every_product_path_matches_the_reference_of_the_same_quantized_values() {
    // The small-M kernel in both forms: 8 warps a CTA, and 16 (`_wide`).
    for wide_ctas in [0, usize::MAX] {
        let Some(b) = fp8_device_wide(wide_ctas) else {
            return;
        };
        println!("small-M products of fewer than {wide_ctas} CTAs in the wide form");
        products_match_the_reference(&b);
    }
}

fn products_match_the_reference(b: &CudaBackend) {
    let mut rng = StdRng::seed_from_u64(5);
    let shapes = [
        (1, 4096, 96),
        (2, 512, 40),
        (8, 1024, 128),
        (17, 320, 200),
        (32, 64, 16),
        (33, 256, 64),
        (64, 4096, 256),
        (200, 512, 124),
        (5, 1001, 33),
        (3, 16, 7),
    ];
    let mut failures = Vec::new();
    for (n, k, m) in shapes {
        let xv = values(&mut rng, n, k);
        let wv = bf16_round(&values(&mut rng, m, k));
        let w = b
            .quantize_weight(&upload_bf16(b, &wv, m, k), m, k)
            .expect("quantize");
        let (qw, sw) = b.download_fp8(&w, m).expect("download");
        for bf16_input in [false, true] {
            let (x, xs) = if bf16_input {
                let r = bf16_round(&xv);
                (upload_bf16(b, &r, n, k), r)
            } else {
                (b.upload_f32(&xv).expect("upload"), xv.clone())
            };
            let rows: Vec<(Vec<u8>, f32)> = (0..n)
                .map(|r| quantize_row(&xs[r * k..(r + 1) * k]))
                .collect();
            for path in [
                Fp8Path::Auto,
                Fp8Path::Small,
                Fp8Path::SmallFused,
                Fp8Path::CublasLt,
                Fp8Path::Scalar,
            ] {
                let Some(out) = product(b, &x, &w, (n, k, m), path) else {
                    continue;
                };
                let lt = path == Fp8Path::CublasLt
                    || (path == Fp8Path::Auto
                        && n > b.tuning.fp8_small_max_rows
                        && k % 16 == 0
                        && m % 4 == 0);
                let rel = if lt { 1e-4 } else { 1e-5 };
                let mut worst = 0f64;
                for r in 0..n {
                    let (qx, sx) = &rows[r];
                    for j in 0..m {
                        let (mut sum, mut mag) = (0f64, 0f64);
                        for i in 0..k {
                            let p = decode(qx[i]) as f64 * decode(qw[j * k + i]) as f64;
                            sum += p;
                            mag += p.abs();
                        }
                        let want = (sum as f32 * sx * sw[j]) as f64;
                        let bound = rel * mag * (*sx as f64) * (sw[j] as f64) + 1e-30;
                        worst = worst.max((out[r * m + j] as f64 - want).abs() / bound);
                    }
                }
                let what = format!("{n}x{k} @ {m}x{k}^T bf16_input={bf16_input} {path:?}");
                println!("{what}: error / bound {worst:.3}");
                if worst > 1.0 {
                    failures.push(what);
                }
            }
        }
    }
    println!("cuBLASLt scale mode: {:?}", b.fp8_scale_mode());
    assert!(failures.is_empty(), "over the bound: {failures:?}");
}

/// The fused kernels (`fp8_fused.rs`): a product that quantizes its own input gives the bits of
/// `quantize_rows` + the small-M product, and the fused SwiGLU product the bits of that product into
/// a gate/up buffer + `silu_mul`, for f32 and bf16 inputs and outputs, 1..=8 rows, odd shapes
/// (rows not a multiple of 16, zero and outlier rows) and the largest input the kernels take.
#[test]
fn fused_products_give_the_bits_of_quantize_then_product() {
    // The fused kernels add their partial sums as the 8-warp small-M form does.
    let Some(b) = fp8_device_wide(0) else { return };
    let mut rng = StdRng::seed_from_u64(11);
    // (n, k, m): m is the product's rows; the SwiGLU product takes 2m rows and writes m columns.
    let shapes = [
        (1, 4096, 6144),
        (1, 14336, 4096),
        (2, 14336, 520),
        (3, 64, 37),
        (4, 1008, 1000),
        (5, 2048, 100),
        (8, 4096, 333),
        (7, 16, 9),
    ];
    for (n, k, m) in shapes {
        let xv = values(&mut rng, n, k);
        for (rows, swiglu) in [(m, false), (2 * m, true)] {
            let wv = bf16_round(&values(&mut rng, rows, k));
            let w = b
                .quantize_weight(&upload_bf16(&b, &wv, rows, k), rows, k)
                .expect("quantize");
            for bf16_input in [false, true] {
                let x = if bf16_input {
                    upload_bf16(&b, &bf16_round(&xv), n, k)
                } else {
                    b.upload_f32(&xv).expect("upload")
                };
                let what =
                    format!("{n}x{k} @ {rows}x{k}^T swiglu={swiglu} bf16_input={bf16_input}");
                let unfused = product(&b, &x, &w, (n, k, rows), Fp8Path::Small).expect("small-M");
                if !swiglu {
                    let fused = product(&b, &x, &w, (n, k, rows), Fp8Path::SmallFused)
                        .unwrap_or_else(|| panic!("{what}: the fused path refused it"));
                    assert_bits_equal(&fused, &unfused, &what);
                    continue;
                }
                let gate_up = b.upload_f32(&unfused).expect("upload");
                for out_dtype in [DType::F32, DType::BF16] {
                    let mut want = b.alloc(out_dtype, n * m).expect("alloc");
                    b.silu_mul(&gate_up, &mut want, n, m).expect("silu_mul");
                    let mut got = b.alloc(out_dtype, n * m).expect("alloc");
                    let shape = crate::backend::SwiGluShape { n, k, f: m };
                    b.matmul_silu_mul_fp8_fused(&x, &w, &mut got, shape)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let what = format!("{what} out={out_dtype:?}");
                    assert_bits_equal(&download_any(&b, &got), &download_any(&b, &want), &what);
                }
            }
        }
    }
}

/// A buffer of f32 or bf16 as f32 values (bf16 widened exactly).
pub(super) fn download_any(b: &CudaBackend, buf: &CudaBuffer) -> Vec<f32> {
    let mut v = vec![0f32; buf.len];
    if buf.dtype == DType::BF16 {
        let mut h = vec![bf16::ZERO; buf.len];
        b.download_raw(buf, 0, bytemuck::cast_slice_mut(&mut h))
            .expect("download");
        v.iter_mut().zip(&h).for_each(|(o, x)| *o = x.to_f32());
    } else {
        b.download_f32(buf, &mut v).expect("download");
    }
    v
}

fn assert_bits_equal(got: &[f32], want: &[f32], what: &str) {
    let differ = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!("{what}: {differ} of {} differ", got.len());
    assert_eq!(differ, 0, "{what}: fused and unfused bits differ");
}

#[test]
fn fp8_logits_stay_close_to_bf16() {
    use crate::model::LlamaModel;
    use crate::model::batch::SeqChunk;
    use crate::model::random::{WeightDtype, random_weights};
    let Some(fp8) = fp8_device() else { return };
    let Some(plain) = device_with(|t| t.deterministic = false) else {
        return;
    };
    let c = super::fp8_inputs_tests::four_layer_config(1536);
    let w = random_weights(&c, 7, WeightDtype::BF16);
    let run = |b: CudaBackend| -> Vec<f32> {
        let model = LlamaModel::new(b, &c, &w).expect("model");
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|s| {
                (0..(5 + 20 * s))
                    .map(|i| ((i * 131 + s * 977 + 5) % 4099) as u32)
                    .collect()
            })
            .collect();
        let tables: Vec<Vec<u32>> = (0..3)
            .map(|s| (0..4).map(|j| (j * 3 + s) as u32).collect())
            .collect();
        let mut kv = model.new_kv_cache(12, 16).expect("kv");
        let chunks: Vec<SeqChunk<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqChunk {
                tokens: p,
                start_pos: 0,
                block_table: t,
            })
            .collect();
        model.forward(&mut kv, &chunks).expect("forward")
    };
    let (a, r) = (run(fp8), run(plain));
    let e = super::reference::rel_err(&a, &r);
    let argmax = |v: &[f32]| (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best });
    let same = (0..3)
        .filter(|s| argmax(&a[s * 4099..(s + 1) * 4099]) == argmax(&r[s * 4099..(s + 1) * 4099]))
        .count();
    println!("fp8 vs bf16 logits: rel L2 {e:.4}, argmax equal {same}/3");
    assert!(e <= 0.15, "FP8 logits {e} from bf16's");
}

/// Codes of a `[rows, cols]` FP8 checkpoint weight: random finite codes with a +-448 code in
/// every row, and power-of-two row scales, so `e4m3 * scale` is exact in bf16 and quantizing
/// those bf16 values gives back these codes and scales.
fn checkpoint_rows(rng: &mut StdRng, rows: usize, cols: usize) -> Fp8Rows {
    let mut codes: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let c: u8 = rng.r#gen();
            if c & 0x7f == 0x7f { c ^ 1 } else { c }
        })
        .collect();
    for r in 0..rows {
        codes[r * cols + r % cols] = if r % 2 == 0 { 0x7e } else { 0xfe };
    }
    let scales = (0..rows).map(|r| 2f32.powi(-12 - (r % 5) as i32)).collect();
    Fp8Rows { codes, scales }
}

#[test]
fn checkpoint_weights_upload_as_they_are() {
    // The default tuning, which keeps the edge layers in bf16 when it quantizes at load.
    let Some(b) = device_with(|t| {
        t.quantization = Quantization::Fp8W8A8;
        t.deterministic = false;
    }) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(13);
    for (m, k) in [(8, 64), (5, 1001), (37, 4096)] {
        let rows = checkpoint_rows(&mut rng, m, k);
        let t = HostTensor {
            shape: vec![m, k],
            data: HostData::Fp8(rows.clone()),
        };
        // Layer 0, an edge layer: a checkpoint's codes still upload as they are.
        let site = ProjectionSite {
            layer: 0,
            layers: 4,
        };
        let w = b.upload_projection(t, site).expect("upload");
        assert_eq!(w.dtype, DType::F8E4M3);
        let (codes, scales) = b.download_fp8(&w, m).expect("download");
        assert_eq!(codes, rows.codes, "{m}x{k} codes");
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&scales), bits(&rows.scales), "{m}x{k} scales");
    }
}

/// A model read from an FP8 checkpoint (q/k/v and gate/up concatenated as FP8 rows) gives the
/// logits, bit for bit, of the same model quantized at load from bf16 weights that quantize to
/// the checkpoint's codes and scales.
#[test]
fn checkpoint_model_matches_quantizing_at_load() {
    use crate::model::LlamaModel;
    use crate::model::batch::SeqChunk;
    use crate::model::random::{WeightDtype, random_weights, tiny_config};
    if fp8_device().is_none() {
        return;
    }
    let c = crate::model::config::LlamaConfig {
        vocab_size: 1031,
        hidden_size: 256,
        intermediate_size: 688,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        tie_word_embeddings: false,
        ..tiny_config()
    };
    let mut checkpoint = random_weights(&c, 3, WeightDtype::BF16);
    let mut dense = checkpoint.clone();
    let mut rng = StdRng::seed_from_u64(17);
    let mut names: Vec<String> = checkpoint
        .keys()
        .filter(|n| n.contains("_proj.weight"))
        .cloned()
        .collect();
    names.sort();
    for name in &names {
        let shape = checkpoint[name].shape.clone();
        let rows = checkpoint_rows(&mut rng, shape[0], shape[1]);
        let values: Vec<bf16> = rows.to_f32().into_iter().map(bf16::from_f32).collect();
        assert_eq!(
            values.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            rows.to_f32(),
            "{name}: exact in bf16"
        );
        dense.insert(
            name.clone(),
            HostTensor {
                shape: shape.clone(),
                data: HostData::BF16(values),
            },
        );
        checkpoint.insert(
            name.clone(),
            HostTensor {
                shape,
                data: HostData::Fp8(rows),
            },
        );
    }
    let run = |w: &std::collections::HashMap<String, HostTensor>| -> Vec<f32> {
        // Every layer in FP8, as the checkpoint has them.
        let b = fp8_device().expect("the device opened once");
        let model = LlamaModel::new(b, &c, w).expect("model");
        let prompt: Vec<u32> = (0..37).map(|i| ((i * 131 + 5) % 1031) as u32).collect();
        let table: Vec<u32> = (0..3).collect();
        let mut kv = model.new_kv_cache(4, 16).expect("kv");
        let chunk = SeqChunk {
            tokens: &prompt,
            start_pos: 0,
            block_table: &table,
        };
        model.forward(&mut kv, &[chunk]).expect("forward")
    };
    let (a, d) = (run(&checkpoint), run(&dense));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(a.iter().all(|x| x.is_finite()));
    assert_eq!(bits(&a), bits(&d), "checkpoint codes vs quantized at load");
}

/// Quantizing at load keeps the layers `fp8_bf16_edge_layers` names (from each end) in bf16 and
/// quantizes the others.
#[test]
fn edge_layers_keep_bf16_weights() {
    let (m, k) = (48, 256);
    let weight = || HostTensor {
        shape: vec![m, k],
        data: HostData::F32(values(&mut StdRng::seed_from_u64(31), m, k)),
    };
    for edges in [0, 1, 2] {
        let Some(b) = device_with(|t| {
            t.quantization = Quantization::Fp8W8A8;
            t.deterministic = false;
            t.fp8_bf16_edge_layers = edges;
        }) else {
            return;
        };
        let layers = 5;
        let dtypes: Vec<DType> = (0..layers)
            .map(|layer| {
                let site = ProjectionSite { layer, layers };
                b.upload_projection(weight(), site).expect("upload").dtype
            })
            .collect();
        let (f8, b16) = (DType::F8E4M3, DType::BF16);
        let want = match edges {
            0 => vec![f8; 5],
            1 => vec![b16, f8, f8, f8, b16],
            _ => vec![b16, b16, f8, b16, b16],
        };
        assert_eq!(dtypes, want, "{edges} edge layers");
    }
}
