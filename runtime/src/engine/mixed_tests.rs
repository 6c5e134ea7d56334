//! Chunked prefill mixed with decode ([`super::mixed`]), driven step by step by the default
//! machine: requests arriving mid-run while others decode give, greedy and seeded, exactly their
//! tokens alone and exactly the unmixed engine's, on the deterministic [`FakeModel`] (block tables
//! and positions) and on a tiny random Llama on the CPU backend (the real forward pass); a running
//! stream gets a token every step while a long prompt is prefilled in several chunks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::codec::ByteCodec;
use super::core::{CoreConfig, EngineCore};
use super::fake::FakeModel;
use super::forward::ForwardModel;
use super::intake::{IntakeLimits, build_sequence};
use super::output::Output;
use super::request::{Prompt, Request, SamplingParams};
use crate::backend::cpu::CpuBackend;
use crate::model::LlamaModel;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::runner::LlamaRunner;
use crate::scheduler::seed::Scheduler;
use crate::scheduler::{Machine, Slots};

const BS: usize = 16;
const BLOCKS: usize = 128;

/// A core driven by the seed machine, one step at a time, with its action counts.
struct Rig<F: ForwardModel> {
    core: EngineCore<F>,
    machine: Scheduler,
    slots: Slots,
    limits: IntakeLimits,
    next_id: u64,
    /// Actions run, by name.
    actions: Vec<&'static str>,
    /// Mixed steps that ran while both a prefilled and an unprefilled sequence were running.
    truly_mixed: usize,
}

impl<F: ForwardModel> Rig<F> {
    fn new(model: F, vocab: usize, max_prefill_tokens: usize, mix: bool) -> Self {
        let context_len = 1024;
        let cfg = CoreConfig {
            num_blocks: BLOCKS,
            block_size: BS,
            max_batch: 64,
            max_prefill_tokens,
            context_len,
            max_tokens_cap: 2048,
            eos_ids: vec![],
            kv: Default::default(),
        };
        let limits = IntakeLimits {
            context_len,
            vocab_size: vocab,
            num_blocks: BLOCKS,
            block_size: BS,
            max_tokens_cap: 2048,
        };
        let slots = Slots::new();
        let mut core = EngineCore::new(model, Arc::new(ByteCodec), cfg, slots.clone());
        core.set_mix_prefill(mix);
        Self {
            core,
            machine: Scheduler::new(),
            slots,
            limits,
            next_id: 1,
            actions: Vec::new(),
            truly_mixed: 0,
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

    fn step(&mut self) {
        let both = self.core.running.iter().any(|s| s.prefilled)
            && self.core.running.iter().any(|s| !s.prefilled);
        self.core.publish();
        let t = self.machine.step(&mut self.core, &self.slots).unwrap();
        for a in &t.actions {
            self.actions.push(a.name());
            if a.name() == "mixed_step" && both {
                self.truly_mixed += 1;
            }
        }
    }

    fn count(&self, action: &str) -> usize {
        self.actions.iter().filter(|a| **a == action).count()
    }

    /// Submits `arrivals[k].1` before step `arrivals[k].0` and steps until idle; every request's
    /// tokens, in arrival order.
    fn run(&mut self, arrivals: &[(usize, Request)]) -> Vec<Vec<u32>> {
        let mut rxs = Vec::new();
        for step in 0..100_000 {
            for (_, req) in arrivals.iter().filter(|(at, _)| *at == step) {
                rxs.push(self.submit(req.clone()));
            }
            let all_in = arrivals.iter().all(|(at, _)| *at < step);
            if all_in && self.core.is_idle() {
                assert_eq!(self.core.blocks.used(), 0, "every block free at the end");
                return rxs.iter().map(collect).collect();
            }
            self.step();
        }
        panic!("not idle after 100000 steps");
    }
}

fn collect(rx: &Receiver<Output>) -> Vec<u32> {
    let mut tokens = Vec::new();
    loop {
        let out = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("stream ended without a final event");
        tokens.extend(&out.tokens);
        if out.finished.is_some() {
            return tokens;
        }
    }
}

fn request(i: usize, len: usize, max_tokens: usize, sampling: SamplingParams) -> Request {
    let prompt = (0..len)
        .map(|j| ((i * 31 + j * 7) % 250) as u32 + 1)
        .collect();
    let mut r = Request::new(Prompt::Tokens(prompt), max_tokens);
    r.sampling = sampling;
    r.ignore_eos = true;
    r
}

/// Greedy and seeded requests of prompts shorter and longer than the budget, arriving while
/// earlier ones decode (and while a long prompt is still being prefilled).
fn arrivals() -> Vec<(usize, Request)> {
    let seeded = |seed| SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let lens = [40, 7, 90, 23, 61, 16, 5, 33];
    lens.iter()
        .enumerate()
        .map(|(i, &len)| {
            let sampling = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                seeded(i as u64 + 3)
            };
            (i * 3, request(i, len, 10 + i % 4 * 3, sampling))
        })
        .collect()
}

/// Runs `arrivals` mixed and unmixed and each request alone (on fresh models from `model`);
/// all three must agree, the mixed run must have mixed and the unmixed one not.
fn check_mixed_equals_unmixed_and_solo<F: ForwardModel>(model: impl Fn() -> F, vocab: usize) {
    let reqs = arrivals();
    let mut mixed = Rig::new(model(), vocab, 32, true);
    let got = mixed.run(&reqs);
    let mut unmixed = Rig::new(model(), vocab, 32, false);
    let want = unmixed.run(&reqs);
    assert!(mixed.truly_mixed > 0, "prompts ran alongside decode rows");
    assert_eq!(mixed.count("prefill"), 0);
    assert_eq!(unmixed.count("mixed_step"), 0);
    assert!(unmixed.count("prefill") > 0);
    for (k, (req, (m, u))) in reqs.iter().zip(got.iter().zip(&want)).enumerate() {
        assert_eq!(m.len(), req.1.max_tokens, "request {k} ran to its length");
        assert_eq!(m, u, "request {k}: mixed and unmixed differ");
        let mut solo = Rig::new(model(), vocab, 32, true);
        let alone = solo.run(&[(0, req.1.clone())]);
        assert_eq!(m, &alone[0], "request {k}: mixed differs from alone");
    }
}

#[test]
fn mixed_equals_unmixed_and_solo_on_the_fake_model() {
    check_mixed_equals_unmixed_and_solo(|| FakeModel::new(300, BLOCKS, BS), 300);
}

fn tiny_llama() -> LlamaRunner<CpuBackend> {
    let config = tiny_config();
    let weights = random_weights(&config, 11, WeightDtype::F32);
    let model = LlamaModel::new(CpuBackend::new(), &config, &weights).unwrap();
    LlamaRunner::new(model, BLOCKS, BS).unwrap()
}

#[test]
fn mixed_equals_unmixed_and_solo_on_a_tiny_llama_on_the_cpu() {
    let vocab = tiny_config().vocab_size;
    check_mixed_equals_unmixed_and_solo(tiny_llama, vocab);
}

/// A stream that is decoding gets one token every step while a 100-token prompt is prefilled
/// 16 tokens a step (7 chunks, one forward pass each, the decode row in every one); the long
/// request's first token comes with its last chunk.
#[test]
fn a_running_stream_gets_a_token_every_step_while_a_long_prompt_prefills() {
    let model = FakeModel::new(300, BLOCKS, BS);
    let calls = model.calls.clone();
    let widths = model.widths.clone();
    let mut rig = Rig::new(model, 300, 16, true);
    let short = rig.submit(request(1, 5, 40, SamplingParams::greedy()));
    while rig
        .core
        .running
        .first()
        .is_none_or(|s| s.output().len() < 3)
    {
        rig.step();
    }
    let long = rig.submit(request(2, 100, 4, SamplingParams::greedy()));
    // Admit, then the prefill state hands over to generate (no forward pass in either).
    rig.step();
    rig.step();
    assert_eq!(rig.core.running.len(), 2);
    let chunks = 100usize.div_ceil(16);
    for k in 1..=chunks {
        let before = (
            rig.core.running[0].output().len(),
            calls.load(Ordering::Relaxed),
        );
        rig.step();
        assert_eq!(rig.actions.last(), Some(&"mixed_step"));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            before.1 + 1,
            "one pass a step"
        );
        assert_eq!(widths.lock().unwrap().last(), Some(&2), "both rows in it");
        assert_eq!(
            rig.core.running[0].output().len(),
            before.0 + 1,
            "chunk {k}: the running stream got its token"
        );
        let l = &rig.core.running[1];
        assert_eq!(l.computed, (16 * k).min(100));
        assert_eq!(l.output().len(), usize::from(k == chunks), "chunk {k}");
    }
    // Then both decode together.
    rig.step();
    assert_eq!(rig.actions.last(), Some(&"decode"));
    assert_eq!(rig.core.running[1].output().len(), 2);
    while !rig.core.is_idle() {
        rig.step();
    }
    assert_eq!(collect(&short).len(), 40);
    assert_eq!(collect(&long).len(), 4);
}
