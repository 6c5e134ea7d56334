//! Checks of the FP8 gate/up product written in bf16 (`CudaTuning::fp8_gate_up_bf16`,
//! `fp8.rs`): its values are the f32 product's rounded to bf16; the SiLU-mul kernels reading bf16
//! rows give the bits they give on the same values in f32, for every output form (f32, bf16,
//! e4m3 rows); and a whole FP8 model stays as close to the bf16 model as with gate/up in f32.
//! GPU tests print why and return without a usable GPU.

use half::bf16;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::fp8_inputs_tests::{four_layer_config, four_layer_logits};
use super::fp8_tests::{bf16_round, download_any, fp8_device_with, upload_bf16, values};
use super::ops::GateUpRows;
use super::tests::device_with;
use super::{CudaBackend, CudaBuffer, CudaTuning, Quantization};
use crate::backend::{Backend, DType};

/// `v` uploaded as bf16 (each value rounded).
fn upload_bf16_rows(b: &CudaBackend, v: &[f32]) -> CudaBuffer {
    let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect(); // [v.len()] bf16
    b.upload_bytes(DType::BF16, bytemuck::cast_slice(&h))
        .expect("upload")
}

/// A device whose cuBLASLt writes bf16 FP8 products, or `None` with the reason printed.
pub(super) fn bf16_out_device() -> Option<CudaBackend> {
    bf16_out_device_with(|_| {})
}

/// [`bf16_out_device`] with `change` applied to the tuning of `fp8_tests::fp8_device`.
pub(super) fn bf16_out_device_with(change: impl FnOnce(&mut CudaTuning)) -> Option<CudaBackend> {
    let b = fp8_device_with(change)?;
    if !b.fp8.as_ref().is_some_and(|g| g.bf16_out()) {
        println!("skipped: this cuBLASLt has no outer-vector FP8 scales, so its products stay f32");
        return None;
    }
    Some(b)
}

#[test]
fn gate_up_in_bf16_is_the_f32_product_rounded() {
    let Some(b) = bf16_out_device() else { return };
    let mut rng = StdRng::seed_from_u64(23);
    // (n, k, 2f): just past the small-M kernel's rows, a prefill chunk, Llama-3-8B's gate/up.
    for (n, k, m) in [(17, 64, 96), (102, 576, 3072), (300, 4096, 28672)] {
        let x = b.upload_f32(&values(&mut rng, n, k)).expect("upload"); // [n, k] f32
        let w = upload_bf16(&b, &values(&mut rng, m, k), m, k); // [m, k] bf16
        let w = b.quantize_weight(&w, m, k).expect("quantize"); // [m, k] e4m3 + [m] f32
        let mut f32_out = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m] f32
        b.matmul(&x, &w, &mut f32_out, n, k, m).expect("matmul");
        let want = bf16_round(&download_any(&b, &f32_out));
        let mut gate_up = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m] f32, half used
        let rows = b
            .gate_up_bf16(&x, &w, &mut gate_up, (n, k, m))
            .expect("gate/up")
            .expect("the bf16 product applies past the small-M rows");
        assert!(rows.bf16);
        let mut h = vec![bf16::ZERO; n * m]; // [n, m] bf16
        b.download_raw(&gate_up, 0, bytemuck::cast_slice_mut(&mut h))
            .expect("download");
        assert_rounded_once(&h, &want, &format!("gate/up n={n} k={k} m={m}"));
    }
    // Rows the small-M kernel multiplies stay f32.
    let x = b.alloc(DType::F32, 4 * 64).expect("alloc"); // [4, 64] f32
    let w = upload_bf16(&b, &vec![0.5; 96 * 64], 96, 64);
    let w = b.quantize_weight(&w, 96, 64).expect("quantize");
    let mut g = b.alloc(DType::F32, 4 * 96).expect("alloc"); // [4, 96] f32
    assert!(
        b.gate_up_bf16(&x, &w, &mut g, (4, 64, 96))
            .unwrap()
            .is_none()
    );
}

/// `got` (a cuBLASLt FP8 product written in bf16) is `want` (the same product in f32, rounded to
/// bf16) but for at most 1% of elements one bf16 step away: one rounding of the scaled f32 result,
/// where cuBLASLt's bf16 kernel sums in another order.
pub(super) fn assert_rounded_once(got: &[bf16], want: &[f32], what: &str) {
    let mut differ = 0;
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        if g.to_f32().to_bits() != w.to_bits() {
            differ += 1;
            let ulp = (w.abs() * 2f32.powi(-7)).max(f32::MIN_POSITIVE);
            assert!(
                (g.to_f32() - w).abs() <= ulp,
                "{what} element {i}: {} vs {w}",
                g.to_f32()
            );
        }
    }
    println!("{what}: {differ} of {} differ by one bf16 step", got.len());
    assert!(differ * 100 <= got.len(), "{what}: {differ} differ");
}

#[test]
fn silu_mul_of_bf16_rows_matches_the_same_values_in_f32() {
    let Some(b) = device_with(|t| t.deterministic = false) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(29);
    // 16-byte groups and odd rows (one value a thread), the SwiGLU of Llama-3-8B.
    for (n, f) in [(3, 12), (5, 13), (33, 1536), (2, 14336)] {
        let v = bf16_round(&values(&mut rng, n, 2 * f)); // [n, 2f], exact in bf16
        let g32 = b.upload_f32(&v).expect("upload"); // [n, 2f] f32
        let g16 = upload_bf16_rows(&b, &v); // [n, 2f] bf16
        let rows = GateUpRows {
            ptr: g16.ptr(),
            bf16: true,
        };
        for out_dtype in [DType::F32, DType::BF16] {
            let mut want = b.alloc(out_dtype, n * f).expect("alloc"); // [n, f]
            let mut got = b.alloc(out_dtype, n * f).expect("alloc"); // [n, f]
            b.silu_mul(&g32, &mut want, n, f).expect("silu_mul");
            // SAFETY: g16 holds n*2f bf16 and lives past the launch (downloads synchronize).
            unsafe { b.silu_mul_from(rows, &mut got, n, f) }.expect("silu_mul from bf16");
            let (a, w) = (download_any(&b, &got), download_any(&b, &want));
            let differ = a
                .iter()
                .zip(&w)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(differ, 0, "n={n} f={f} out {out_dtype:?}");
        }
        if f.is_multiple_of(4) {
            let mut want = b.alloc_quantized_rows(n, f).expect("alloc"); // [n, f] e4m3 + [n] f32
            let mut got = b.alloc_quantized_rows(n, f).expect("alloc");
            b.silu_mul(&g32, &mut want, n, f).expect("silu_mul e4m3");
            // SAFETY: as above.
            unsafe { b.silu_mul_from(rows, &mut got, n, f) }.expect("e4m3 from bf16");
            let bytes = super::fp8::scales_offset(n * f) + 4 * n;
            let (mut a, mut w) = (vec![0u8; bytes], vec![0u8; bytes]);
            b.download_raw(&got, 0, &mut a).expect("download");
            b.download_raw(&want, 0, &mut w).expect("download");
            assert_eq!(a, w, "n={n} f={f} e4m3 rows");
        }
    }
}

/// A 4-layer FP8 model (prefill of 102 rows, where cuBLASLt multiplies) is as close to the bf16
/// model with gate/up in bf16 as with it in f32: mean |logit difference| within 10%. (The two
/// FP8 runs differ from each other by about a third of FP8's own error at the largest logit,
/// 0.037 against 0.110 on the H200: gate/up rounded to bf16 moves a few SwiGLU values across an
/// e4m3 rounding boundary, and each such code moves by a whole e4m3 step. That changes which
/// values carry FP8's error, not how large it is.)
#[test]
fn fp8_model_with_bf16_gate_up_is_as_close_to_bf16() {
    fp8_model_is_as_close_with("gate/up", 11, |t, on| {
        t.fp8_gate_up_bf16 = on;
        t.fp8_delta_bf16 = false; // gate/up alone differs between the FP8 runs
    });
}

/// The check of [`fp8_model_with_bf16_gate_up_is_as_close_to_bf16`] for the switch `what` that
/// `set(tuning, on)` turns on or off (weights from `seed`): the 4-layer FP8 model with it on is
/// as close to the bf16 model as with it off (mean |logit difference| within 10%), and on and off
/// differ (so the switch ran something).
pub(super) fn fp8_model_is_as_close_with(
    what: &str,
    seed: u64,
    set: impl Fn(&mut CudaTuning, bool),
) {
    use crate::model::random::{WeightDtype, random_weights};
    let device = |fp8: bool, on: bool| {
        device_with(|t| {
            t.deterministic = false;
            if fp8 {
                t.quantization = Quantization::Fp8W8A8;
            }
            set(t, on);
        })
    };
    let Some(bf16_model) = device(false, false) else {
        return;
    };
    if bf16_out_device().is_none() {
        return;
    }
    let c = four_layer_config(1536);
    let w = random_weights(&c, seed, WeightDtype::BF16);
    let reference = four_layer_logits(bf16_model, &c, &w);
    let off = four_layer_logits(device(true, false).expect("device"), &c, &w);
    let on = four_layer_logits(device(true, true).expect("device"), &c, &w);
    let diffs = |a: &[f32], b: &[f32]| -> (f64, f32) {
        let d: Vec<f32> = a.iter().zip(b).map(|(x, y)| (x - y).abs()).collect();
        let mean = d.iter().map(|&x| f64::from(x)).sum::<f64>() / d.len() as f64;
        (mean, d.iter().copied().fold(0f32, f32::max))
    };
    let (off_mean, off_max) = diffs(&off, &reference);
    let (on_mean, on_max) = diffs(&on, &reference);
    let (_, between) = diffs(&on, &off);
    println!(
        "FP8 vs the bf16 model, mean / max |diff|: {what} in f32 {off_mean:.6} / {off_max}, \
         in bf16 {on_mean:.6} / {on_max}; between the two FP8 runs (max) {between}"
    );
    assert!(off_mean > 0.0, "FP8 logits equal bf16's: FP8 did not run");
    assert!(
        between > 0.0,
        "{what} in bf16 changed nothing: the bf16 product did not run"
    );
    assert!(on_mean <= 1.1 * off_mean, "{on_mean} vs {off_mean}");
}
