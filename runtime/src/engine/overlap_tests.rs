//! Decode steps with their host work overlapped ([`super::overlap`]) against the in-turn path on
//! the deterministic [`FakeModel`]: every request's tokens, streamed text, events and finish reason
//! are the same, with stop strings, EOS, length and context limits, drawn and host-sampled rows, preemption,
//! mixed prefill, a failed pass, and a model that runs the host work before its pass (as a GPU
//! does, during it); checkpoints never see work pending.
use std::sync::Arc;

use super::codec::ByteCodec;
use super::core::EngineCore;
use super::error::EngineError;
use super::fake::FakeModel;
use super::forward::{ForwardModel, HostWork, PickedRows, RowPick};
use super::handle::{Engine, EngineConfig};
use super::hook::CheckpointHook;
use super::output::{FinishReason, Output};
use super::request::{Prompt, Request, SamplingParams};
use crate::model::batch::SeqChunk;
use crate::scheduler::Machine;
use crate::scheduler::seed::Scheduler;

pub(super) const VOCAB: usize = 300;
pub(super) const BS: usize = 16;
pub(super) const EOS: u32 = 299;

/// How a run's decode steps go: in turn, with their host work overlapped, or overlapped with
/// each step's successor launched ahead ([`super::ahead`]) and each prefill pass's successor
/// too ([`super::prefill_ahead`]), as on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    InTurn,
    Overlap,
    Ahead,
}

impl From<bool> for Mode {
    /// `overlap`: [`Mode::Overlap`], else [`Mode::InTurn`].
    fn from(overlap: bool) -> Self {
        if overlap { Mode::Overlap } else { Mode::InTurn }
    }
}

/// [`FakeModel`] that runs the overlapped host work before its pass, the order a GPU gives it
/// (the work runs while the launched pass computes), rather than the default's after.
struct HostFirst(FakeModel);

impl ForwardModel for HostFirst {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.0.forward(chunks)
    }
    fn forward_pick_overlapped(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        host.run();
        self.0.forward_pick(chunks, picks)
    }
}

/// What one request received: (token ids, streamed text, events, finish reason).
pub(super) type Received = (Vec<u32>, String, usize, FinishReason);

/// The requests of a run: greedy rows with and without stop strings and EOS, short and long
/// limits, and with `sampled` every fifth request sampled (seeded): drawn by the model
/// ([`RowPick::Draw`]), and every tenth sampled on the host (a repetition penalty; a step with such a
/// row runs in turn).
pub(super) fn requests(sampled: bool) -> Vec<Request> {
    (0..24usize)
        .map(|i| {
            let prompt: Vec<u32> = (0..5 + (i * 7) % 40)
                .map(|j| ((i * 31 + j * 7) % 250) as u32 + 1)
                .collect();
            let mut r = Request::new(Prompt::Tokens(prompt), 8 + (i * 13) % 50);
            r.sampling = SamplingParams::greedy();
            if sampled && i % 5 == 4 {
                r.sampling = SamplingParams {
                    temperature: 0.8,
                    top_p: 0.95,
                    seed: Some(i as u64),
                    repetition_penalty: if i % 10 == 9 { 1.1 } else { 1.0 },
                    ..SamplingParams::default()
                };
            }
            if i % 3 == 0 {
                r.stop = ["a", "e", "o", "x", "Q", "7"].map(String::from).to_vec();
                r.max_tokens = 50;
            }
            r.ignore_eos = i % 4 == 1;
            r
        })
        .collect()
}

/// Runs [`requests`] on `model` with `overlap` and the given cache size, prompt mixing and
/// host-sampled rows (a context of 2048);
/// returns what each request received, in submission order, and the preemptions.
pub(super) fn run<M: ForwardModel + 'static>(
    model: M,
    overlap: impl Into<Mode>,
    num_blocks: usize,
    mixed: bool,
    sampled: bool,
) -> (Vec<Received>, u64, std::time::Duration) {
    run_with(model, overlap, num_blocks, mixed, requests(sampled), 2048)
}

/// [`run`] with the requests and the context length given.
pub(super) fn run_with<M: ForwardModel + 'static>(
    model: M,
    overlap: impl Into<Mode>,
    num_blocks: usize,
    mixed: bool,
    requests: Vec<Request>,
    context_len: usize,
) -> (Vec<Received>, u64, std::time::Duration) {
    let mode = overlap.into();
    let engine = Engine::start::<Scheduler, _>(
        model,
        Arc::new(ByteCodec),
        EngineConfig {
            context_len,
            num_blocks,
            // Every request at once: after the prompts, only decode steps run (the longest
            // request is below the machine's 64 decode steps between checkpoints).
            max_batch: 32,
            max_prefill_tokens: 64,
            mixed_prefill: mixed,
            overlap_host: mode != Mode::InTurn,
            decode_ahead: mode == Mode::Ahead,
            prefill_ahead: mode == Mode::Ahead,
            eos_ids: vec![EOS],
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let streams = engine.submit_many(requests).unwrap();
    let got = streams
        .into_iter()
        .map(|s| {
            let (mut tokens, mut text, mut events) = (Vec::new(), String::new(), 0);
            for out in s.rx.iter() {
                let Output {
                    tokens: t,
                    text: x,
                    finished,
                    ..
                } = out;
                tokens.extend(t);
                text.push_str(&x);
                events += 1;
                if let Some(f) = finished {
                    assert_eq!(
                        f.output_tokens, tokens,
                        "the final accounting has every token"
                    );
                    assert_eq!(f.text, text, "the final text is the streamed text");
                    return (tokens, text, events, f.reason);
                }
            }
            panic!("a stream ended without its final event");
        })
        .collect();
    let stats = engine.shutdown().unwrap();
    (got, stats.preemptions, stats.decode_host.overlapped)
}

/// A fake model that ends sequences with EOS once they hold 60 tokens.
pub(super) fn fake(num_blocks: usize) -> FakeModel {
    let mut m = FakeModel::new(VOCAB, num_blocks, BS);
    m.eos = Some((EOS, 60));
    m
}

#[test]
fn overlapped_decode_gives_the_in_turn_outputs() {
    let zero = std::time::Duration::ZERO;
    for (mixed, sampled) in [(false, false), (true, false), (false, true), (true, true)] {
        let case = format!("mixed {mixed}, sampled rows {sampled}");
        let (want, _, none) = run(fake(256), false, 256, mixed, sampled);
        assert_eq!(none, zero);
        let mut reasons: Vec<String> = want.iter().map(|x| format!("{:?}", x.3)).collect();
        reasons.sort();
        reasons.dedup();
        // The run covers what the overlap must get right.
        assert_eq!(reasons, ["Eos", "Length", "Stop"], "{case}");
        let (got, _, overlapped) = run(fake(256), true, 256, mixed, sampled);
        assert_eq!(got, want, "{case}");
        assert!(overlapped > zero, "steps overlapped ({case})");
        let (host_first, _, overlapped) = run(HostFirst(fake(256)), true, 256, mixed, sampled);
        assert_eq!(host_first, want, "{case}");
        assert!(overlapped > zero, "steps overlapped ({case})");
    }
}

#[test]
fn overlapped_decode_survives_preemption() {
    // 10-14 blocks of 16 tokens for requests of up to 101 tokens (7 blocks): the batch preempts.
    for sampled in [false, true] {
        let (want, none, _) = run(fake(256), false, 256, false, sampled);
        assert_eq!(none, 0);
        let mut preempted = 0;
        for blocks in [10, 12, 14] {
            let case = format!("{blocks} blocks, sampled rows {sampled}");
            let (in_turn, in_turn_preemptions, _) =
                run(fake(blocks), false, blocks, false, sampled);
            assert_eq!(in_turn, want, "{case}");
            preempted += in_turn_preemptions;
            for host_first in [false, true] {
                let (got, preemptions, _) = if host_first {
                    run(HostFirst(fake(blocks)), true, blocks, false, sampled)
                } else {
                    run(fake(blocks), true, blocks, false, sampled)
                };
                assert_eq!(got, want, "{case}, host first {host_first}");
                // A sequence a late stop string ends holds its blocks one step longer; the
                // preemption that would need then does not run (`flush_freed_enough`). With
                // host-sampled rows admissions may shift by a step, so only greedy runs compare.
                assert!(
                    sampled || preemptions <= in_turn_preemptions,
                    "{case}, host first {host_first}: {preemptions} preemptions against {in_turn_preemptions}"
                );
            }
        }
        assert!(preempted > 0, "the small caches preempt");
    }
}

/// [`FakeModel`] whose forward call number `fail_at` (counting from 1) fails.
struct FailsOnce(FakeModel, usize);

impl ForwardModel for FailsOnce {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        let call = self.0.calls.load(std::sync::atomic::Ordering::Relaxed) + 1;
        let logits = self.0.forward(chunks)?;
        if call == self.1 {
            return Err("the device fell over".into());
        }
        Ok(logits)
    }
}

#[test]
fn a_failed_pass_ends_the_same_requests_with_the_same_outputs() {
    // The prompts take 10 prefill passes of 64 tokens: calls 12 and 30 are decode steps.
    for fail_at in [12, 30] {
        let want = run_with(
            FailsOnce(fake(256), fail_at),
            false,
            256,
            false,
            requests(false),
            2048,
        )
        .0;
        let errors = want
            .iter()
            .filter(|r| matches!(r.3, FinishReason::Error(_)))
            .count();
        assert!(errors > 0, "the failed pass ended requests");
        let got = run_with(
            FailsOnce(fake(256), fail_at),
            true,
            256,
            false,
            requests(false),
            2048,
        )
        .0;
        assert_eq!(got, want, "failure at call {fail_at}");
    }
}

#[test]
fn overlapped_decode_ends_at_the_context_as_in_turn() {
    let want = run_with(fake(256), false, 256, false, requests(false), 48).0;
    assert!(want.iter().any(|r| r.3 == FinishReason::ContextLength));
    assert_eq!(
        run_with(fake(256), true, 256, false, requests(false), 48).0,
        want
    );
}

/// Records, at each checkpoint, whether an overlapped step's work was still pending.
struct PendingAtCheckpoint(Arc<std::sync::Mutex<Vec<bool>>>);

impl CheckpointHook<EngineCore<FakeModel>> for PendingAtCheckpoint {
    fn checkpoint(&mut self, core: &mut EngineCore<FakeModel>) -> Result<(), EngineError> {
        if let Ok(mut v) = self.0.lock() {
            v.push(core.pending.is_some());
        }
        Ok(())
    }
    fn restore(&mut self, _core: &mut EngineCore<FakeModel>) -> Result<(), EngineError> {
        Ok(())
    }
}

/// Runs 4 greedy requests of three checkpoint intervals each on `model` with the host work
/// overlapped (and steps launched ahead when `ahead`), checkpoints going through `hook`; every
/// request ends by its length. Returns the engine's stats and the interval in decode steps.
pub(super) fn run_checkpointed<M: ForwardModel + 'static>(
    model: M,
    hook: Box<dyn CheckpointHook<EngineCore<M>>>,
    ahead: bool,
) -> (super::handle::EngineStats, usize) {
    let every = Scheduler::constant("checkpoint_every").unwrap_or(64) as usize;
    let engine = Engine::start_with_hook::<Scheduler, _>(
        model,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: 256,
            mixed_prefill: false,
            overlap_host: true,
            decode_ahead: ahead,
            prefill_ahead: ahead,
            ..EngineConfig::default()
        },
        Some(hook),
    )
    .unwrap();
    let requests: Vec<Request> = (0..4u32)
        .map(|i| {
            let mut r = Request::new(Prompt::Tokens(vec![10 + i; 8]), 3 * every);
            r.sampling = SamplingParams::greedy();
            r.ignore_eos = true;
            r
        })
        .collect();
    for s in engine.submit_many(requests).unwrap() {
        let last = s.rx.iter().last().and_then(|o| o.finished);
        assert_eq!(last.map(|f| f.reason), Some(FinishReason::Length));
    }
    (engine.shutdown().unwrap(), every)
}

#[test]
fn checkpoints_see_no_pending_work() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook = Box::new(PendingAtCheckpoint(seen.clone()));
    let (stats, _) = run_checkpointed(FakeModel::new(VOCAB, 256, BS), hook, false);
    assert!(stats.decode_host.overlapped > std::time::Duration::ZERO);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 2, "{} checkpoints", seen.len());
    assert!(
        seen.iter().all(|p| !p),
        "work pending at a checkpoint: {seen:?}"
    );
}

/// Seeded requests whose every row the model draws ([`RowPick::Draw`]) get the tokens the host
/// sampler gives the same requests when logprobs make it sample them from the downloaded rows:
/// the draw's spec carries the request's parameters and the RNG bits its next token takes.
#[test]
fn drawn_rows_take_the_host_samplers_tokens() {
    let seeded = |logprobs: Option<usize>| -> Vec<Request> {
        (0..12u64)
            .map(|i| {
                let prompt: Vec<u32> = (0..3 + i as u32 * 5)
                    .map(|j| (j * 11 + 3) % 250 + 1)
                    .collect();
                let mut r = Request::new(Prompt::Tokens(prompt), 20 + i as usize * 3);
                r.sampling = SamplingParams {
                    temperature: [0.6, 1.0, 1.4][i as usize % 3],
                    top_k: [0, 40][i as usize % 2],
                    top_p: [1.0, 0.9, 0.5][i as usize % 3],
                    min_p: [0.0, 0.05][(i as usize / 2) % 2],
                    seed: Some(1000 + i),
                    logprobs,
                    ..SamplingParams::default()
                };
                r.ignore_eos = true;
                r
            })
            .collect()
    };
    let tokens = |runs: Vec<Received>| -> Vec<Vec<u32>> { runs.into_iter().map(|r| r.0).collect() };
    let host = tokens(run_with(fake(256), false, 256, false, seeded(Some(0)), 2048).0);
    let distinct: std::collections::HashSet<u32> = host.iter().flatten().copied().collect();
    assert!(
        distinct.len() > 50,
        "the rows are sampled, not near-greedy: {}",
        distinct.len()
    );
    for overlap in [false, true] {
        let drawn = tokens(run_with(fake(256), overlap, 256, false, seeded(None), 2048).0);
        assert_eq!(drawn, host, "overlap {overlap}");
    }
}
