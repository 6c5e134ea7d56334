//! How a cuBLASLt algorithm is chosen by timing ([`super::gemm_lt`] keeps the choices).
//!
//! Design: cuBLASLt's heuristic ranks algorithms by a model of the GPU, and its first pick is not
//! always the fastest for a given `(m, n, k)` (as vLLM's and TensorRT-LLM's GEMM autotuners
//! found). The first time a product shape runs outside a stream capture, its caller times the
//! heuristic's first few candidates on the product's own buffers ([`KernelTimer`]) and keeps the
//! fastest, unless the heuristic's own first pick is within [`KEEP_FIRST_MARGIN`] of it: small
//! differences are timing noise, and keeping the first pick then keeps the same algorithm from run
//! to run. Row counts are tuned by class ([`row_class`]), so a run whose batch shrinks step by
//! step times each class once instead of every row count; another row count of a tuned class
//! takes the class's algorithm where cuBLASLt accepts it for that shape.
//!
//! The choice is made by timing, so two processes may choose differently where two candidates are
//! close, and different algorithms round differently. Fast-mode products are not batch-invariant
//! anyway (`--deterministic` pins one algorithm per shape instead); a user who needs the same
//! algorithm in every run sets [`super::CudaTuning::gemm_candidates`] to 1
//! (`SOV_GEMM_CANDIDATES=1`).

use crate::backend::BackendError;

/// How much faster than the heuristic's first pick another candidate must be to replace it.
pub(super) const KEEP_FIRST_MARGIN: f64 = 0.02;

/// Runs of each candidate that are timed together (after one untimed run).
pub(super) const TIMED_RUNS: usize = 3;

/// Times work queued on the backend's stream.
pub(super) trait KernelTimer {
    /// Whether work can be timed now (not while the stream is being captured into a graph).
    fn can_time(&self) -> bool;

    /// Microseconds per run of `run`, queued [`TIMED_RUNS`] times between two events after one
    /// untimed run (waits for the stream).
    fn time_us(
        &self,
        run: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<f64, BackendError>;
}

/// The row-count class a product of `rows` rows is tuned for: the next power of two.
pub(super) fn row_class(rows: usize) -> usize {
    rows.max(1).next_power_of_two()
}

/// Index of the candidate to keep, given each candidate's time (`None`: it failed to run), the
/// heuristic's first pick at index 0: the fastest, unless the first is within
/// [`KEEP_FIRST_MARGIN`] of it. `None` where none ran.
pub(super) fn pick(times_us: &[Option<f64>]) -> Option<usize> {
    let (best, best_us) = times_us
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    match times_us.first().copied().flatten() {
        Some(first) if first * (1.0 - KEEP_FIRST_MARGIN) <= best_us => Some(0),
        _ => Some(best),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pick_stays_unless_another_is_clearly_faster() {
        assert_eq!(pick(&[Some(100.0), Some(99.0), Some(101.0)]), Some(0));
        assert_eq!(pick(&[Some(100.0), Some(97.0), Some(90.0)]), Some(2));
        assert_eq!(pick(&[Some(100.0), Some(98.0)]), Some(0));
        assert_eq!(pick(&[Some(100.0), Some(97.9)]), Some(1));
    }

    #[test]
    fn failed_candidates_are_skipped() {
        assert_eq!(pick(&[None, Some(50.0), Some(40.0)]), Some(2));
        assert_eq!(pick(&[Some(10.0), None]), Some(0));
        assert_eq!(pick(&[None, None]), None);
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn row_classes_are_powers_of_two() {
        assert_eq!(row_class(0), 1);
        assert_eq!(row_class(33), 64);
        assert_eq!(row_class(1000), 1024);
        assert_eq!(row_class(1024), 1024);
        assert_eq!(row_class(1025), 2048);
    }
}
