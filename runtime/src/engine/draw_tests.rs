use super::*;

fn spec(temperature: f32) -> DrawSpec {
    DrawSpec {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        bits: 0,
    }
}

/// A small deterministic generator for test inputs (SplitMix64).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// The module's steps written plainly (sort everything, sum in order), to hold the optimised
/// `kept_tokens` to.
fn kept_plainly(logits: &[f32], s: &DrawSpec) -> Option<Vec<(u32, u64)>> {
    let sc: Vec<f32> = logits
        .iter()
        .map(|&l| {
            let v = l / s.temperature;
            if v.is_nan() { f32::NEG_INFINITY } else { v }
        })
        .collect();
    let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return None;
    }
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        order_key(sc[b as usize])
            .cmp(&order_key(sc[a as usize]))
            .then(a.cmp(&b))
    });
    let w = |i: u32| weight(sc[i as usize] - m);
    let k = if s.top_k == 0 {
        order.len()
    } else {
        (s.top_k as usize).min(order.len())
    };
    order.truncate(k);
    if s.top_p < 1.0 {
        let z: u64 = order.iter().map(|&i| w(i)).sum();
        let mut cum = 0u64;
        let cut = order
            .iter()
            .position(|&i| {
                cum += w(i);
                cum as f64 >= s.top_p as f64 * z as f64
            })
            .unwrap_or(order.len() - 1);
        order.truncate(cut + 1);
    }
    let first = order[0];
    let mut kept: Vec<(u32, u64)> = order
        .iter()
        .map(|&i| (i, w(i)))
        .filter(|&(_, wi)| {
            s.min_p <= 0.0 || wi as f64 >= s.min_p as f64 * (1u64 << WEIGHT_BITS) as f64
        })
        .collect();
    if kept.is_empty() {
        kept.push((first, w(first)));
    }
    kept.sort_by_key(|&(i, _)| i);
    Some(kept)
}

#[test]
fn weight_follows_exp_to_its_precision() {
    assert_eq!(weight(0.0), 1 << WEIGHT_BITS);
    assert_eq!(weight(-0.0), 1 << WEIGHT_BITS);
    assert_eq!(weight(f32::NEG_INFINITY), 0);
    assert_eq!(weight(f32::NAN), 0);
    assert_eq!(weight(-28.5), 0, "below 2^-41 of the heaviest");
    assert_eq!(weight(f32::INFINITY), 1 << WEIGHT_BITS);
    assert_eq!(weight(3.0), 1 << WEIGHT_BITS);
    let scale = (1u64 << WEIGHT_BITS) as f64;
    let mut worst = 0.0f64;
    let mut g = Gen(3);
    for k in 0..400_000 {
        // Dense near 0 and across the whole range down to -28.
        let d = if k % 2 == 0 {
            -(k as f32) * 7.0e-5
        } else {
            g.range(-28.0, 0.0)
        };
        let want = (d as f64).exp() * scale;
        let got = weight(d) as f64;
        let err = (got - want).abs() / want;
        if want >= (1u64 << 24) as f64 {
            worst = worst.max(err);
        }
        assert!(
            (got - want).abs() <= 2.0e-6 * want + 1.0,
            "d {d}: {got} vs {want}"
        );
    }
    assert!(worst < 2.0e-6, "worst relative error {worst}");
}

#[test]
fn the_fraction_polynomial_meets_its_ends() {
    assert_eq!(exp2_fraction(0.0), 1.0);
    assert_eq!(exp2_fraction(-1.0), 0.5);
    assert_eq!(exp2_fraction(-0.0), 1.0);
    let mut f = -1.0f32;
    while f <= 0.0 {
        let got = exp2_fraction(f) as f64;
        let want = 2f64.powf(f as f64);
        assert!((got - want).abs() / want < 2.5e-7, "2^{f}: {got} vs {want}");
        f += 1.0e-4;
    }
}

#[test]
fn draw_is_the_inverse_cdf_of_the_kept_weights() {
    let logits = [0.3f32, -1.2, 2.0, 0.0, 1.1, -0.4];
    let s = spec(0.9);
    let kept = kept_tokens(&logits, &s).expect("finite");
    assert_eq!(kept.len(), logits.len());
    let total: u64 = kept.iter().map(|k| k.1).sum();
    let mut before = 0u64;
    for (n, &(token, w)) in kept.iter().enumerate() {
        // The smallest bits whose target reaches `before`: token `token` is drawn there and the
        // token before it one step lower.
        let bits = ((before as u128) << 53).div_ceil(total as u128) as u64;
        assert!(draw_target(bits, total) >= before);
        let with = |bits| draw(&logits, &DrawSpec { bits, ..s });
        assert_eq!(with(bits), token, "token {token} at bits {bits}");
        if n > 0 {
            assert_eq!(with(bits - 1), kept[n - 1].0);
        }
        before += w;
    }
    assert_eq!(
        draw(
            &logits,
            &DrawSpec {
                bits: (1 << 53) - 1,
                ..s
            }
        ),
        5
    );
}

#[test]
fn probabilities_are_the_tempered_softmax() {
    let mut g = Gen(11);
    let logits: Vec<f32> = (0..1000).map(|_| g.range(-8.0, 8.0)).collect();
    let t = 0.8f32;
    let kept = kept_tokens(&logits, &spec(t)).expect("finite");
    let total: u64 = kept.iter().map(|k| k.1).sum();
    let scaled: Vec<f64> = logits.iter().map(|&l| (l / t) as f64).collect();
    let m = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scaled.iter().map(|&x| (x - m).exp()).sum();
    for &(i, w) in &kept {
        let want = (scaled[i as usize] - m).exp() / z;
        let got = w as f64 / total as f64;
        assert!(
            (got - want).abs() <= 3.0e-6 * want + 1.0e-12,
            "token {i}: {got} vs {want}"
        );
    }
}

#[test]
fn top_k_keeps_ties_by_lowest_id() {
    let logits = [1.0f32, 3.0, 3.0, 3.0, 0.0];
    let ids = |s: DrawSpec| -> Vec<u32> {
        kept_tokens(&logits, &s)
            .expect("finite")
            .iter()
            .map(|k| k.0)
            .collect()
    };
    let k = |top_k| DrawSpec { top_k, ..spec(1.0) };
    assert_eq!(ids(k(1)), vec![1]);
    assert_eq!(ids(k(2)), vec![1, 2]);
    assert_eq!(ids(k(4)), vec![0, 1, 2, 3]);
    assert_eq!(ids(k(99)), vec![0, 1, 2, 3, 4]);
    // +0 sorts above -0.
    let zeros = [-0.0f32, 0.0];
    let first = kept_tokens(
        &zeros,
        &DrawSpec {
            top_k: 1,
            ..spec(1.0)
        },
    )
    .expect("finite");
    assert_eq!(first, vec![(1, 1 << WEIGHT_BITS)]);
}

#[test]
fn top_p_keeps_the_shortest_prefix_reaching_its_share() {
    // Four equal weights: 0.5 of the mass is reached by two tokens, a hair more needs three.
    let flat = [0.0f32; 4];
    let ids = |logits: &[f32], s: DrawSpec| -> Vec<u32> {
        kept_tokens(logits, &s)
            .expect("finite")
            .iter()
            .map(|k| k.0)
            .collect()
    };
    let p = |top_p| DrawSpec { top_p, ..spec(1.0) };
    assert_eq!(ids(&flat, p(0.5)), vec![0, 1]);
    assert_eq!(ids(&flat, p(0.500_001)), vec![0, 1, 2]);
    assert_eq!(ids(&flat, p(1.0e-9)), vec![0]);
    // Over the renormalised top-k mass: the top 2 of [3, 3, 0, 0] hold all of it.
    let two = [3.0f32, 3.0, 0.0, 0.0];
    let kp = DrawSpec {
        top_k: 2,
        top_p: 0.75,
        ..spec(1.0)
    };
    assert_eq!(ids(&two, kp), vec![0, 1]);
    // The growing prefix: 1000 equal tokens, 0.9 of them.
    let wide = vec![0.0f32; 1000];
    assert_eq!(ids(&wide, p(0.9)), (0..900).collect::<Vec<u32>>());
}

#[test]
fn min_p_drops_light_tokens_and_never_empties_the_row() {
    // Weights relative to the heaviest: 1, e^-1 (0.37), e^-3 (0.05).
    let logits = [2.0f32, 1.0, -1.0];
    let ids = |min_p| -> Vec<u32> {
        kept_tokens(&logits, &DrawSpec { min_p, ..spec(1.0) })
            .expect("finite")
            .iter()
            .map(|k| k.0)
            .collect()
    };
    assert_eq!(ids(0.2), vec![0, 1]);
    assert_eq!(ids(0.4), vec![0]);
    assert_eq!(ids(1.0), vec![0]);
    assert_eq!(ids(1.5), vec![0], "above 1: the heaviest token stays");
}

#[test]
fn the_min_p_floor_is_the_min_p_comparison() {
    let mut g = Gen(9);
    for k in 0..20_000 {
        let min_p = match k {
            0 => 0.0,
            1 => 1.0,
            2 => 1.5,
            3 => f32::NAN,
            4 => -0.5,
            _ => g.range(0.0, 1.0),
        };
        let floor = min_p_floor(min_p);
        let ws = [
            0,
            1,
            (1 << WEIGHT_BITS) - 1,
            1 << WEIGHT_BITS,
            g.next() >> 24,
        ];
        for w in ws
            .into_iter()
            .chain([floor.saturating_sub(1), floor, floor.saturating_add(1)])
        {
            let w = w.min(1 << WEIGHT_BITS);
            assert_eq!(
                w >= floor,
                passes_min_p(w, min_p),
                "min_p {min_p} w {w} floor {floor}"
            );
        }
    }
}

#[test]
fn non_finite_rows_take_the_argmax() {
    let s = spec(1.0);
    let all_banned = [f32::NEG_INFINITY; 3];
    assert_eq!(kept_tokens(&all_banned, &s), None);
    assert_eq!(draw(&all_banned, &s), 0);
    let inf = [1.0f32, f32::INFINITY, f32::INFINITY];
    assert_eq!(draw(&inf, &s), 1);
    // NaN is never drawn.
    let nan = [f32::NAN, 1.0, f32::NAN];
    for bits in [0, 1 << 52, (1 << 53) - 1] {
        assert_eq!(draw(&nan, &DrawSpec { bits, ..s }), 1);
    }
    // A temperature so small that the scaled logits overflow.
    let tiny = [1.0f32, 2.0, -3.0];
    assert_eq!(draw(&tiny, &spec(1.0e-38)), 1);
}

#[test]
fn kept_tokens_follow_the_plain_steps_on_random_rows() {
    let mut g = Gen(5);
    for case in 0..300 {
        let vocab = 1 + (g.next() % 3000) as usize;
        // Coarse logits make ties; some rows carry banned tokens.
        let coarse = case % 3 == 0;
        let logits: Vec<f32> = (0..vocab)
            .map(|_| {
                let x = g.range(-12.0, 6.0);
                match g.next() % 50 {
                    0 => f32::NEG_INFINITY,
                    _ if coarse => x.round(),
                    _ => x,
                }
            })
            .collect();
        let s = DrawSpec {
            temperature: [0.3, 0.7, 1.0, 1.6][case % 4],
            top_k: [0, 1, 5, 40, 100_000][(g.next() % 5) as usize],
            top_p: [1.0, 0.95, 0.5, 0.1][(g.next() % 4) as usize],
            min_p: [0.0, 0.0, 0.05, 0.3][(g.next() % 4) as usize],
            bits: g.next() >> 11,
        };
        let want = kept_plainly(&logits, &s);
        assert_eq!(kept_tokens(&logits, &s), want, "case {case}: {s:?}");
        if let Some(kept) = want {
            let total: u64 = kept.iter().map(|k| k.1).sum();
            let target = draw_target(s.bits, total);
            let mut cum = 0;
            let token = kept
                .iter()
                .find(|k| {
                    cum += k.1;
                    cum > target
                })
                .map(|k| k.0);
            assert_eq!(Some(draw(&logits, &s)), token, "case {case}");
        }
    }
}

/// Top-p over the whole vocabulary takes a radix select; at a large vocabulary, with many ties at
/// the boundary (coarse and constant rows), one dominant token and a flat row, it keeps what the
/// sorted walk keeps.
#[test]
fn top_p_radix_select_keeps_the_sorted_prefix() {
    let mut g = Gen(11);
    let vocab = 50_000;
    for row in 0..4 {
        let logits: Vec<f32> = (0..vocab)
            .map(|i| match row {
                0 => g.range(-10.0, 10.0),
                1 => (g.range(-6.0, 6.0) * 2.0).round() / 2.0,
                2 => 1.5,
                _ if i == 777 => 25.0,
                _ => g.range(-3.0, 0.0),
            })
            .collect();
        for temperature in [0.5, 1.0, 2.0] {
            for top_p in [0.001, 0.1, 0.5, 0.9, 0.999] {
                for min_p in [0.0, 0.2] {
                    let s = DrawSpec {
                        temperature,
                        top_k: 0,
                        top_p,
                        min_p,
                        bits: g.next() >> 11,
                    };
                    assert_eq!(
                        kept_tokens(&logits, &s),
                        kept_plainly(&logits, &s),
                        "row {row}: {s:?}"
                    );
                }
            }
        }
    }
}

/// Host cost of one draw at Llama-3's vocabulary (random logits in [-10, 10], temperature 1):
/// `cargo test --release -p sov --lib engine::draw::tests::draw_bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn draw_bench() {
    let mut g = Gen(1);
    let logits: Vec<f32> = (0..128_256).map(|_| g.range(-10.0, 10.0)).collect();
    let settings = [
        ("temperature 1", spec(1.0)),
        ("temperature 0.7", spec(0.7)),
        (
            "top-p 0.9",
            DrawSpec {
                top_p: 0.9,
                ..spec(1.0)
            },
        ),
        (
            "top-k 40",
            DrawSpec {
                top_k: 40,
                ..spec(1.0)
            },
        ),
        (
            "min-p 0.05",
            DrawSpec {
                min_p: 0.05,
                ..spec(1.0)
            },
        ),
    ];
    for (name, s) in settings {
        let draws = 100u64;
        let t = std::time::Instant::now();
        let mut check = 0u64;
        for i in 0..draws {
            check ^= draw(&logits, &DrawSpec { bits: i << 40, ..s }) as u64;
        }
        println!(
            "draw, vocab 128256, {name}: {:.1} us (check {check})",
            t.elapsed().as_secs_f64() * 1e6 / draws as f64
        );
    }
}
