//! Property tests: for random slot words, random predicate answers and random action failures,
//! `step()` never panics, never leaves the machine's states, and a failed action leaves the
//! state unchanged; over the run every state (the validator rejects unreachable ones) is reached.

use std::cell::Cell;
use std::collections::HashSet;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::scheduler::{Actions, Guards, Machine, Slots, laptop, seed};

/// Answers every predicate from a random bit stream; fails actions at random.
struct Chaos {
    bits: Cell<u64>,
    fail_rate: u8,
    failed: bool,
}

impl Chaos {
    fn next(&self) -> u64 {
        // xorshift64*
        let mut x = self.bits.get() | 1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.bits.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn coin(&self) -> bool {
        self.next() & 1 == 1
    }
    fn act(&mut self) -> Result<(), Failed> {
        self.failed = (self.next() % 256) < u64::from(self.fail_rate);
        if self.failed { Err(Failed) } else { Ok(()) }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("random failure")]
struct Failed;

impl Actions for Chaos {
    type Error = Failed;
    fn admit(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn prefill(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn mixed_step(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn decode(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn draft(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn verify(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn preempt(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn swap_out(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn swap_in(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn checkpoint(&mut self) -> Result<(), Failed> {
        self.act()
    }
    fn restore(&mut self) -> Result<(), Failed> {
        self.act()
    }
}

impl Guards for Chaos {
    fn can_admit(&self) -> bool {
        self.coin()
    }
    fn has_unprefilled(&self) -> bool {
        self.coin()
    }
    fn has_running(&self) -> bool {
        self.coin()
    }
    fn mix_prefill(&self) -> bool {
        self.coin()
    }
    fn all_finished(&self) -> bool {
        self.coin()
    }
    fn kv_exhausted(&self) -> bool {
        self.coin()
    }
    fn has_swapped(&self) -> bool {
        self.coin()
    }
    fn can_swap_in(&self) -> bool {
        self.coin()
    }
}

/// Random slot words: mostly small (so guards over counters and enums take both branches),
/// sometimes anything (so out-of-range enums and huge counters are covered).
fn words() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![4 => 0u32..6, 1 => any::<u32>()], 32)
}

fn chaos_run<M: Machine>(cases: u32) -> HashSet<&'static str> {
    let reached = std::cell::RefCell::new(HashSet::new());
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(words(), 1..40),
        any::<u64>(),
        0u8..64,
        any::<u32>(),
    );
    runner
        .run(&strategy, |(rounds, seed_bits, fail_rate, start)| {
            let slots = Slots::new();
            let mut m = M::new();
            let names = M::STATE_NAMES;
            let start = names[start as usize % names.len()];
            m.set_state_by_name(start).expect("listed state");
            let mut rt = Chaos {
                bits: Cell::new(seed_bits),
                fail_rate,
                failed: false,
            };
            for words in rounds {
                let mut raw = [0u32; 32];
                for (dst, src) in raw.iter_mut().zip(&words) {
                    *dst = *src;
                }
                slots.load_raw(&raw);
                let before = m.state();
                match m.step(&mut rt, &slots) {
                    Ok(t) => {
                        prop_assert_eq!(t.from, before);
                        prop_assert_eq!(t.to, m.state());
                    }
                    Err(_) => {
                        prop_assert!(rt.failed);
                        prop_assert_eq!(m.state(), before);
                    }
                }
                prop_assert!(names.contains(&m.state_name()));
                reached.borrow_mut().insert(m.state_name());
            }
            Ok(())
        })
        .map_err(|e| format!("{e}"))
        .expect("step never panics and keeps its invariants");
    reached.into_inner()
}

/// From the initial state only, with well-behaved random slots: every state is reached.
fn reach_from_initial<M: Machine>() -> HashSet<&'static str> {
    let mut reached = HashSet::new();
    for seed_bits in 1..400u64 {
        let slots = Slots::new();
        let mut m = M::new();
        let mut rt = Chaos {
            bits: Cell::new(seed_bits.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            fail_rate: 0,
            failed: false,
        };
        reached.insert(m.state_name());
        for _ in 0..60 {
            let r = rt.next();
            slots.set_pending_request_count((r % 3) as u32);
            slots.set_speculative_draft_len(((r >> 8) % 2) as u32);
            slots.set_tokens_generated(((r >> 16) % 70) as u32);
            slots.set_word(5, ((r >> 24) % 8) as u32);
            if m.step(&mut rt, &slots).is_ok() {
                reached.insert(m.state_name());
            }
        }
    }
    reached
}

fn all_states<M: Machine>() -> HashSet<&'static str> {
    M::STATE_NAMES.iter().copied().collect()
}

#[test]
fn seed_step_never_panics_on_random_inputs() {
    let reached = chaos_run::<seed::Scheduler>(256);
    assert_eq!(reached, all_states::<seed::Scheduler>());
}

#[test]
fn laptop_step_never_panics_on_random_inputs() {
    let reached = chaos_run::<laptop::Scheduler>(256);
    assert_eq!(reached, all_states::<laptop::Scheduler>());
}

#[test]
fn every_state_is_reached_from_the_initial_state() {
    assert_eq!(
        reach_from_initial::<seed::Scheduler>(),
        all_states::<seed::Scheduler>()
    );
    assert_eq!(
        reach_from_initial::<laptop::Scheduler>(),
        all_states::<laptop::Scheduler>()
    );
}
