//! FP8 weights as FP8 checkpoints store them: e4m3 codes with one f32 scale per output row.
//!
//! Design: Hugging Face FP8 checkpoints in the compressed-tensors format (`llm-compressor`'s
//! FP8-dynamic and FP8 schemes) store a linear weight `X.weight` as `F8_E4M3` codes `[rows, cols]`
//! next to `X.weight_scale`: `[rows, 1]` (per output channel) or one value (per tensor). The
//! loader pairs them into one [`Fp8Rows`] ([`attach_scales`]), broadcasting a per-tensor scale to
//! every row, so the model sees one tensor with one dtype. The value of code `c` in row `r` is
//! `e4m3(c) * scales[r]` ([`e4m3_to_f32`] is the OCP `float8_e4m3fn` decoding: bias 7, no
//! infinities, `S.1111.111` is NaN). Backends without FP8 products widen to f32
//! ([`Fp8Rows::to_f32`], exact for bf16 scales: 4 + 8 significant bits fit f32's 24); the CUDA
//! backend uploads codes and scales as they are.

use std::collections::HashMap;
use std::path::Path;

use super::error::LoadError;
use super::tensor::{HostData, HostTensor};

/// An FP8 weight matrix: e4m3 codes and one scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Rows {
    /// `[rows * cols]` `float8_e4m3fn` codes, row-major.
    pub codes: Vec<u8>,
    /// `[rows]` f32: every value of row `r` is multiplied by `scales[r]`.
    pub scales: Vec<f32>,
}

impl Fp8Rows {
    /// Values per row (0 for an empty matrix).
    pub fn cols(&self) -> usize {
        self.codes.len().checked_div(self.scales.len()).unwrap_or(0)
    }

    /// The values as f32, row-major (`e4m3(code) * scale`, one f32 rounding at most).
    pub fn to_f32(&self) -> Vec<f32> {
        let cols = self.cols().max(1);
        self.codes
            .chunks(cols)
            .zip(&self.scales)
            .flat_map(|(row, &s)| row.iter().map(move |&c| e4m3_to_f32(c) * s))
            .collect()
    }

    /// Rows of `parts` one after another (all must have the same number of columns).
    pub fn concat_rows(parts: &[&Fp8Rows]) -> Fp8Rows {
        Fp8Rows {
            codes: parts.iter().flat_map(|p| p.codes.iter().copied()).collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
        }
    }
}

/// The value of a `float8_e4m3fn` code (OCP FP8 E4M3: 1 sign, 4 exponent bits of bias 7, 3
/// mantissa bits; exponent 0 is subnormal; `0x7f` and `0xff` are NaN; no infinities).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0f);
    let man = f32::from(code & 0x07);
    let magnitude = match exp {
        15 if code & 0x07 == 0x07 => return f32::NAN,
        0 => man / 8.0 * 2f32.powi(-6),
        e => (1.0 + man / 8.0) * 2f32.powi(e - 7),
    };
    sign * magnitude
}

/// An `F8_E4M3` tensor as read from a file, before its scale is attached.
#[derive(Debug, Clone)]
pub struct Fp8Codes {
    /// Row-major shape, outermost first.
    pub shape: Vec<usize>,
    /// The codes, row-major.
    pub codes: Vec<u8>,
}

/// Pairs every FP8 tensor `X` of `codes` with its `X_scale` from `tensors` into one
/// [`HostData::Fp8`] tensor under `X`; `dir` names the model in errors. Refuses a missing scale,
/// scales that are neither per row nor per tensor (block or group scales), negative or non-finite
/// scales, NaN codes, static activation scales (`input_scale`) and a `weight_scale` whose weight
/// is not FP8.
pub fn attach_scales(
    dir: &Path,
    codes: HashMap<String, Fp8Codes>,
    tensors: &mut HashMap<String, HostTensor>,
) -> Result<(), LoadError> {
    let bad = |m: String| LoadError::metadata(dir, m);
    let mut names: Vec<String> = codes.keys().cloned().collect();
    names.sort();
    let mut codes = codes;
    for name in names {
        let Some(Fp8Codes { shape, codes }) = codes.remove(&name) else {
            continue;
        };
        let [rows, cols] = shape[..] else {
            return Err(bad(format!(
                "FP8 tensor {name} has shape {shape:?}; only 2-D weights are stored in FP8"
            )));
        };
        if codes.len() != rows * cols {
            return Err(bad(format!(
                "FP8 tensor {name}: {} codes for shape {shape:?}",
                codes.len()
            )));
        }
        let scale_name = format!("{name}_scale");
        let scale = tensors.remove(&scale_name).ok_or_else(|| {
            bad(format!(
                "FP8 tensor {name} has no {scale_name} (sov reads compressed-tensors FP8 \
                 checkpoints: one scale per output row or per tensor)"
            ))
        })?;
        let per_row = scale.numel() == rows && matches!(scale.shape[..], [r] | [r, 1] if r == rows);
        let per_tensor = scale.numel() == 1;
        if !per_row && !per_tensor {
            return Err(bad(format!(
                "{scale_name} has shape {:?}; sov reads per-channel ([{rows}, 1]) or per-tensor \
                 FP8 scales, not block or group scales",
                scale.shape
            )));
        }
        let values = scale.to_f32();
        if let Some(s) = values.iter().find(|s| !s.is_finite() || **s < 0.0) {
            return Err(bad(format!(
                "{scale_name} holds {s}; FP8 scales must be finite and non-negative"
            )));
        }
        let scales = if per_row {
            values
        } else {
            vec![values[0]; rows]
        };
        let nans = codes.iter().filter(|&&c| c & 0x7f == 0x7f).count();
        if nans > 0 {
            return Err(bad(format!("FP8 tensor {name} holds {nans} NaN codes")));
        }
        tensors.insert(
            name,
            HostTensor {
                shape,
                data: HostData::Fp8(Fp8Rows { codes, scales }),
            },
        );
    }
    let mut leftovers: Vec<&String> = tensors
        .keys()
        .filter(|n| n.ends_with(".input_scale") || n.ends_with(".weight_scale"))
        .collect();
    leftovers.sort();
    match leftovers.first() {
        Some(n) if n.ends_with(".input_scale") => Err(bad(format!(
            "{n}: static activation scales are not supported (sov quantizes each token's \
             inputs at run time, the FP8-dynamic scheme)"
        ))),
        Some(n) => Err(bad(format!("{n} scales a weight that is not FP8"))),
        None => Ok(()),
    }
}

#[cfg(test)]
#[path = "fp8_tests.rs"]
mod tests;
