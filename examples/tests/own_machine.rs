//! The `own_machine` example's machine (`examples/own_machine/spec.toml`, compiled in this package,
//! outside the `sov` crate) compiles against sov's interface and runs on sov's engine: on tiny
//! random weights it produces every requested token, visits its states, admits only into an empty
//! batch (where sov's default machine admits between decode steps), checkpoints every 8 decode
//! steps, and leaves a checkpoint chain that verifies against its own spec digest.

use sov::app::start::{Device, EngineOptions, KvBudget, ModelParts, start_engine};
use sov::engine::{FinishReason, Prompt, Request, SamplingParams, TraceEntry};
use sov::model::random::{WeightDtype, tiny_config};
use sov::scheduler::{Machine, seed};
use sov_examples::own_machine::{self, RunPlaces, Waves, machine};

fn tiny() -> ModelParts {
    ModelParts::random(tiny_config(), 3, WeightDtype::F32, "tiny")
}

/// Four requests, alternately 6 and 12 tokens long.
fn requests() -> Vec<Request> {
    (0..4)
        .map(|i| Request {
            sampling: SamplingParams::greedy(),
            ..Request::new(Prompt::Text(format!("prompt {i}")), 6 * (1 + i % 2))
        })
        .collect()
}

fn admits_from(trace: &[TraceEntry]) -> Vec<&'static str> {
    trace
        .iter()
        .filter(|t| t.actions.contains(&"admit"))
        .map(|t| t.from)
        .collect()
}

#[test]
fn the_machine_is_generated_from_its_own_spec() {
    assert_eq!(machine::NAME, "waves");
    assert_eq!(machine::CHECKPOINT_EVERY, 8);
    assert_eq!(<Waves as Machine>::constant("checkpoint_kv"), Some(0));
    assert_eq!(<Waves as Machine>::NAME, "waves");
    assert_ne!(machine::SPEC_DIGEST, seed::SPEC_DIGEST);
    assert_eq!(Waves::new().state_name(), "idle");
    let names: Vec<&str> = machine::State::ALL.iter().map(|s| s.name()).collect();
    for s in [
        "idle",
        "prefill",
        "generate",
        "preempt",
        "checkpoint",
        "suspended",
    ] {
        assert!(names.contains(&s), "{s} missing from {names:?}");
        assert!(machine::MERMAID.contains(s), "{s} missing from the graph");
    }
    // The graph labels every edge with its actions: no speculation, no swapping.
    for action in ["draft", "verify", "swap_out", "swap_in"] {
        assert!(!machine::MERMAID.contains(action), "{action} in the graph");
    }
}

#[test]
fn the_machine_serves_suspends_and_verifies_on_tiny_weights() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let places = RunPlaces {
        run_dir: tmp.path().join("run"),
        config_dir: tmp.path().join("config"),
    };
    std::fs::create_dir_all(&places.run_dir).expect("run dir");
    let opts = own_machine::engine_options(Device::Cpu, &places, 2);
    let report = own_machine::run(tiny(), &opts, requests()).expect("run");

    for (i, f) in report.finished.iter().enumerate() {
        assert_eq!(f.reason, FinishReason::Length, "request {i}");
        assert_eq!(f.output_tokens.len(), 6 * (1 + i % 2), "request {i}");
        assert!(report.events[i] >= 1, "request {i} streamed nothing");
    }
    let visited = report.states_visited();
    for s in ["idle", "prefill", "generate", "checkpoint", "suspended"] {
        assert!(visited.contains(s), "never in {s}: {visited:?}");
    }
    // Waves: two of them (batch of 2, four requests), each admitted into an empty batch.
    let admits = admits_from(&report.trace);
    assert!(admits.len() >= 2, "{admits:?}");
    assert!(admits.iter().all(|s| *s == "idle"), "{admits:?}");
    assert!(
        report.trace.iter().all(|t| !t
            .actions
            .iter()
            .any(|a| ["draft", "verify", "swap_out"].contains(a))),
        "the machine speculated or swapped"
    );
    // The suspend written to the slots ran the machine's interrupt.
    assert!(
        report
            .trace
            .iter()
            .any(|t| t.cause == "interrupt:suspend" && t.to == "suspended")
    );
    // 24 decode steps per wave pair at most; a checkpoint every 8, plus the suspend's.
    assert!(report.stats.checkpoints >= 2, "{:?}", report.stats);
    assert_eq!(report.verified.receipts as u64, report.stats.checkpoints);
}

#[test]
fn the_default_machine_admits_between_decode_steps() {
    // The same requests on sov's default machine: a request of the second wave joins as soon as a
    // short one of the first finishes, while the long one is still decoding.
    let started = start_engine::<seed::Scheduler>(
        tiny(),
        &EngineOptions {
            kv_budget: KvBudget::Bytes(16 << 20),
            max_batch: 2,
            trace: true,
            ..EngineOptions::default()
        },
    )
    .expect("start");
    let engine = started.engine;
    for rx in engine.submit_many(requests()).expect("submit") {
        while rx.rx.recv().expect("stream").finished.is_none() {}
    }
    let admits = admits_from(&engine.trace());
    assert!(admits.contains(&"generate"), "{admits:?}");
}
