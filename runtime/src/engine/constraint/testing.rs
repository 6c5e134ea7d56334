//! Test helpers for constrained decoding: drive a [`TokenConstraint`] with seeded random logits
//! until its grammar is finished, checking at every step that some token is allowed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ConstraintError, TokenConstraint};

/// What one random run produced.
pub(crate) struct Drive {
    /// The committed tokens, in order.
    pub tokens: Vec<u32>,
    /// Whether the grammar reported finished within the step limit.
    pub finished: bool,
    /// The allowed-token flags before each step (`masks[i]` is before `tokens[i]`), when asked.
    pub masks: Vec<Vec<bool>>,
}

/// Samples the argmax of uniform random logits (a uniform pick among the allowed tokens) at
/// most `max_steps` times, stopping when the grammar is finished or an end-of-sequence token
/// (`eos`) is picked. `bias` is added to each logit before masking (test-chosen steering).
pub(crate) fn drive_random(
    c: &mut TokenConstraint,
    model_vocab: usize,
    eos: &[u32],
    seed: u64,
    max_steps: usize,
    bias: &dyn Fn(u32) -> f32,
    keep_masks: bool,
) -> Result<Drive, ConstraintError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Drive {
        tokens: Vec::new(),
        finished: false,
        masks: Vec::new(),
    };
    let mut logits = vec![0f32; model_vocab];
    for _ in 0..max_steps {
        if c.is_finished() {
            out.finished = true;
            return Ok(out);
        }
        for (id, l) in logits.iter_mut().enumerate() {
            *l = rng.r#gen::<f32>() + bias(id as u32);
        }
        if keep_masks {
            out.masks.push(c.allowed_tokens()?);
        }
        c.mask_logits(&mut logits)?;
        let (best, &v) = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .ok_or(ConstraintError::DeadEnd)?;
        assert!(v.is_finite(), "mask forbade every token before finished");
        let best = best as u32;
        c.commit(best)?;
        out.tokens.push(best);
        if eos.contains(&best) {
            out.finished = true;
            return Ok(out);
        }
    }
    out.finished = c.is_finished();
    Ok(out)
}
