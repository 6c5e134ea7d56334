//! Checks of the quantized product inputs (`fp8_inputs.rs`): RMSNorm and SwiGLU writing e4m3
//! rows give, byte for byte and scale bit for bit, the host quantization (the OCP encoder of
//! `fp8_tests.rs`) of what their plain forms store (bf16, or f32 for the few rows whose products
//! take f32: `Backend::matmul_input_dtype`); the residual they update is the same; an FP8
//! product of those rows gives the bits of the same product quantizing the bf16 rows itself; and a
//! whole FP8 model gives the same logits, bit for bit, with and without them. GPU tests print why
//! and return without a usable GPU.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::fp8_tests::{download_any, fp8_device, quantize_row, values};
use super::tests::device_with;
use super::{CudaBackend, CudaBuffer, Fp8QuantizedInputs, Quantization};
use crate::backend::{Backend, DType, InputProducer, RmsNorm};

/// The codes and scales of `n` quantized rows of `k` in `q`.
fn download_rows(b: &CudaBackend, q: &CudaBuffer, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let mut codes = vec![0u8; n * k];
    b.download_raw(q, 0, &mut codes).expect("download");
    let mut scales = vec![0f32; n];
    let off = super::fp8::scales_offset(n * k);
    b.download_raw(q, off, bytemuck::cast_slice_mut(&mut scales))
        .expect("download");
    (codes, scales)
}

/// `codes` / `scales` against the host quantization of each row of `rows` (`[n, k]`).
fn assert_quantized_rows(rows: &[f32], codes: &[u8], scales: &[f32], k: usize, what: &str) {
    let mut bad_codes = 0;
    let mut bad_scales = 0;
    for (r, row) in rows.chunks(k).enumerate() {
        let (want, scale) = quantize_row(row);
        bad_codes += want
            .iter()
            .zip(&codes[r * k..(r + 1) * k])
            .filter(|(a, b)| a != b)
            .count();
        bad_scales += usize::from(scale.to_bits() != scales[r].to_bits());
    }
    println!("{what}: {bad_codes} codes and {bad_scales} scales differ");
    assert_eq!((bad_codes, bad_scales), (0, 0), "{what}");
}

#[test]
fn rms_norm_into_quantized_rows_quantizes_the_plain_rows() {
    let Some(b) = fp8_device() else { return };
    let mut rng = StdRng::seed_from_u64(17);
    // Widths of the vector form (d % 4 == 0) under, at and past what a CTA keeps in registers
    // (16 x 1024), of the scalar form (odd, past its 4 x 1024), odd row counts, a zero row (row 1
    // of `values`), with and without the residual add; one row takes the f32 values (the GEMV's
    // rows, `CudaTuning::gemv_max_rows`), in both forms.
    for (n, d) in [
        (1, 4096),
        (1, 5001),
        (3, 576),
        (64, 4096),
        (5, 5000),
        (2, 8192),
        (7, 64),
        (9, 1000),
        (2, 16388),
        (3, 4097),
        (4, 1001),
        (300, 4096),
        (301, 5000),
        (299, 16388),
    ] {
        let res = values(&mut rng, n, d);
        let delta = super::reference::random(n * d, 0.5, n as u64); // [n, d]
        let weight = super::reference::random(d, 1.0, d as u64); // [d]
        let delta_b = b.upload_f32(&delta).expect("upload"); // [n, d]
        let w = b.upload_f32(&weight).expect("upload"); // [d]
        for add in [false, true] {
            let norm = RmsNorm {
                weight: &w,
                eps: 1e-5,
            };
            let run = |out: &mut CudaBuffer| -> Vec<f32> {
                let mut r = b.upload_f32(&res).expect("upload"); // [n, d]
                if add {
                    b.add_rms_norm(&mut r, &delta_b, norm, out, n, d)
                } else {
                    b.rms_norm(&r, norm, out, n, d)
                }
                .expect("rms norm");
                download_any(&b, &r)
            };
            let form = b.matmul_input_dtype(n);
            let mut plain = b.alloc(form, n * d).expect("alloc"); // [n, d] bf16 or f32
            let mut q = b.alloc_quantized_rows(n, d).expect("alloc"); // [n, d] e4m3 + [n] f32
            let (res_plain, res_q) = (run(&mut plain), run(&mut q));
            let (codes, scales) = download_rows(&b, &q, n, d);
            let what = format!("rms_norm n={n} d={d} add={add} of {form:?}");
            assert_quantized_rows(&download_any(&b, &plain), &codes, &scales, d, &what);
            assert!(
                res_plain
                    .iter()
                    .zip(&res_q)
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "{what}: residuals differ"
            );
        }
    }
}

#[test]
fn silu_mul_into_quantized_rows_quantizes_the_plain_rows() {
    let Some(b) = fp8_device() else { return };
    let mut rng = StdRng::seed_from_u64(19);
    // Llama-3-8B's 14336, the longest row the kernel holds, short and odd-group rows; more rows
    // than an H100 or H200 has SMs (the 256-thread CTAs) and fewer (1024 threads); one row takes
    // the f32 values.
    for (n, f) in [
        (1, 14336),
        (1, 12),
        (1, 16384),
        (33, 14336),
        (4, 16384),
        (6, 1536),
        (3, 12),
        (2, 4100),
        (300, 14336),
        (301, 16384),
        (299, 4100),
    ] {
        let gate_up = values(&mut rng, n, 2 * f);
        let g = b.upload_f32(&gate_up).expect("upload"); // [n, 2f]
        let form = b.matmul_input_dtype(n);
        let mut plain = b.alloc(form, n * f).expect("alloc"); // [n, f] bf16 or f32
        let mut q = b.alloc_quantized_rows(n, f).expect("alloc"); // [n, f] e4m3 + [n] f32
        b.silu_mul(&g, &mut plain, n, f).expect("silu_mul");
        b.silu_mul(&g, &mut q, n, f).expect("silu_mul e4m3");
        let (codes, scales) = download_rows(&b, &q, n, f);
        let what = format!("silu_mul n={n} f={f} of {form:?}");
        assert_quantized_rows(&download_any(&b, &plain), &codes, &scales, f, &what);
    }
    // A row the kernel cannot hold is refused, not truncated.
    let g = b.alloc(DType::F32, 2 * 16388).expect("alloc"); // [1, 2 * 16388]
    let mut q = b.alloc_quantized_rows(1, 16388).expect("alloc"); // [1, 16388] e4m3 + [1] f32
    assert!(b.silu_mul(&g, &mut q, 1, 16388).is_err());
}

#[test]
fn products_of_quantized_rows_give_the_bits_of_bf16_rows() {
    let Some(b) = fp8_device() else { return };
    let mut rng = StdRng::seed_from_u64(23);
    // Small-M rows (9 and 16: past the 8 rows `fp8_device` quantizes inside the product) and
    // cuBLASLt rows (17, 300) at the 8B shapes' k.
    for (n, k, m) in [
        (9, 4096, 256),
        (16, 14336, 128),
        (17, 4096, 512),
        (300, 14336, 256),
    ] {
        let gate_up = values(&mut rng, n, 2 * k);
        let g = b.upload_f32(&gate_up).expect("upload"); // [n, 2k]
        let w = super::fp8_tests::upload_bf16(&b, &values(&mut rng, m, k), m, k); // [m, k] bf16
        let wq = b.quantize_weight(&w, m, k).expect("quantize"); // [m, k] e4m3 + [m] f32
        assert!(
            b.takes_quantized_rows(n, k, &wq, InputProducer::SwiGlu),
            "n={n} k={k}"
        );
        let mut plain = b.alloc(DType::BF16, n * k).expect("alloc"); // [n, k] bf16
        let mut q = b.alloc_quantized_rows(n, k).expect("alloc"); // [n, k] e4m3 + [n] f32
        b.silu_mul(&g, &mut plain, n, k).expect("silu_mul");
        b.silu_mul(&g, &mut q, n, k).expect("silu_mul e4m3");
        let mut out_plain = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m]
        let mut out_q = b.alloc(DType::F32, n * m).expect("alloc"); // [n, m]
        b.matmul(&plain, &wq, &mut out_plain, n, k, m)
            .expect("matmul");
        b.matmul(&q, &wq, &mut out_q, n, k, m)
            .expect("matmul of rows");
        let (a, c) = (download_any(&b, &out_plain), download_any(&b, &out_q));
        let differ = a
            .iter()
            .zip(&c)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        println!("product n={n} k={k} m={m}: {differ} of {} differ", a.len());
        assert_eq!(differ, 0, "n={n} k={k} m={m}");
    }
}

/// A 4-layer model of hidden size 576 and intermediate size `f` (heads 9 / 3 of 64).
pub(super) fn four_layer_config(f: usize) -> crate::model::config::LlamaConfig {
    crate::model::config::LlamaConfig {
        vocab_size: 4099,
        hidden_size: 576,
        intermediate_size: f,
        num_hidden_layers: 4,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: 64,
        tie_word_embeddings: false,
        ..crate::model::random::tiny_config()
    }
}

/// The logits of `c` with weights `w` on `b`: a prefill of three prompts (5, 34 and 63 tokens,
/// 102 rows), a decode step of the three, then a decode step of the first alone.
pub(super) fn four_layer_logits(
    b: CudaBackend,
    c: &crate::model::config::LlamaConfig,
    w: &std::collections::HashMap<String, crate::loader::tensor::HostTensor>,
) -> Vec<f32> {
    use crate::model::LlamaModel;
    use crate::model::batch::SeqChunk;
    let model = LlamaModel::new(b, c, w).expect("model");
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|s| {
            (0..(5 + 29 * s))
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
    let mut logits = model.forward(&mut kv, &chunks).expect("forward");
    let next: Vec<[u32; 1]> = (0..3).map(|s| [(s * 7 + 1) as u32]).collect();
    let steps: Vec<SeqChunk<'_>> = prompts
        .iter()
        .zip(&tables)
        .zip(&next)
        .map(|((p, t), id)| SeqChunk {
            tokens: id,
            start_pos: p.len(),
            block_table: t,
        })
        .collect();
    logits.extend(model.forward(&mut kv, &steps).expect("decode"));
    let one = [SeqChunk {
        tokens: &[11],
        start_pos: prompts[0].len() + 1,
        block_table: &tables[0],
    }];
    logits.extend(model.forward(&mut kv, &one).expect("decode of one row"));
    logits
}

/// A 4-layer FP8 model (the first and last layers in bf16, the default edge layers) gives the
/// same logits, bit for bit, with quantized rows from the SwiGLU or from both producers as with
/// none: a prefill of 102 rows (cuBLASLt), a decode step of three rows (small-M) and one of one
/// row. Also where the gate/up product quantizes its own input but the down product does not
/// (`SOV_FP8_FUSED_ROWS=8`, 3 x 576 values fit the fused kernel, 3 x 12288 do not), and with
/// no fused kernel (`SOV_FP8_FUSED_ROWS=0`, the default), where the one-row step's producers
/// quantize f32 values (`_f32_e4m3`).
#[test]
fn fp8_model_logits_are_the_same_with_quantized_rows() {
    use crate::model::random::{WeightDtype, random_weights};
    for (fused_rows, f) in [(1, 1536), (8, 12288), (0, 1536)] {
        let device = |inputs: Fp8QuantizedInputs| {
            device_with(|t| {
                t.quantization = Quantization::Fp8W8A8;
                t.deterministic = false;
                t.fp8_quantized_inputs = inputs;
                t.fp8_fused_max_rows = fused_rows;
            })
        };
        let Some(without) = device(Fp8QuantizedInputs::Off) else {
            return;
        };
        let c = four_layer_config(f);
        let w = random_weights(&c, 7, WeightDtype::BF16);
        let r = four_layer_logits(without, &c, &w);
        for inputs in [Fp8QuantizedInputs::SwiGlu, Fp8QuantizedInputs::All] {
            let Some(with) = device(inputs) else { return };
            let a = four_layer_logits(with, &c, &w);
            let differ = a
                .iter()
                .zip(&r)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            println!(
                "FP8 model (fused rows {fused_rows}, f {f}) with quantized rows from {inputs:?} \
                 / none: {differ} of {} logits differ",
                a.len()
            );
            assert_eq!(differ, 0, "{inputs:?} fused rows {fused_rows} f {f}");
        }
    }
}
