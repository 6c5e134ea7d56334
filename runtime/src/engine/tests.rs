//! Scheduling tests on the deterministic [`FakeModel`] (outputs of the real model are tested in
//! `runtime/tests/engine_*.rs`): continuous admission, blocks freed the step a request finishes,
//! preemption without loss, the trace following the spec, bad input, live slot writes.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use super::codec::ByteCodec;
use super::core::{CoreConfig, EngineCore};
use super::error::EngineError;
use super::fake::FakeModel;
use super::handle::{Engine, EngineConfig};
use super::hook::CheckpointHook;
use super::intake::{IntakeLimits, build_sequence};
use super::output::{FinishReason, Finished, Output};
use super::request::{Prompt, Request, SamplingParams};
use super::sequence::Sequence;
use crate::scheduler::seed::Scheduler;
use crate::scheduler::{Machine, PowerState, Slots};

const VOCAB: usize = 300;
const BS: usize = 16;

fn prompt(i: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((i * 31 + j * 7) % 250) as u32 + 1)
        .collect()
}

fn request(i: usize, len: usize, max_tokens: usize, sampling: SamplingParams) -> Request {
    let mut r = Request::new(Prompt::Tokens(prompt(i, len)), max_tokens);
    r.sampling = sampling;
    r
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// A core driven step by step by the default machine, `seed` (no thread): full control for exact assertions.
struct Stepper {
    core: EngineCore<FakeModel>,
    machine: Scheduler,
    slots: Slots,
    next_id: u64,
    limits: IntakeLimits,
}

impl Stepper {
    fn new(num_blocks: usize) -> Self {
        let slots = Slots::new();
        let cfg = CoreConfig {
            num_blocks,
            block_size: BS,
            max_batch: 64,
            max_prefill_tokens: 64,
            context_len: 1024.min(num_blocks * BS),
            max_tokens_cap: 2048,
            eos_ids: vec![299],
            kv: Default::default(),
        };
        let limits = IntakeLimits {
            context_len: cfg.context_len,
            vocab_size: VOCAB,
            num_blocks,
            block_size: BS,
            max_tokens_cap: 2048,
        };
        let core = EngineCore::new(
            FakeModel::new(VOCAB, num_blocks, BS),
            Arc::new(ByteCodec),
            cfg,
            slots.clone(),
        );
        Self {
            core,
            machine: Scheduler::new(),
            slots,
            next_id: 1,
            limits,
        }
    }

    fn submit(&mut self, req: Request) -> Receiver<Output> {
        let (tx, rx) = mpsc::channel();
        let seq = build_sequence(self.next_id, req, &ByteCodec, &self.limits, tx).unwrap();
        self.next_id += 1;
        self.core.enqueue(seq);
        self.core.publish();
        rx
    }

    /// One scheduler step; returns the action names.
    fn step(&mut self) -> Vec<&'static str> {
        self.core.publish();
        let t = self.machine.step(&mut self.core, &self.slots).unwrap();
        t.actions.iter().map(|a| a.name()).collect()
    }

    fn run_until_idle(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            self.step();
            if self.core.is_idle() {
                return;
            }
        }
        panic!("not idle after {max_steps} steps");
    }
}

/// Drains a finished stream: (tokens, finished).
fn collect(rx: &Receiver<Output>) -> (Vec<u32>, Finished) {
    let mut tokens = Vec::new();
    loop {
        let out = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("stream ended without a final event");
        tokens.extend(&out.tokens);
        if let Some(f) = out.finished {
            return (tokens, f);
        }
    }
}

fn solo(req: Request) -> Vec<u32> {
    solo_with(req, |_| {})
}

fn solo_with(req: Request, setup: impl Fn(&mut FakeModel)) -> Vec<u32> {
    let mut s = Stepper::new(256);
    setup(&mut s.core.model);
    let rx = s.submit(req);
    s.run_until_idle(10_000);
    collect(&rx).0
}

#[test]
fn batched_equals_solo_greedy_and_seeded() {
    for sampling in [SamplingParams::greedy(), seeded(7)] {
        let reqs: Vec<Request> = (0..8)
            .map(|i| {
                request(
                    i,
                    5 + 9 * i,
                    20 + i,
                    SamplingParams {
                        seed: sampling.seed.map(|s| s + i as u64),
                        ..sampling.clone()
                    },
                )
            })
            .collect();
        let alone: Vec<Vec<u32>> = reqs.iter().cloned().map(solo).collect();
        let mut s = Stepper::new(256);
        let rxs: Vec<_> = reqs.into_iter().map(|r| s.submit(r)).collect();
        s.run_until_idle(10_000);
        for (i, rx) in rxs.iter().enumerate() {
            let (tokens, fin) = collect(rx);
            assert_eq!(tokens, alone[i], "request {i}");
            assert_eq!(fin.output_tokens, alone[i]);
        }
        assert_eq!(s.slots.kv_blocks_used(), 0);
    }
}

#[test]
fn admits_while_others_decode_and_frees_blocks_the_step_they_finish() {
    for mix in [true, false] {
        admits_while_others_decode(mix);
    }
}

/// The test above with prompts mixed into decode steps or run in prefill passes of their own.
fn admits_while_others_decode(mix: bool) {
    let mut s = Stepper::new(256);
    s.core.set_mix_prefill(mix);
    let long = s.submit(request(0, 20, 30, SamplingParams::greedy()));
    // A few decode steps of the long request alone.
    for _ in 0..6 {
        s.step();
    }
    assert_eq!(s.slots.batch_size(), 1);
    let short = s.submit(request(1, 40, 3, SamplingParams::greedy()));
    // The very next step admits the newcomer although the first is mid-generation.
    assert_eq!(s.step(), vec!["admit"]);
    assert_eq!(s.slots.batch_size(), 2);
    if mix {
        // The prefill state hands over to generate, whose next step carries the prompt along
        // with the long request's decode row.
        assert!(s.step().is_empty());
        assert_eq!(s.step(), vec!["mixed_step"]);
    } else {
        assert_eq!(s.step(), vec!["prefill"]);
    }
    let mut saw_short_finish = false;
    while !s.core.is_idle() {
        let before = s.slots.kv_blocks_used();
        let actions = s.step();
        if s.slots.batch_size() == 1 && !saw_short_finish {
            // The short request finished in this step: its blocks are already back.
            saw_short_finish = true;
            assert!(actions.contains(&"decode"), "{actions:?}");
            let long_blocks = s.core.running[0].block_table.len() as u32;
            assert_eq!(s.slots.kv_blocks_used(), long_blocks, "before {before}");
            assert!(s.slots.kv_blocks_used() < before);
        }
    }
    assert!(saw_short_finish);
    let (short_tokens, f) = collect(&short);
    assert_eq!((short_tokens.len(), f.reason), (3, FinishReason::Length));
    let (long_tokens, _) = collect(&long);
    assert_eq!(
        long_tokens,
        solo(request(0, 20, 30, SamplingParams::greedy()))
    );
    assert_eq!(s.slots.kv_blocks_used(), 0);
}

#[test]
fn kv_pressure_preempts_by_recomputation_without_loss() {
    // 12 blocks of 16 tokens; 4 requests of 30-token prompts growing by 60 tokens each cannot all
    // fit: the newest is preempted (swap_out falls back to recomputation) and later resumed.
    let reqs: Vec<Request> = (0..4)
        .map(|i| Request {
            ignore_eos: true,
            ..request(i, 30, 60, seeded(100 + i as u64))
        })
        .collect();
    let alone: Vec<Vec<u32>> = reqs.iter().cloned().map(solo).collect();
    let mut s = Stepper::new(12);
    let rxs: Vec<_> = reqs.into_iter().map(|r| s.submit(r)).collect();
    let mut max_used = 0;
    for _ in 0..20_000 {
        s.step();
        max_used = max_used.max(s.slots.kv_blocks_used());
        if s.core.is_idle() {
            break;
        }
    }
    assert!(s.core.is_idle());
    assert!(max_used <= 12);
    let mut preemptions = 0;
    for (i, rx) in rxs.iter().enumerate() {
        let (tokens, f) = collect(rx);
        assert_eq!(tokens, alone[i], "request {i} differs after preemption");
        assert_eq!(f.reason, FinishReason::Length);
        preemptions += f.preemptions;
    }
    assert!(preemptions > 0, "the test must exercise preemption");
}

#[test]
fn eos_and_stop_strings_finish_requests() {
    let mut s = Stepper::new(64);
    s.core.model.eos = Some((299, 12));
    let rx = s.submit(request(3, 8, 50, SamplingParams::greedy()));
    s.run_until_idle(1000);
    let (tokens, f) = collect(&rx);
    assert_eq!(f.reason, FinishReason::Eos);
    assert_eq!(
        tokens.len(),
        12 - 8 + 1,
        "EOS is generated when the sequence is 12 long"
    );
    // ignore_eos keeps going to max_tokens.
    let mut req = request(3, 8, 10, SamplingParams::greedy());
    req.ignore_eos = true;
    let rx = s.submit(req);
    s.run_until_idle(1000);
    assert_eq!(collect(&rx).1.reason, FinishReason::Length);
    // Stop string: the byte codec maps tokens to bytes; stop at the text of the 3rd generated token.
    s.core.model.eos = None;
    let free_run = solo(request(4, 8, 10, SamplingParams::greedy()));
    let stop_byte = free_run[2];
    let first = free_run.iter().position(|&t| t == stop_byte).unwrap();
    let mut req = request(4, 8, 10, SamplingParams::greedy());
    req.stop = vec![String::from_utf8_lossy(&[stop_byte as u8]).into_owned()];
    if stop_byte < 128 {
        let rx = s.submit(req);
        s.run_until_idle(1000);
        let (tokens, f) = collect(&rx);
        assert_eq!(f.reason, FinishReason::Stop);
        assert_eq!(tokens.len(), first + 1);
        assert!(!f.text.contains(stop_byte as u8 as char));
    }
}

/// Records every checkpoint call with the machine state the core reports.
struct RecordingHook(Arc<std::sync::Mutex<Vec<(&'static str, &'static str)>>>);

impl CheckpointHook<EngineCore<FakeModel>> for RecordingHook {
    fn checkpoint(&mut self, core: &mut EngineCore<FakeModel>) -> Result<(), EngineError> {
        if let Ok(mut v) = self.0.lock() {
            v.push(core.machine_state());
        }
        Ok(())
    }
    fn restore(&mut self, _core: &mut EngineCore<FakeModel>) -> Result<(), EngineError> {
        Ok(())
    }
}

#[test]
fn trace_checkpoints_every_checkpoint_every_decode_steps() {
    let every = Scheduler::constant("checkpoint_every").unwrap() as usize;
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let engine = Engine::start_with_hook::<Scheduler, _>(
        FakeModel::new(VOCAB, 256, BS),
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 256,
            trace: true,
            ..EngineConfig::default()
        },
        Some(Box::new(RecordingHook(calls.clone()))),
    )
    .unwrap();
    let rxs: Vec<_> = (0..3)
        .map(|i| {
            engine
                .submit(request(i, 10, 3 * every, SamplingParams::greedy()))
                .unwrap()
                .rx
        })
        .collect();
    for rx in &rxs {
        assert_eq!(collect(rx).1.reason, FinishReason::Length);
    }
    // The last decode step's checkpoint runs after its results went out: read the trace once the
    // engine has gone idle, so it holds every checkpoint the stats count.
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.trace().last().map(|e| e.to) != Some("idle") {
        assert!(Instant::now() < deadline, "engine did not go idle");
        std::thread::sleep(Duration::from_millis(1));
    }
    let trace = engine.trace();
    let mut decodes_since = 0;
    let mut checkpoints = 0;
    for e in &trace {
        // Admission from idle starts a new count (`tokens_generated = 0` in the spec): a request
        // may finish before the next one is submitted when the test thread is descheduled.
        if e.from == "idle" && e.actions.contains(&"admit") {
            decodes_since = 0;
        }
        for a in &e.actions {
            match *a {
                // A mixed step (prompts alongside the decode rows) counts as a decode step.
                "decode" | "mixed_step" => decodes_since += 1,
                "checkpoint" => {
                    assert_eq!(
                        decodes_since, every,
                        "checkpoint after {decodes_since} decodes: {e:?}"
                    );
                    assert_eq!(e.from, "checkpoint");
                    decodes_since = 0;
                    checkpoints += 1;
                }
                _ => {}
            }
        }
    }
    // At least 3 * every - 1 decode steps ran (more when the requests ran one after another).
    assert!(checkpoints >= 2, "{checkpoints} checkpoints");
    let stats = engine.shutdown().unwrap();
    assert_eq!(stats.checkpoints, checkpoints);
    // The installed hook ran for each, seeing the machine in its checkpoint state.
    assert_eq!(
        *calls.lock().unwrap(),
        vec![("seed", "checkpoint"); checkpoints as usize]
    );
}

#[test]
fn bad_requests_are_refused_and_the_engine_keeps_serving() {
    let engine = Engine::start::<Scheduler, _>(
        FakeModel::new(VOCAB, 8, BS),
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 8,
            context_len: 100,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let good = engine
        .submit(request(0, 10, 40, SamplingParams::greedy()))
        .unwrap()
        .rx;
    let bad: Vec<Request> = vec![
        Request::new(Prompt::Text(String::new()), 5),
        Request::new(Prompt::Tokens(vec![]), 5),
        Request::new(Prompt::Tokens(prompt(1, 100)), 5),
        Request::new(Prompt::Tokens(prompt(1, 5)), 0),
        request(
            1,
            5,
            5,
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
        ),
        request(
            1,
            5,
            5,
            SamplingParams {
                top_p: 2.0,
                ..SamplingParams::default()
            },
        ),
        Request::new(Prompt::Tokens(vec![VOCAB as u32 + 5]), 5),
    ];
    let errors: Vec<EngineError> = bad
        .into_iter()
        .map(|r| engine.submit(r).expect_err("must be refused"))
        .collect();
    assert!(matches!(errors[0], EngineError::EmptyPrompt));
    assert!(matches!(errors[1], EngineError::EmptyPrompt));
    assert!(matches!(
        errors[2],
        EngineError::PromptTooLong {
            prompt_tokens: 100,
            context_len: 100
        }
    ));
    assert!(matches!(errors[3], EngineError::ZeroMaxTokens));
    assert!(matches!(
        errors[4],
        EngineError::InvalidSampling {
            name: "temperature",
            ..
        }
    ));
    assert!(matches!(
        errors[5],
        EngineError::InvalidSampling { name: "top_p", .. }
    ));
    assert!(matches!(errors[6], EngineError::TokenOutOfVocab { .. }));
    for e in &errors {
        assert!(!e.to_string().is_empty());
    }
    let after = engine
        .submit(request(2, 10, 5, SamplingParams::greedy()))
        .unwrap()
        .rx;
    assert_eq!(collect(&good).0.len(), 40);
    assert_eq!(collect(&after).0.len(), 5);
}

#[test]
fn context_length_finishes_a_sequence() {
    let engine = Engine::start::<Scheduler, _>(
        FakeModel::new(VOCAB, 64, BS),
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 64,
            context_len: 30,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let rx = engine
        .submit(request(0, 20, 100, SamplingParams::greedy()))
        .unwrap()
        .rx;
    let (tokens, f) = collect(&rx);
    assert_eq!((tokens.len(), f.reason), (10, FinishReason::ContextLength));
}

#[test]
fn slot_writes_steer_a_running_engine() {
    let dir = tempfile::tempdir().unwrap();
    let slot_file = dir.path().join("slots");
    let mut model = FakeModel::new(VOCAB, 256, BS);
    model.echo_period = Some(6);
    model.delay = Duration::from_millis(2);
    let engine = Engine::start::<Scheduler, _>(
        model,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 256,
            trace: true,
            slots: Some(crate::app::slot_file::create_slots(&slot_file).unwrap()),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    // Another mapping of the same file, as `sov slots set` opens it.
    let outside = crate::app::slot_file::open_slots(&slot_file).unwrap();
    // A repetitive prompt gives the n-gram drafter something to propose.
    let rep: Vec<u32> = (0..60).map(|i| (i % 6) as u32 + 10).collect();
    let plain = solo_with(
        Request {
            sampling: SamplingParams::greedy(),
            ..Request::new(Prompt::Tokens(rep.clone()), 200)
        },
        |m| m.echo_period = Some(6),
    );
    let rx = engine
        .submit(Request {
            sampling: SamplingParams::greedy(),
            ..Request::new(Prompt::Tokens(rep), 200)
        })
        .unwrap()
        .rx;
    // Wait for generation to start, then suspend from outside.
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    outside.set_power_state(PowerState::Suspend);
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.trace().last().map(|e| e.to) != Some("suspended") {
        assert!(Instant::now() < deadline, "engine did not suspend");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Suspended: no token arrives for a while.
    let mut seen = first.tokens.clone();
    while let Ok(out) = rx.try_recv() {
        assert!(
            out.finished.is_none(),
            "finished before the suspend took effect"
        );
        seen.extend(out.tokens);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "a suspended engine produced a token"
    );
    // Turn on speculation, then resume.
    outside.set_speculative_draft_len(4);
    outside.set_power_state(PowerState::Resume);
    let (_, fin) = collect(&rx);
    let trace = engine.trace();
    let resumed = trace
        .iter()
        .position(|e| e.cause == "interrupt:resume")
        .expect("resume interrupt");
    assert!(
        trace[resumed..]
            .iter()
            .any(|e| e.actions.contains(&"draft") && e.actions.contains(&"verify")),
        "speculation did not start"
    );
    // Output identical to plain decoding.
    assert_eq!(seen[..], fin.output_tokens[..seen.len()]);
    assert_eq!(fin.output_tokens, plain);
    let stats = engine.shutdown().unwrap();
    assert!(stats.spec_accepted > 0, "{stats:?}");
}

/// Journals what it is given, to check `submit_many` records all or nothing.
struct CountingJournal(std::sync::Mutex<Vec<u64>>);

impl super::hook::RequestJournal for CountingJournal {
    fn accept(&self, seq: &Sequence) -> Result<(), EngineError> {
        self.0.lock().unwrap().push(seq.id);
        Ok(())
    }
}

#[test]
fn submit_many_validates_all_journals_together_and_runs_each() {
    let journal = Arc::new(CountingJournal(std::sync::Mutex::new(Vec::new())));
    let engine = Engine::start_durable::<Scheduler, _>(
        FakeModel::new(VOCAB, 256, BS),
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 256,
            ..EngineConfig::default()
        },
        Some(super::handle::Durability {
            hook: Box::new(RecordingHook(Arc::new(std::sync::Mutex::new(Vec::new())))),
            journal: Some(journal.clone()),
            resume: false,
        }),
    )
    .unwrap();
    let bad = Request::new(Prompt::Tokens(Vec::new()), 4);
    let err = engine
        .submit_many(vec![request(0, 5, 4, SamplingParams::greedy()), bad])
        .unwrap_err();
    assert_eq!(err, EngineError::EmptyPrompt);
    assert!(journal.0.lock().unwrap().is_empty(), "nothing journaled");
    let rxs = engine
        .submit_many(
            (0..3)
                .map(|i| request(i, 5 + i, 6, SamplingParams::greedy()))
                .collect(),
        )
        .unwrap()
        .into_iter()
        .map(|s| s.rx)
        .collect::<Vec<_>>();
    assert_eq!(journal.0.lock().unwrap().len(), 3);
    for rx in &rxs {
        assert_eq!(collect(rx).1.reason, FinishReason::Length);
    }
}

#[test]
fn abort_ends_running_and_waiting_requests_and_frees_their_blocks() {
    let mut model = FakeModel::new(VOCAB, 64, BS);
    model.delay = Duration::from_millis(2);
    let engine = Engine::start::<Scheduler, _>(
        model,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 64,
            max_batch: 1, // the second request waits behind the first
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let running = engine
        .submit(request(0, 20, 400, SamplingParams::greedy()))
        .unwrap();
    let waiting = engine
        .submit(request(1, 20, 400, SamplingParams::greedy()))
        .unwrap();
    running
        .rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the first request starts");
    engine.abort(waiting.id).unwrap();
    engine.abort(running.id).unwrap();
    engine.abort(9_999).unwrap(); // unknown: ignored
    let (tokens, f) = collect(&running.rx);
    assert_eq!(f.reason, FinishReason::Abort);
    assert!(tokens.len() < 399, "stopped early: {}", tokens.len());
    let (tokens, f) = collect(&waiting.rx);
    assert_eq!((tokens.len(), f.reason), (0, FinishReason::Abort));
    assert_eq!(engine.slots().kv_blocks_used(), 0, "blocks freed");
    assert_eq!(engine.slots().batch_size(), 0);
    // The engine keeps serving.
    let after = engine
        .submit(request(2, 10, 5, SamplingParams::greedy()))
        .unwrap();
    assert_eq!(collect(&after.rx).1.reason, FinishReason::Length);
    engine.abort(after.id).unwrap(); // already finished: ignored
}

#[test]
fn min_tokens_holds_back_eos_until_reached() {
    let run = |min_tokens: usize| {
        let mut s = Stepper::new(64);
        s.core.model.eos = Some((299, 13)); // EOS (id 299) is the argmax from 13 tokens on
        let rx = s.submit(request(
            0,
            10,
            50,
            SamplingParams {
                min_tokens,
                ..SamplingParams::greedy()
            },
        ));
        s.run_until_idle(1_000);
        collect(&rx)
    };
    let (free, f) = run(0);
    assert_eq!(f.reason, FinishReason::Eos);
    let (held, f) = run(free.len() + 3);
    assert_eq!(f.reason, FinishReason::Eos);
    assert_eq!(held.len(), free.len() + 4, "{held:?}");
    assert!(!held[..free.len() + 3].contains(&299));
}
