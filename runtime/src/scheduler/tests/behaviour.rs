//! Behaviour of the generated schedulers on the recording runtime:
//! idle -> prefill (admission with KV allocation, counter reset) -> generate, one checkpoint and
//! one receipt-height bump per `checkpoint_every` decode steps, back to idle when done; a power
//! event at any step -> checkpoint -> (wait) -> resume -> restore -> prefill. Every expectation
//! is derived from the machine's constants, so editing `checkpoint_every` in a spec changes the
//! trace these tests check, not the tests.

use std::path::Path;

use super::world::World;
use crate::scheduler::{Action, Cause, Machine, PowerState, Slots, Transition, laptop, seed};

const PROMPT: u32 = 10;
const MAX_NEW: u32 = 200;
const STEP_CAP: usize = 10_000;

fn every<M: Machine>() -> u32 {
    let v = M::constant("checkpoint_every").expect("machines define checkpoint_every");
    u32::try_from(v).expect("checkpoint_every is a small positive number")
}

fn world<M: Machine>(total_blocks: u32) -> World {
    let block = M::constant("block_size").expect("machines define block_size");
    World::new(
        Slots::new(),
        u32::try_from(block).expect("block_size fits u32"),
        total_blocks,
    )
}

fn step<M: Machine>(m: &mut M, w: &mut World) -> Transition<M::State> {
    let slots = w.slots.clone();
    m.step(w, &slots).expect("no failure injected")
}

/// Steps until the machine is idle with nothing left to do; returns the transitions taken.
fn run_to_idle<M: Machine>(m: &mut M, w: &mut World) -> Vec<Transition<M::State>> {
    let mut trace = Vec::new();
    for _ in 0..STEP_CAP {
        if m.state_name() == "idle" && guards_all_finished(w) && !trace.is_empty() {
            return trace;
        }
        trace.push(step(m, w));
    }
    panic!(
        "{} did not finish within {STEP_CAP} steps; state {}",
        M::NAME,
        m.state_name()
    );
}

fn guards_all_finished(w: &World) -> bool {
    crate::scheduler::Guards::all_finished(w)
}

/// The expected action sequence for one request: admit, prefill (first token), then one decode
/// per further token with a checkpoint after every `every`-th decode.
fn expected_single_request_log(every: u32) -> Vec<Action> {
    let mut log = vec![Action::Admit, Action::Prefill];
    for decode in 1..MAX_NEW {
        log.push(Action::Decode);
        if decode % every == 0 {
            log.push(Action::Checkpoint);
        }
    }
    log
}

fn single_request<M: Machine>() {
    let every = every::<M>();
    let mut w = world::<M>(1024);
    let mut m = M::new();
    assert_eq!(m.state_name(), "idle");
    // Nothing waiting: idle stays and does nothing.
    assert!(step(&mut m, &mut w).is_noop());
    w.slots.set_tokens_generated(7);
    w.submit(PROMPT, MAX_NEW);

    let trace = run_to_idle(&mut m, &mut w);

    let names = |t: &Transition<M::State>| (format!("{:?}", t.from), format!("{:?}", t.to));
    assert_eq!(names(&trace[0]), ("Idle".into(), "Prefill".into()));
    assert_eq!(trace[0].actions, vec![Action::Admit]);
    assert_eq!(trace[0].updates, vec!["tokens_generated = 0"]);
    assert_eq!(names(&trace[1]), ("Prefill".into(), "Generate".into()));
    assert_eq!(trace[1].actions, vec![Action::Prefill]);
    let last = trace.last().expect("non-empty trace");
    assert_eq!(names(last), ("Generate".into(), "Idle".into()));
    assert!(last.actions.is_empty());

    assert_eq!(w.log, expected_single_request_log(every), "{}", M::NAME);
    let checkpoints = (MAX_NEW - 1) / every;
    assert_eq!(w.count(Action::Checkpoint), checkpoints as usize);
    assert_eq!(w.slots.bft_quorum_height(), checkpoints);
    assert_eq!(w.slots.tokens_generated(), (MAX_NEW - 1) % every);
    // Every checkpoint goes generate -> checkpoint -> generate and bumps the height once.
    for (i, t) in trace.iter().enumerate() {
        if t.actions.contains(&Action::Checkpoint) {
            assert_eq!(names(t), ("Checkpoint".into(), "Generate".into()));
            assert_eq!(t.updates, vec!["bft_quorum_height += 1"]);
            assert_eq!(names(&trace[i - 1]).1, "Checkpoint");
            assert_eq!(trace[i - 1].actions, vec![Action::Decode]);
        }
    }
    assert_eq!(w.finished.len(), 1);
    assert_eq!(w.finished[0].generated, MAX_NEW);
    assert_eq!(w.slots.batch_size(), 0);
    assert_eq!(w.slots.kv_blocks_used(), 0);
}

#[test]
fn seed_single_request_reproduces_the_seed() {
    single_request::<seed::Scheduler>();
}

#[test]
fn laptop_single_request_checkpoints_on_its_own_cadence() {
    single_request::<laptop::Scheduler>();
    assert_ne!(every::<laptop::Scheduler>(), every::<seed::Scheduler>());
}

#[test]
fn compiled_constants_match_the_spec_files() {
    let specs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs");
    for (file, constants, digest) in [
        ("scheduler.toml", seed::CONSTANTS, seed::SPEC_DIGEST),
        ("laptop.toml", laptop::CONSTANTS, laptop::SPEC_DIGEST),
    ] {
        let loaded = sov_spec::load_machine(&specs.join(file)).expect("shipped specs are valid");
        let from_file: Vec<(&str, i64)> = loaded
            .machine
            .constants
            .iter()
            .map(|(n, v)| (n.as_str(), *v))
            .collect();
        assert_eq!(constants, from_file.as_slice(), "{file}");
        assert_eq!(digest, loaded.digest(), "{file}");
    }
}

/// Runs `k` steps of a single request, raises `event`, and returns the machine and world.
fn interrupted_at<M: Machine>(k: usize, event: PowerState) -> (M, World, Transition<M::State>) {
    let mut w = world::<M>(1024);
    let mut m = M::new();
    w.submit(PROMPT, MAX_NEW);
    for _ in 0..k {
        step(&mut m, &mut w);
    }
    w.slots.set_power_state(event);
    let t = step(&mut m, &mut w);
    (m, w, t)
}

/// Suspend, wait, resume: checkpoint -> suspended -> resume -> restore -> prefill, then the
/// request still completes with every token and the receipt height counts every checkpoint.
fn suspend_resume<M: Machine>(event: PowerState) {
    let every = every::<M>();
    let steps_uninterrupted = {
        let mut w = world::<M>(1024);
        let mut m = M::new();
        w.submit(PROMPT, MAX_NEW);
        run_to_idle(&mut m, &mut w).len()
    };
    for k in 0..steps_uninterrupted {
        let (mut m, mut w, t) = interrupted_at::<M>(k, event);
        assert!(matches!(t.cause, Cause::Interrupt(_)), "k={k}: {t:?}");
        // Interrupted in the checkpoint state, the suspend checkpoint replaces the periodic one.
        let superseded = usize::from(format!("{:?}", t.from) == "Checkpoint");
        assert_eq!(t.actions, vec![Action::Checkpoint], "k={k}");
        assert_eq!(m.state_name(), "suspended", "k={k}");
        assert_eq!(w.slots.power_state(), PowerState::Active, "k={k}");
        assert_eq!(w.slots.tokens_generated(), 0, "k={k}");
        let decodes_before = w.count(Action::Decode);
        for _ in 0..3 {
            assert!(step(&mut m, &mut w).is_noop(), "k={k}: suspended must wait");
        }
        w.slots.set_power_state(PowerState::Resume);
        let t = step(&mut m, &mut w);
        assert_eq!(t.cause, Cause::Interrupt("resume"), "k={k}");
        assert_eq!(m.state_name(), "resume", "k={k}");
        let t = step(&mut m, &mut w);
        assert_eq!(t.actions, vec![Action::Restore], "k={k}");
        assert_eq!(m.state_name(), "prefill", "k={k}");
        assert_eq!(w.slots.power_state(), PowerState::Active);

        run_to_idle(&mut m, &mut w);
        assert_eq!(w.finished.len(), 1, "k={k}");
        assert_eq!(w.finished[0].generated, MAX_NEW, "k={k}");
        assert_eq!(w.count(Action::Restore), 1);
        assert_eq!(w.count(Action::Decode), (MAX_NEW - 1) as usize, "k={k}");
        assert_eq!(
            w.slots.bft_quorum_height() as usize,
            w.count(Action::Checkpoint),
            "k={k}"
        );
        // The cadence restarts at the suspend checkpoint: periodic checkpoints before it, then
        // one per `every` decodes after it.
        let after = (MAX_NEW - 1) as usize - decodes_before;
        let expected = decodes_before / every as usize - superseded + 1 + after / every as usize;
        assert_eq!(w.count(Action::Checkpoint), expected, "k={k}");
    }
}

#[test]
fn seed_suspend_at_any_step_checkpoints_then_resumes() {
    suspend_resume::<seed::Scheduler>(PowerState::Suspend);
}

#[test]
fn laptop_suspend_and_low_battery_at_any_step_checkpoint_then_resume() {
    suspend_resume::<laptop::Scheduler>(PowerState::Suspend);
    suspend_resume::<laptop::Scheduler>(PowerState::LowBattery);
}

#[test]
fn seed_low_battery_checkpoints_and_carries_on() {
    let (mut m, mut w, t) = interrupted_at::<seed::Scheduler>(50, PowerState::LowBattery);
    assert_eq!(t.cause, Cause::Interrupt("low_battery"));
    assert_eq!(t.from, t.to);
    assert_eq!(t.actions, vec![Action::Checkpoint]);
    assert_eq!(w.slots.power_state(), PowerState::Active);
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.finished[0].generated, MAX_NEW);
    assert_eq!(w.count(Action::Restore), 0);
}

#[test]
fn seed_admits_new_requests_between_decode_steps() {
    let mut w = world::<seed::Scheduler>(1024);
    let mut m = seed::Scheduler::new();
    w.submit(PROMPT, MAX_NEW);
    for _ in 0..12 {
        step(&mut m, &mut w);
    }
    assert_eq!(m.state(), seed::State::Generate);
    let counter = w.slots.tokens_generated();
    w.submit(PROMPT, 30);
    let t = step(&mut m, &mut w);
    assert_eq!(
        (t.from, t.to),
        (seed::State::Generate, seed::State::Prefill)
    );
    assert_eq!(t.actions, vec![Action::Admit]);
    assert!(
        t.updates.is_empty(),
        "joining a running batch keeps the counter"
    );
    let t = step(&mut m, &mut w);
    assert_eq!(t.actions, vec![Action::Prefill]);
    assert_eq!(w.slots.batch_size(), 2);
    assert_eq!(w.slots.tokens_generated(), counter);
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.finished.len(), 2);
    assert!(w.finished.iter().all(|s| s.generated == s.max_new));
}

/// With an engine that mixes (`mix_prefill`), the seed machine runs a prompt inside a decode
/// step: admission, then one mixed step (the first token) per pending prompt instead of a prefill
/// pass, counted as a decode step (so checkpoints come every `checkpoint_every` forward steps);
/// the laptop machine keeps its prefill passes.
#[test]
fn seed_mixes_prompts_into_decode_steps_when_the_engine_mixes() {
    let cadence = every::<seed::Scheduler>();
    let mut w = world::<seed::Scheduler>(1024);
    w.mix = true;
    let mut m = seed::Scheduler::new();
    w.submit(PROMPT, MAX_NEW);
    for _ in 0..12 {
        step(&mut m, &mut w);
    }
    assert_eq!(m.state(), seed::State::Generate);
    let counter = w.slots.tokens_generated();
    w.submit(PROMPT, 30);
    let t = step(&mut m, &mut w);
    assert_eq!(t.actions, vec![Action::Admit]);
    let t = step(&mut m, &mut w);
    assert_eq!(
        (t.from, t.to, t.actions.is_empty()),
        (seed::State::Prefill, seed::State::Generate, true)
    );
    let t = step(&mut m, &mut w);
    assert_eq!(t.actions, vec![Action::MixedStep]);
    assert_eq!(w.slots.tokens_generated(), (counter + 1) % cadence);
    // The mixed step decoded the first request and gave the second its first token.
    assert!(w.running.iter().all(|s| s.prefilled));
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.count(Action::Prefill), 0);
    assert_eq!(w.count(Action::MixedStep), 2);
    assert_eq!(w.finished.len(), 2);
    assert!(w.finished.iter().all(|s| s.generated == s.max_new));
    // One request alone: the same checkpoint cadence as unmixed (the mixed step counts).
    let mut w = world::<seed::Scheduler>(1024);
    w.mix = true;
    let mut m = seed::Scheduler::new();
    w.submit(PROMPT, MAX_NEW);
    run_to_idle(&mut m, &mut w);
    let mut want = vec![Action::Admit];
    for step in 1..=MAX_NEW {
        want.push(if step == 1 {
            Action::MixedStep
        } else {
            Action::Decode
        });
        if step % cadence == 0 {
            want.push(Action::Checkpoint);
        }
    }
    assert_eq!(w.log, want);
    // The laptop machine does not mix.
    let mut w = world::<laptop::Scheduler>(1024);
    w.mix = true;
    let mut m = laptop::Scheduler::new();
    w.submit(PROMPT, MAX_NEW);
    run_to_idle(&mut m, &mut w);
    assert_eq!(
        w.log,
        expected_single_request_log(every::<laptop::Scheduler>())
    );
}

/// Two requests that cannot both fit their full length in a 10-block cache.
fn kv_pressure<M: Machine>() -> World {
    let mut w = world::<M>(10);
    let mut m = M::new();
    w.submit(16, 100);
    w.submit(16, 100);
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.finished.len(), 2, "{}", M::NAME);
    assert!(w.finished.iter().all(|s| s.generated == s.max_new));
    w
}

#[test]
fn seed_swaps_to_host_memory_under_kv_pressure() {
    let w = kv_pressure::<seed::Scheduler>();
    assert!(w.count(Action::SwapOut) >= 1);
    assert_eq!(w.count(Action::SwapOut), w.count(Action::SwapIn));
    assert_eq!(w.count(Action::Preempt), 0);
}

#[test]
fn laptop_preempts_by_recomputation_under_kv_pressure() {
    let w = kv_pressure::<laptop::Scheduler>();
    assert!(w.count(Action::Preempt) >= 1);
    assert_eq!(w.count(Action::SwapOut), 0);
}

#[test]
fn seed_speculates_when_a_draft_length_is_set() {
    let mut w = world::<seed::Scheduler>(1024);
    let mut m = seed::Scheduler::new();
    w.slots.set_speculative_draft_len(3);
    w.submit(PROMPT, MAX_NEW);
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.count(Action::Decode), 0);
    assert_eq!(w.count(Action::Draft), w.count(Action::Verify));
    assert!(w.count(Action::Verify) >= 1);
    assert_eq!(w.finished[0].generated, MAX_NEW);
    // The laptop machine never speculates.
    let mut w = world::<laptop::Scheduler>(1024);
    let mut m = laptop::Scheduler::new();
    w.slots.set_speculative_draft_len(3);
    w.submit(PROMPT, MAX_NEW);
    run_to_idle(&mut m, &mut w);
    assert_eq!(w.count(Action::Draft), 0);
}

#[test]
fn a_failed_action_leaves_the_state_unchanged() {
    let mut w = world::<seed::Scheduler>(1024);
    let mut m = seed::Scheduler::new();
    w.submit(PROMPT, MAX_NEW);
    w.fail_next = Some(Action::Admit);
    let slots = w.slots.clone();
    let err = m.step(&mut w, &slots).expect_err("admit was set to fail");
    assert_eq!(err.to_string(), "injected failure of action `admit`");
    assert_eq!(m.state(), seed::State::Idle);
    assert_eq!(step(&mut m, &mut w).to, seed::State::Prefill);
}

#[test]
fn state_names_round_trip_for_checkpoint_restore() {
    let mut m = seed::Scheduler::new();
    for name in <seed::Scheduler as Machine>::STATE_NAMES {
        m.set_state_by_name(name).expect("a listed state");
        assert_eq!(m.state_name(), *name);
    }
    let err = m.set_state_by_name("nap").expect_err("not a state");
    assert_eq!(err.to_string(), "machine `seed` has no state `nap`");
}

#[test]
fn slots_by_name_and_raw() {
    let s = Slots::new();
    s.set_by_name("power_state", "low_battery")
        .expect("variant name");
    assert_eq!(s.power_state(), PowerState::LowBattery);
    s.set_by_name("power_state", "2").expect("variant number");
    assert_eq!(s.get_by_name("power_state").as_deref(), Ok("resume"));
    assert!(s.set_by_name("power_state", "9").is_err());
    assert!(s.set_by_name("power_state", "sleep").is_err());
    // An out-of-range raw value never panics: it reads as the first variant.
    s.set_word(5, 77);
    assert_eq!(s.power_state(), PowerState::Active);
    assert_eq!(s.get_by_name("power_state").as_deref(), Ok("77"));
    s.set_by_name("batch_size", "0x10").expect("hex");
    assert_eq!(s.batch_size(), 16);
    assert!(s.set_by_name("batch_size", "-1").is_err());
    assert!(s.set_by_name("nope", "1").is_err());
    let digest: [u8; 32] = std::array::from_fn(|i| i as u8);
    s.set_receipt_digest(&digest);
    assert_eq!(s.receipt_digest(), digest);
    // Little-endian within each slot: word 8 holds bytes 0..4.
    assert_eq!(s.word(8), Some(u32::from_le_bytes([0, 1, 2, 3])));
    let hex = s.get_by_name("receipt_digest").expect("known field");
    assert_eq!(hex.len(), 64);
    s.set_by_name("receipt_signature", &"ab".repeat(64))
        .expect("64 bytes of hex");
    assert_eq!(s.receipt_signature(), [0xab; 64]);
    assert!(s.set_by_name("receipt_signature", "abc").is_err());
    let raw = s.raw();
    let t = Slots::new();
    t.load_raw(&raw);
    assert_eq!(t.raw(), raw);
    assert_eq!(crate::scheduler::SLOT_FIELDS.len(), 10);
}
