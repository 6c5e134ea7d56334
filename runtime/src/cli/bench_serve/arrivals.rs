//! Request arrival times of the online benchmark, as vLLM `bench serve` draws them: the gap
//! before each request is Gamma(shape = burstiness, scale = 1 / (rate * burstiness)), so the mean
//! rate is `rate` whatever the burstiness; burstiness 1 is a Poisson process (exponential gaps),
//! lower is burstier, higher is more regular. An infinite rate sends every request at once.
//!
//! Design: Marsaglia and Tsang's method ("A simple method for generating gamma variables", ACM
//! TOMS 26(3), 2000) for shape >= 1, with the `U^(1/k)` boost for shape < 1; the normal deviate
//! comes from the Box-Muller transform. Seeded, so a run's schedule is reproducible.

use std::str::FromStr;

use rand::Rng;

/// Target request rate: requests per second, or all at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RequestRate {
    /// Every request is sent at time zero.
    Infinite,
    /// Mean requests per second (> 0).
    PerSecond(f64),
}

impl FromStr for RequestRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("inf") || s.eq_ignore_ascii_case("infinity") {
            return Ok(RequestRate::Infinite);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_infinite() && r > 0.0 => Ok(RequestRate::Infinite),
            Ok(r) if r.is_finite() && r > 0.0 => Ok(RequestRate::PerSecond(r)),
            _ => Err(format!(
                "request rate must be a positive number or 'inf', not '{s}'"
            )),
        }
    }
}

impl std::fmt::Display for RequestRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestRate::Infinite => write!(f, "inf"),
            RequestRate::PerSecond(r) => write!(f, "{r}"),
        }
    }
}

/// Send offsets in seconds from the start of the run, one per request (non-decreasing).
pub fn send_offsets(n: usize, rate: RequestRate, burstiness: f64, rng: &mut impl Rng) -> Vec<f64> {
    let RequestRate::PerSecond(rate) = rate else {
        return vec![0.0; n];
    };
    let shape = if burstiness > 0.0 { burstiness } else { 1.0 };
    let scale = 1.0 / (rate * shape);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            // vLLM sends each request, then sleeps one gap: the first goes out at time zero.
            let now = t;
            t += gamma(shape, scale, rng);
            now
        })
        .collect()
}

/// One Gamma(shape, scale) deviate.
pub fn gamma(shape: f64, scale: f64, rng: &mut impl Rng) -> f64 {
    if shape < 1.0 {
        let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        return gamma(shape + 1.0, scale, rng) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// One standard normal deviate (Box-Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.r#gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Sample mean and variance of `n` Gamma(shape, scale) deviates against shape*scale and
    /// shape*scale^2 (the distribution's moments), within 4 standard errors.
    #[test]
    fn gamma_moments_match_the_distribution() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = 200_000;
        for (shape, scale) in [(0.5, 2.0), (1.0, 0.25), (4.0, 0.1)] {
            let xs: Vec<f64> = (0..n).map(|_| gamma(shape, scale, &mut rng)).collect();
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let (m, v) = (shape * scale, shape * scale * scale);
            assert!(
                (mean - m).abs() < 4.0 * (v / n as f64).sqrt(),
                "{shape} mean {mean} vs {m}"
            );
            // Var of the sample variance: (mu4 - v^2)/n, mu4 = 3 v^2 (1 + 2/shape) for a gamma.
            let se_var = ((3.0 * v * v * (1.0 + 2.0 / shape) - v * v) / n as f64).sqrt();
            assert!((var - v).abs() < 4.0 * se_var, "{shape} var {var} vs {v}");
        }
    }

    #[test]
    fn offsets_keep_the_mean_rate_and_inf_sends_at_once() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let t = send_offsets(20_001, RequestRate::PerSecond(4.0), 0.5, &mut rng);
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        let rate = 20_000.0 / t[20_000];
        assert!((rate - 4.0).abs() < 0.2, "rate {rate}");
        assert_eq!(
            send_offsets(3, RequestRate::Infinite, 1.0, &mut rng),
            vec![0.0; 3]
        );
        assert_eq!("inf".parse::<RequestRate>(), Ok(RequestRate::Infinite));
        assert_eq!("2".parse::<RequestRate>(), Ok(RequestRate::PerSecond(2.0)));
        assert!("0".parse::<RequestRate>().is_err() && "x".parse::<RequestRate>().is_err());
    }
}
