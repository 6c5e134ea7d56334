//! The random draw of a sampled token, specified to the bit so that the host and an accelerator
//! make the same choice from the same logits and the same random bits.
//!
//! Design: a float sum depends on its order, so two implementations that sum probabilities in
//! different orders (a sequential host loop, a parallel reduction on a GPU) can part on a token
//! near a boundary of the cumulative distribution. Here every float operation is one IEEE-754
//! operation on single values (no sums, no fused multiply-add, no library `exp`), and every sum is
//! an integer sum, which any order computes alike:
//!
//! 1. `s = logit / temperature` (f32 division); NaN counts as -inf. `m` = the largest `s`. When
//!    `m` is not finite, the draw is the lowest id whose `s` is `m`.
//! 2. Each token's weight is `exp(s - m)` in fixed point, [`weight`]: `x = (s - m) * log2(e)` in f32,
//!    clamped to -41, split into its integer part `t` (toward zero) and `f = x - t`, `2^f` from a
//!    degree-6 polynomial in f32 Horner steps (max relative error 1.9e-7 on (-1, 0]), then
//!    `floor(2^f * 2^24) * 2^(16 + t)`, truncated, by integer shifts. The largest token weighs exactly `2^40`, and a weight is 0 below
//!    `2^-41` of it (so a vocabulary below `2^24` tokens sums within a u64).
//! 3. Sorted order: `s` descending (compared as order-preserving u32 keys, so -0 sorts below +0),
//!    ties by ascending id. top-k keeps the first `k` of that order; top-p then keeps the shortest
//!    prefix of those whose weight sum `c` reaches the target, `c as f64 >= top_p as f64 * z as f64`
//!    with `z` the weight of the top-k set; min-p keeps tokens whose weight, as f64, is at least
//!    `min_p as f64 * 2^40`.
//! 4. With `S` the weight of the kept tokens and `b` the request's 53 random bits, the target is
//!    `(b * S) >> 53` (a 117-bit product), and the draw is the lowest id (of the kept tokens, in
//!    id order) whose inclusive weight sum exceeds it. When min-p keeps nothing (a min-p above
//!    1), the first token of the sorted order is the one kept token.
//!
//! The chosen token is a sample of `softmax(logits / temperature)` restricted as Hugging Face's
//! warpers restrict it (temperature, top-k, top-p on the renormalised top-k mass, min-p), within
//! the weights' precision. `draw_tokens` in `kernels/cuda/sampling.cu` implements the same steps on
//! the GPU; [`DRAW_RULE`] names this rule in signed heads.

use std::cmp::Ordering;

/// A sampled row's parameters and its random bits: everything the draw reads besides the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawSpec {
    /// Divides the logits; > 0 (a greedy row never draws).
    pub temperature: f32,
    /// Keep the `top_k` first tokens of the sorted order; 0 keeps all.
    pub top_k: u32,
    /// Keep the shortest sorted prefix holding this share of the top-k weight; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens lighter than `min_p` times the heaviest; 0 keeps all.
    pub min_p: f32,
    /// 53 random bits: the request's uniform number for this token, times `2^53`.
    pub bits: u64,
}

/// This rule's name in signed heads (`sov-sampler`): a change to any step of the draw takes a
/// new name, so an audit knows when sampled tokens were drawn by another rule.
pub const DRAW_RULE: &str = "draw-1";

/// Fixed-point scale of the weights: the heaviest token weighs `1 << WEIGHT_BITS`.
pub const WEIGHT_BITS: u32 = 40;

/// Vocabularies this draw takes: their weight sums fit a u64.
pub const MAX_DRAW_VOCAB: usize = 1 << 23;

/// `log2(e)` rounded to f32.
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);

/// `2^f` on (-1, 0]: coefficients of f^6 down to f^1 (the constant is 1), fitted at 400 Chebyshev
/// nodes and rounded to f32.
const EXP2_POLY: [u32; 6] = [
    0x38e5_66fb,
    0x3aa7_35ef,
    0x3c1c_f5ad,
    0x3d63_4a91,
    0x3e75_fd60,
    0x3f31_7216,
];

/// `2^f` for f in (-1, 0], in f32 Horner steps without fused multiply-adds: in [0.5, 1].
fn exp2_fraction(f: f32) -> f32 {
    let mut acc = f32::from_bits(EXP2_POLY[0]);
    for c in &EXP2_POLY[1..] {
        acc = acc * f + f32::from_bits(*c);
    }
    acc * f + 1.0
}

/// The fixed-point weight of a token `d = s - m` (<= 0, or -inf) below the heaviest: `exp(d)`
/// scaled by `2^40` and truncated, 0 below `2^-41` (and for -inf or NaN; a positive `d` weighs
/// `2^40`). Branch-free, so the weights loop vectorizes: `x` is clamped to [-41, 0] (at -41 every
/// weight truncates to 0), and the scaling by `2^(16 + t)` is one right shift of `2^f * 2^48` by
/// `8 - t` (8..=49).
pub fn weight(d: f32) -> u64 {
    let x = d * LOG2E;
    let x = if x > -41.0 { x } else { -41.0 }; // NaN -> -41
    let x = if x < 0.0 { x } else { 0.0 }; // d > 0 (no token is above the largest) -> 0
    // SAFETY: x is in [-41, 0], so it is finite and its integer part fits an i32.
    let t: i32 = unsafe { x.to_int_unchecked() }; // toward zero: -41..=0
    let f = x - t as f32; // (-1, 0], exact
    // SAFETY: f is in (-1, 0], where the polynomial stays within [0.49, 1.01] (tested), so
    // the product is finite and within a u32.
    let m: u32 = unsafe { (exp2_fraction(f) * 16_777_216.0).to_int_unchecked() };
    ((m as u64) << 24) >> ((8 - t) as u32)
}

/// Order-preserving map of an f32 to a u32 (a larger float gives a larger key).
pub fn order_key(x: f32) -> u32 {
    let u = x.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

/// `logit / temperature`, NaN counted as -inf.
fn scaled(logit: f32, temperature: f32) -> f32 {
    let s = logit / temperature;
    if s.is_nan() { f32::NEG_INFINITY } else { s }
}

/// Sorted order: key descending, then id ascending.
fn sorted_order(a: &(u32, u32), b: &(u32, u32)) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The `n` first `(key, id)` pairs of `keys` in sorted order.
fn sorted_prefix(keys: &[u32], n: usize) -> Vec<(u32, u32)> {
    let mut all: Vec<(u32, u32)> = keys
        .iter()
        .enumerate()
        .map(|(i, &k)| (k, i as u32))
        .collect();
    let n = n.min(all.len());
    if n < all.len() && n > 0 {
        all.select_nth_unstable_by(n - 1, sorted_order);
        all.truncate(n);
    }
    all.sort_unstable_by(sorted_order);
    all
}

/// Whether `w` passes min-p (`min_p` <= 0 passes everything): `w as f64 >= min_p as f64 * 2^40`.
fn passes_min_p(w: u64, min_p: f32) -> bool {
    min_p <= 0.0 || w as f64 >= min_p as f64 * (1u64 << WEIGHT_BITS) as f64
}

/// The least weight that passes min-p: [`passes_min_p`] as one integer comparison, `w >= floor`
/// (a weight is at most `2^40`, so `w as f64` is exact and the two agree).
fn min_p_floor(min_p: f32) -> u64 {
    if min_p <= 0.0 {
        return 0;
    }
    let threshold = min_p as f64 * (1u64 << WEIGHT_BITS) as f64;
    if threshold.is_nan() || threshold > (1u64 << 62) as f64 {
        u64::MAX
    } else {
        threshold.ceil() as u64
    }
}

/// `(bits * total) >> 53`: the target weight sum of the draw, below `total`.
pub fn draw_target(bits: u64, total: u64) -> u64 {
    ((bits as u128 * total as u128) >> 53) as u64
}

/// The largest scaled logit of `logits` at `temperature` (NaN counted as -inf): the largest
/// logit scaled, as division by a positive number is monotone under rounding.
fn largest(logits: &[f32], temperature: f32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max); // NaN never wins
    scaled(max, temperature)
}

/// Each logit's weight below `m` at temperature `t`, 0 below `floor` (min-p, [`min_p_floor`]),
/// into `out` (same length as `logits`).
fn weights_into(logits: &[f32], t: f32, m: f32, floor: u64, out: &mut [u64]) {
    for (w, &l) in out.iter_mut().zip(logits) {
        let x = weight(scaled(l, t) - m);
        *w = if x >= floor { x } else { 0 };
    }
}

/// [`weights_into`] compiled for AVX2, where LLVM vectorizes the same single IEEE operations
/// (it never fuses or reorders them), so the weights are the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weights_into_avx2(logits: &[f32], t: f32, m: f32, floor: u64, out: &mut [u64]) {
    weights_into(logits, t, m, floor, out)
}

/// [`weights_into`] on the widest instructions this CPU has.
fn weights(logits: &[f32], t: f32, m: f32, min_p: f32) -> Vec<u64> {
    let mut out = vec![0u64; logits.len()]; // [vocab]
    let floor = min_p_floor(min_p);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { weights_into_avx2(logits, t, m, floor, &mut out) };
        return out;
    }
    weights_into(logits, t, m, floor, &mut out);
    out
}

/// The shortest prefix of the sorted order (key descending, id ascending) whose weight sum `c`
/// reaches `goal` (`c as f64 >= goal`), as `(id, weight)` in id order, for `keys` and `weights`
/// (`[vocab]` each; the weights fall as the keys do). A radix select, with no sort: three passes
/// find the boundary key `K` digit by digit (11, 11 and 10 bits), each summing the weights of the
/// tokens still in question by digit and walking the digits from the top until the sum reaches
/// `goal`; every token above `K` is in the prefix, and the tokens at `K` (ties, in id order) join
/// until the sum reaches `goal`. Integer sums make the result that of the sorted walk.
fn top_p_prefix(keys: &[u32], weights: &[u64], goal: f64) -> Vec<(u32, u64)> {
    const LEVELS: [(u32, u32); 3] = [(21, 11), (10, 11), (0, 10)]; // (shift, width) of each digit
    let mut prefix = 0u32; // the boundary key's digits found so far, in place
    let mut high_mask = 0u32; // the bits of `prefix` that are set
    let mut above = 0u64; // weight of the tokens whose key is above the boundary's range
    for (shift, width) in LEVELS {
        let digits = 1usize << width;
        let mut sums = vec![0u64; digits]; // [digits] weight of the candidates with each digit
        let mut counts = vec![0u32; digits]; // [digits] how many candidates have it
        for (&k, &w) in keys.iter().zip(weights) {
            if k & high_mask == prefix {
                let d = ((k >> shift) as usize) & (digits - 1);
                sums[d] += w;
                counts[d] += 1;
            }
        }
        // The first non-empty digit from the top whose sum takes `above` to the goal; one
        // exists, since all candidates together reach it (the weights' total is at least goal).
        let mut boundary = 0;
        for d in (0..digits).rev() {
            if counts[d] == 0 {
                continue;
            }
            boundary = d;
            if (above + sums[d]) as f64 >= goal {
                break;
            }
            above += sums[d];
        }
        prefix |= (boundary as u32) << shift;
        high_mask |= ((digits - 1) as u32) << shift;
    }
    let mut kept = Vec::new();
    let mut ties = above; // the sum so far, as the ties at the boundary key join in id order
    let mut first_tie = true;
    for (i, (&k, &w)) in keys.iter().zip(weights).enumerate() {
        if k > prefix || (k == prefix && (first_tie || (ties as f64) < goal)) {
            kept.push((i as u32, w));
            if k == prefix {
                ties += w;
                first_tie = false;
            }
        }
    }
    kept
}

/// The draw over the whole vocabulary (no top-k, no top-p; min-p applied): the weights once,
/// then the walk to the target.
fn draw_all(logits: &[f32], spec: &DrawSpec, m: f32) -> Option<u32> {
    let weights = weights(logits, spec.temperature, m, spec.min_p); // [vocab]
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let target = draw_target(spec.bits, total);
    let mut cum = 0u64;
    weights
        .iter()
        .position(|&w| {
            cum += w;
            cum > target
        })
        .map(|i| i as u32)
}

/// The tokens the draw may choose for `logits` (`[vocab]`) and `spec`, with their weights, in
/// id order (never empty for a non-empty row: when min-p keeps nothing, the first token of the
/// sorted order); None when the largest scaled logit is not finite (the draw is then an argmax).
pub fn kept_tokens(logits: &[f32], spec: &DrawSpec) -> Option<Vec<(u32, u64)>> {
    let t = spec.temperature;
    let m = largest(logits, t);
    if !m.is_finite() {
        return None;
    }
    let w = |l: f32| weight(scaled(l, t) - m);
    let n = logits.len();
    let top_k = match spec.top_k as usize {
        0 => n,
        k => k.min(n),
    };
    let keys = || -> Vec<u32> { logits.iter().map(|&l| order_key(scaled(l, t))).collect() }; // [vocab]
    let mut kept: Vec<(u32, u64)> = Vec::new();
    if top_k == n && spec.top_p >= 1.0 {
        kept = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, w(l)))
            .filter(|&(_, w)| passes_min_p(w, spec.min_p))
            .collect();
    } else if spec.top_p >= 1.0 {
        kept = sorted_prefix(&keys(), top_k)
            .into_iter()
            .map(|(_, i)| (i, w(logits[i as usize])))
            .filter(|&(_, w)| passes_min_p(w, spec.min_p))
            .collect();
    } else if top_k == n {
        // Top-p over the whole vocabulary: the prefix found by a radix select of the keys.
        let weights = weights(logits, t, m, 0.0); // [vocab]
        let z: u64 = weights.iter().sum();
        kept = top_p_prefix(&keys(), &weights, spec.top_p as f64 * z as f64);
        kept.retain(|&(_, w)| passes_min_p(w, spec.min_p));
    } else {
        // The top-k set in sorted order and its weight, then its shortest prefix reaching top_p
        // of that weight.
        let sorted = sorted_prefix(&keys(), top_k);
        let z: u64 = sorted.iter().map(|&(_, i)| w(logits[i as usize])).sum();
        let goal = spec.top_p as f64 * z as f64;
        let mut cum = 0u64;
        for &(_, i) in &sorted {
            let wi = w(logits[i as usize]);
            cum += wi;
            kept.push((i, wi));
            if cum as f64 >= goal {
                break;
            }
        }
        kept.retain(|&(_, w)| passes_min_p(w, spec.min_p));
    }
    if kept.is_empty()
        && let Some(&(_, first)) = sorted_prefix(&keys(), 1).first()
    {
        kept.push((first, w(logits[first as usize])));
    }
    kept.sort_unstable_by_key(|&(i, _)| i);
    Some(kept)
}

/// The token drawn from `logits` (`[vocab]`) for `spec` (the steps in this module's doc).
pub fn draw(logits: &[f32], spec: &DrawSpec) -> u32 {
    let m = largest(logits, spec.temperature);
    let whole = spec.top_k == 0 || spec.top_k as usize >= logits.len();
    if m.is_finite()
        && whole
        && spec.top_p >= 1.0
        && let Some(token) = draw_all(logits, spec, m)
    {
        return token;
    }
    let Some(kept) = kept_tokens(logits, spec) else {
        let m = largest(logits, spec.temperature);
        return logits
            .iter()
            .position(|&l| scaled(l, spec.temperature) == m)
            .unwrap_or(0) as u32;
    };
    let total: u64 = kept.iter().map(|&(_, w)| w).sum();
    let target = draw_target(spec.bits, total);
    let mut cum = 0u64;
    for &(i, w) in &kept {
        cum += w;
        if cum > target {
            return i;
        }
    }
    kept.last().map_or(0, |&(i, _)| i)
}

#[cfg(test)]
#[path = "draw_tests.rs"]
mod tests;
