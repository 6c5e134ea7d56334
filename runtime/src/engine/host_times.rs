//! Where the engine thread spends a decode step outside the forward pass: the host work during
//! which an accelerator waits for its next batch. Four clock reads per step, summed over the run;
//! `sov bench` prints them per step.

use std::time::Duration;

/// Host time of decode steps, by phase, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeHostTimes {
    /// Decode steps counted.
    pub steps: u64,
    /// Before the forward pass: the preemption check, block-table growth, the batch's chunk list
    /// and how each row's token is chosen.
    pub schedule: Duration,
    /// After it: checking the model's answer, sampling, detokenizing, stop checks, queuing events.
    pub tokens: Duration,
    /// Retiring finished sequences (blocks, journal) and handing the step's events over for
    /// delivery (waiting for the previous step's to be delivered).
    pub retire: Duration,
    /// Host work handed to the next forward pass (text and events of overlapped decode steps,
    /// `EngineConfig::overlap_host`): on a GPU it runs while the pass computes, so it is not part
    /// of [`Self::total`], the time the accelerator waits. A model without an asynchronous launch
    /// (the trait's default, e.g. the tensor-parallel runner) runs it after the pass, where it
    /// does not overlap but is still counted here.
    pub overlapped: Duration,
    /// Decode steps launched before the tokens of the step before them came back
    /// (`EngineConfig::decode_ahead`): for those, the three phases ran while a step computed.
    pub ahead: u64,
}

impl DecodeHostTimes {
    /// The three phases together.
    pub fn total(&self) -> Duration {
        self.schedule + self.tokens + self.retire
    }

    /// What was added since `earlier` (a copy taken from the same engine).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            steps: self.steps.saturating_sub(earlier.steps),
            schedule: self.schedule.saturating_sub(earlier.schedule),
            tokens: self.tokens.saturating_sub(earlier.tokens),
            retire: self.retire.saturating_sub(earlier.retire),
            overlapped: self.overlapped.saturating_sub(earlier.overlapped),
            ahead: self.ahead.saturating_sub(earlier.ahead),
        }
    }

    /// Mean microseconds per step of `d` (0 without steps).
    pub fn per_step_us(&self, d: Duration) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            d.as_secs_f64() * 1e6 / self.steps as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_and_per_step() {
        let ms = Duration::from_millis;
        let a = DecodeHostTimes {
            steps: 2,
            schedule: ms(1),
            tokens: ms(2),
            retire: ms(3),
            overlapped: ms(1),
            ahead: 1,
        };
        let b = DecodeHostTimes {
            steps: 6,
            schedule: ms(5),
            tokens: ms(10),
            retire: ms(3),
            overlapped: ms(4),
            ahead: 3,
        };
        let d = b.since(&a);
        assert_eq!(d.steps, 4);
        assert_eq!(d.total(), ms(12));
        assert_eq!(d.overlapped, ms(3));
        assert_eq!(d.ahead, 2);
        assert_eq!(d.per_step_us(d.tokens), 2000.0);
        assert_eq!(DecodeHostTimes::default().per_step_us(ms(1)), 0.0);
    }
}
