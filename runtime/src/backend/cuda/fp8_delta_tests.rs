//! Checks of the residual deltas written in bf16 (`CudaTuning::fp8_delta_bf16`,
//! `Backend::matmul_residual_delta`, `fp8.rs`): an FP8 product past the small-M rows comes back
//! marked bf16 with the f32 product's values rounded once; the add + RMSNorm kernels reading a
//! bf16 delta give the bits they give on the same values in f32, for every output form (f32,
//! bf16, e4m3 rows of bf16 or f32 values) and both row forms (vector, scalar); and a whole FP8
//! model stays as close to the bf16 model as with f32 deltas. GPU tests print why and return
//! without a usable GPU.

use half::bf16;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::fp8_gate_up_tests::{
    assert_rounded_once, bf16_out_device_with, fp8_model_is_as_close_with,
};
use super::fp8_tests::{bf16_round, download_any, upload_bf16, values};
use super::tests::device_with;
use super::{CudaBuffer, Quantization};
use crate::backend::{Backend, DType, DeviceBuffer, RmsNorm};

#[test]
fn delta_in_bf16_is_the_f32_product_rounded() {
    let Some(b) = bf16_out_device_with(|t| t.fp8_delta_bf16 = true) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(31);
    // (n, k, m): just past the small-M kernel's rows, a prefill chunk, Llama-3-8B's o and down.
    for (n, k, m) in [
        (17, 64, 96),
        (102, 576, 3072),
        (300, 4096, 4096),
        (33, 14336, 4096),
    ] {
        let x = b.upload_f32(&values(&mut rng, n, k)).expect("upload"); // [n, k] f32
        let w = upload_bf16(&b, &values(&mut rng, m, k), m, k); // [m, k] bf16
        let w = b.quantize_weight(&w, m, k).expect("quantize"); // [m, k] e4m3 + [m] f32
        let mut f32_out = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m] f32
        b.matmul(&x, &w, &mut f32_out, n, k, m).expect("matmul");
        let want = bf16_round(&download_any(&b, &f32_out));
        let mut delta = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m] f32, half used
        b.matmul_residual_delta(&x, &w, &mut delta, n, k, m)
            .expect("delta product");
        assert_eq!(delta.dtype(), DType::BF16, "n={n} k={k} m={m}");
        let mut h = vec![bf16::ZERO; n * m]; // [n, m] bf16
        b.download_raw(&delta, 0, bytemuck::cast_slice_mut(&mut h))
            .expect("download");
        assert_rounded_once(&h, &want, &format!("delta n={n} k={k} m={m}"));
        // The same buffer for a product the small-M kernel multiplies: f32 again, the
        // matmul's values.
        let x4 = b.upload_f32(&values(&mut rng, 4, k)).expect("upload"); // [4, k] f32
        let mut plain = b.alloc(DType::F32, 4 * m).expect("alloc"); // [4, m] f32
        b.matmul(&x4, &w, &mut plain, 4, k, m).expect("matmul");
        b.matmul_residual_delta(&x4, &w, &mut delta, 4, k, m)
            .expect("delta product");
        assert_eq!(delta.dtype(), DType::F32);
        let got = download_any(&b, &delta);
        let want = download_any(&b, &plain);
        assert!(
            got[..4 * m]
                .iter()
                .zip(&want)
                .all(|(a, c)| a.to_bits() == c.to_bits()),
            "k={k} m={m}: small-M delta differs from matmul"
        );
    }
}

#[test]
fn add_rms_norm_of_a_bf16_delta_matches_the_same_values_in_f32() {
    let Some(b) = device_with(|t| {
        t.deterministic = false;
        t.quantization = Quantization::Fp8W8A8;
    }) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(37);
    // The vector form (d % 4 == 0) at and past what a CTA keeps in registers, the scalar form
    // (odd widths); one row takes the f32 forms (the GEMV's rows), more rows bf16.
    for (n, d) in [
        (1, 4096),
        (3, 576),
        (300, 4096),
        (5, 5001),
        (2, 16388),
        (4, 1001),
    ] {
        let res = values(&mut rng, n, d); // [n, d]
        let delta = bf16_round(&values(&mut rng, n, d)); // [n, d], exact in bf16
        let weight = super::reference::random(d, 1.0, d as u64); // [d]
        let w = b.upload_f32(&weight).expect("upload"); // [d]
        let d32 = b.upload_f32(&delta).expect("upload"); // [n, d] f32
        let h: Vec<bf16> = delta.iter().map(|&x| bf16::from_f32(x)).collect(); // [n, d] bf16
        let d16 = b
            .upload_bytes(DType::BF16, bytemuck::cast_slice(&h))
            .expect("upload"); // [n, d] bf16
        let norm = RmsNorm {
            weight: &w,
            eps: 1e-5,
        };
        let run = |delta: &CudaBuffer, out: &mut CudaBuffer| -> (Vec<f32>, Vec<u8>) {
            let mut r = b.upload_f32(&res).expect("upload"); // [n, d]
            b.add_rms_norm(&mut r, delta, norm, out, n, d)
                .expect("add_rms_norm");
            let mut bytes = vec![0u8; out.mem.len()];
            b.download_raw(out, 0, &mut bytes).expect("download");
            (download_any(&b, &r), bytes)
        };
        let mut outs: Vec<(String, CudaBuffer, CudaBuffer)> = [DType::F32, DType::BF16]
            .into_iter()
            .map(|t| {
                let a = b.alloc(t, n * d).expect("alloc"); // [n, d]
                let c = b.alloc(t, n * d).expect("alloc"); // [n, d]
                (format!("{t:?}"), a, c)
            })
            .collect();
        let a = b.alloc_quantized_rows(n, d).expect("alloc"); // [n, d] e4m3 + [n] f32
        let c = b.alloc_quantized_rows(n, d).expect("alloc");
        outs.push(("e4m3 rows".into(), a, c));
        for (what, want_out, got_out) in &mut outs {
            let (want_r, want) = run(&d32, want_out);
            let (got_r, got) = run(&d16, got_out);
            assert!(
                want_r
                    .iter()
                    .zip(&got_r)
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "n={n} d={d} {what}: residuals differ"
            );
            assert_eq!(want, got, "n={n} d={d} {what}: outputs differ");
        }
    }
}

/// A 4-layer FP8 model (prefill of 102 rows, where cuBLASLt multiplies) is as close to the bf16
/// model with bf16 deltas as with f32 ones, and the bf16 deltas change its logits (so the bf16
/// products ran).
#[test]
fn fp8_model_with_bf16_deltas_is_as_close_to_bf16() {
    fp8_model_is_as_close_with("the deltas", 13, |t, on| t.fp8_delta_bf16 = on);
}
