//! Summary statistics of a benchmark run, with vLLM `bench serve`'s definitions: TTFT (submit to
//! first token), TPOT (per request: (latency - TTFT) / (output tokens - 1)), ITL (every gap
//! between consecutive tokens), each as mean, median and p99 in milliseconds. Shared by the
//! offline bench and the online one (`sov bench --url`).
//!
//! Design: numpy's definitions, which vLLM's `bench serve` calls (`np.mean`, `np.median`,
//! `np.percentile` with its default linear interpolation between closest ranks); the tests check
//! them against a fixture numpy wrote (runtime/bench/percentile_fixture.py).

use std::time::Duration;

use serde::Serialize;

/// Mean, median and 99th percentile, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Mean, in milliseconds.
    pub mean_ms: f64,
    /// Median (50th percentile, interpolated), in milliseconds.
    pub median_ms: f64,
    /// 99th percentile (interpolated), in milliseconds.
    pub p99_ms: f64,
}

/// Percentile `p` (0..=100) of sorted `v` with linear interpolation (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Summary of durations.
pub fn summarize(values: &[Duration]) -> Summary {
    let ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    summarize_ms(ms)
}

/// Summary of values already in milliseconds (any order); all zero when there are none.
pub fn summarize_ms(mut ms: Vec<f64>) -> Summary {
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return Summary::default();
    }
    Summary {
        mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
        median_ms: percentile(&ms, 50.0),
        p99_ms: percentile(&ms, 99.0),
    }
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy() {
        // numpy.percentile([1, 2, 3, 4], [50, 99]) == [2.5, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        let s = summarize(&[
            Duration::from_millis(3),
            Duration::from_millis(1),
            Duration::from_millis(2),
        ]);
        assert_eq!((s.mean_ms, s.median_ms), (2.0, 2.0));
        assert!(peak_rss_bytes().is_some_and(|b| b > 0));
    }

    /// Against numpy's mean, median and percentile (default 'linear' method) on the inputs of
    /// bench_stats_fixture.json, which runtime/bench/percentile_fixture.py writes with numpy.
    #[test]
    fn percentiles_match_numpy_fixture() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("bench_stats_fixture.json")).expect("fixture");
        let cases = fixture["cases"].as_array().expect("cases");
        assert!(cases.len() >= 5);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        for case in cases {
            let values: Vec<f64> = serde_json::from_value(case["values"].clone()).expect("values");
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let pcts: Vec<(f64, f64)> =
                serde_json::from_value(case["percentiles"].clone()).expect("percentiles");
            for (p, want) in pcts {
                let got = percentile(&sorted, p);
                assert!(
                    close(got, want),
                    "p{p} of {} values: {got} vs numpy {want}",
                    values.len()
                );
            }
            let s = summarize_ms(values.clone());
            let (mean, median) = (
                case["mean"].as_f64().expect("mean"),
                case["median"].as_f64().expect("median"),
            );
            assert!(
                close(s.mean_ms, mean) && close(s.median_ms, median),
                "{s:?}"
            );
            assert!(close(s.p99_ms, percentile(&sorted, 99.0)));
        }
    }
}
