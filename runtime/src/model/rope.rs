//! Rotary position embedding tables, computed as Hugging Face transformers does for Llama
//! (`_compute_default_rope_parameters`, `_compute_llama3_parameters`), in f32.
//!
//! `inv_freq[j] = 1 / theta^(2j / D)`, optionally rescaled Llama-3.1 style; then
//! `cos[p, j] = cos(p * inv_freq[j])`, `sin[p, j] = sin(p * inv_freq[j])` for `j < D/2`.
//! The backend applies them in `rotate_half` form (see `Backend::rope`).

use super::config::RopeScaling;

/// Inverse frequencies `[D/2]`, with Llama-3.1 scaling applied when given.
pub fn inv_freq(head_dim: usize, theta: f32, scaling: Option<&RopeScaling>) -> Vec<f32> {
    let base: Vec<f32> = (0..head_dim / 2)
        .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
        .collect();
    match scaling {
        None => base,
        Some(s) => base.into_iter().map(|f| llama3_scale(f, s)).collect(),
    }
}

/// Llama-3.1 frequency rescaling: long wavelengths divided by `factor`, short ones kept, the band
/// between interpolated smoothly.
fn llama3_scale(freq: f32, s: &RopeScaling) -> f32 {
    let old_ctx = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_ctx / s.low_freq_factor;
    let high_freq_wavelen = old_ctx / s.high_freq_factor;
    let wavelen = 2.0 * std::f32::consts::PI / freq;
    if wavelen < high_freq_wavelen {
        freq
    } else if wavelen > low_freq_wavelen {
        freq / s.factor
    } else {
        let smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

/// `(cos, sin)`, each `[max_pos, D/2]` f32.
pub fn tables(inv_freq: &[f32], max_pos: usize) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(max_pos * inv_freq.len());
    let mut sin = Vec::with_capacity(max_pos * inv_freq.len());
    for p in 0..max_pos {
        for f in inv_freq {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_follow_the_theta_power_law() {
        let f = inv_freq(8, 10000.0, None);
        let want = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() / b < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_blends_the_middle() {
        // Llama-3.1 8B values.
        let s = RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let base = inv_freq(128, 500000.0, None);
        let scaled = inv_freq(128, 500000.0, Some(&s));
        // Highest frequency (wavelength 2*pi) is kept, lowest divided by the factor.
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[63] - base[63] / 8.0).abs() < 1e-12);
        // Middle band: between freq/8 and freq.
        let mid = base
            .iter()
            .position(|f| {
                let w = 2.0 * std::f32::consts::PI / f;
                w > 2048.0 && w < 8192.0
            })
            .unwrap();
        assert!(scaled[mid] < base[mid] && scaled[mid] > base[mid] / 8.0);
    }
}
