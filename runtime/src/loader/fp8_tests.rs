//! FP8 rows against ml_dtypes' `float8_e4m3fn` (fixture `fixtures/fp8_rows.*`, written by
//! `fixtures/make_fp8_fixtures.py`), and the pairing rules of [`attach_scales`].

use std::collections::HashMap;
use std::path::Path;

use half::bf16;
use indicatif::ProgressBar;

use super::*;
use crate::loader::hf::weights::read_safetensors;

fn fixture_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/loader/fixtures"))
}

/// The fixture's tensors with FP8 scales attached.
fn load_fixture() -> HashMap<String, HostTensor> {
    let path = fixture_dir().join("fp8_rows.safetensors");
    let (mut tensors, mut codes) = (HashMap::new(), HashMap::new());
    read_safetensors(&path, &mut tensors, &mut codes, &ProgressBar::hidden()).expect("reads");
    attach_scales(fixture_dir(), codes, &mut tensors).expect("scales attach");
    tensors
}

#[test]
fn fp8_rows_decode_as_ml_dtypes_does() {
    let text = std::fs::read_to_string(fixture_dir().join("fp8_rows.json")).expect("json");
    let want: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let tensors = load_fixture();
    let names = want["tensors"].as_object().expect("tensors");
    assert_eq!(names.len(), 3);
    for (name, t) in names {
        let got = &tensors[name];
        let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).expect("shape");
        assert_eq!(got.shape, shape, "{name}");
        let HostData::Fp8(rows) = &got.data else {
            panic!("{name} is not FP8: {:?}", got.data);
        };
        assert_eq!(rows.scales.len(), shape[0], "{name}: one scale a row");
        let bits: Vec<u32> = got.to_f32().iter().map(|v| v.to_bits()).collect();
        let want_bits: Vec<u32> = serde_json::from_value(t["bits"].clone()).expect("bits");
        assert_eq!(bits, want_bits, "{name}");
    }
    assert!(
        !tensors.keys().any(|n| n.ends_with("_scale")),
        "scales are folded into their weights"
    );
    assert!(matches!(tensors["plain.weight"].data, HostData::BF16(_)));
}

#[test]
fn e4m3_edges() {
    assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0xfe), -448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9), "smallest subnormal");
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6), "smallest normal");
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
}

fn fp8(shape: &[usize], codes: Vec<u8>) -> Fp8Codes {
    Fp8Codes {
        shape: shape.to_vec(),
        codes,
    }
}

fn scale(shape: &[usize], values: &[f32]) -> HostTensor {
    HostTensor {
        shape: shape.to_vec(),
        data: HostData::BF16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
    }
}

/// The message [`attach_scales`] gives for one FP8 tensor `w` `[2, 2]` and `others`.
fn attach_error(shape: &[usize], others: Vec<(&str, HostTensor)>) -> String {
    let n: usize = shape.iter().product();
    let codes = HashMap::from([("w".to_string(), fp8(shape, vec![0x38; n]))]);
    let mut tensors: HashMap<String, HostTensor> = others
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    attach_scales(Path::new("m"), codes, &mut tensors)
        .expect_err("refused")
        .to_string()
}

#[test]
fn attach_refuses_what_it_cannot_read() {
    let e = attach_error(&[2, 2], vec![]);
    assert!(e.contains("has no w_scale"), "{e}");
    let e = attach_error(&[2, 2], vec![("w_scale", scale(&[1, 2], &[1.0, 1.0]))]);
    assert!(e.contains("not block or group scales"), "{e}");
    let e = attach_error(&[2, 2], vec![("w_scale", scale(&[2, 1], &[1.0, -1.0]))]);
    assert!(e.contains("finite and non-negative"), "{e}");
    let e = attach_error(&[4], vec![("w_scale", scale(&[1], &[1.0]))]);
    assert!(e.contains("only 2-D weights"), "{e}");
    let e = attach_error(
        &[2, 2],
        vec![
            ("w_scale", scale(&[2, 1], &[1.0, 1.0])),
            ("x.input_scale", scale(&[1], &[1.0])),
        ],
    );
    assert!(e.contains("static activation scales"), "{e}");
    let e = attach_error(
        &[2, 2],
        vec![
            ("w_scale", scale(&[2, 1], &[1.0, 1.0])),
            ("b.weight_scale", scale(&[1], &[1.0])),
        ],
    );
    assert!(
        e.contains("b.weight_scale scales a weight that is not FP8"),
        "{e}"
    );

    let codes = HashMap::from([("w".to_string(), fp8(&[1, 2], vec![0x38, 0x7f]))]);
    let mut tensors = HashMap::from([("w_scale".to_string(), scale(&[1], &[1.0]))]);
    let e = attach_scales(Path::new("m"), codes, &mut tensors).expect_err("NaN code");
    assert!(e.to_string().contains("1 NaN codes"), "{e}");
}

#[test]
fn concat_rows_keeps_each_rows_scale() {
    let a = Fp8Rows {
        codes: vec![0x38, 0x40],
        scales: vec![2.0],
    };
    let b = Fp8Rows {
        codes: vec![0x30, 0x38, 0xb8, 0x00],
        scales: vec![1.0, 0.5],
    };
    let c = Fp8Rows::concat_rows(&[&a, &b]);
    assert_eq!(c.cols(), 2);
    assert_eq!(c.to_f32(), vec![2.0, 4.0, 0.5, 1.0, -0.5, 0.0]);
}
