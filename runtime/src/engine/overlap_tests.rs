//! Decode steps with their host work overlapped ([`super::overlap`]) against the in-turn path on
//! the deterministic [`FakeModel`]: every request's tokens, streamed text, events and finish reason
//! are the same, with stop strings, EOS, length limits, host-sampled rows, preemption, mixed
//! prefill, and a model that runs the host work before its pass (as a GPU does, during it).

use std::sync::Arc;

use super::codec::ByteCodec;
use super::fake::FakeModel;
use super::forward::{ForwardModel, HostWork, PickedRows, RowPick};
use super::handle::{Engine, EngineConfig};
use super::output::{FinishReason, Output};
use super::request::{Prompt, Request, SamplingParams};
use crate::model::batch::SeqChunk;
use crate::scheduler::seed::Scheduler;

const VOCAB: usize = 300;
const BS: usize = 16;
const EOS: u32 = 299;

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
type Received = (Vec<u32>, String, usize, FinishReason);

/// The requests of a run: greedy rows with and without stop strings and EOS, short and long
/// limits, and with `sampled` every fifth request sampled on the host (seeded; a step with such a
/// row runs in turn).
fn requests(sampled: bool) -> Vec<Request> {
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
/// host-sampled rows;
/// returns what each request received, in submission order, and the preemptions.
fn run<M: ForwardModel + 'static>(
    model: M,
    overlap: bool,
    num_blocks: usize,
    mixed: bool,
    sampled: bool,
) -> (Vec<Received>, u64, std::time::Duration) {
    let engine = Engine::start::<Scheduler, _>(
        model,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks,
            // Every request at once: after the prompts, only decode steps run (the longest
            // request is below the machine's 64 decode steps between checkpoints).
            max_batch: 32,
            max_prefill_tokens: 64,
            mixed_prefill: mixed,
            overlap_host: overlap,
            eos_ids: vec![EOS],
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let streams = engine.submit_many(requests(sampled)).unwrap();
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
fn fake(num_blocks: usize) -> FakeModel {
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
    // 12 blocks of 16 tokens for requests of up to 101 tokens (7 blocks): the batch preempts.
    for sampled in [false, true] {
        let (want, none, _) = run(fake(256), false, 256, false, sampled);
        assert_eq!(none, 0);
        for host_first in [false, true] {
            let (got, preemptions, _) = if host_first {
                run(HostFirst(fake(12)), true, 12, false, sampled)
            } else {
                run(fake(12), true, 12, false, sampled)
            };
            assert!(preemptions > 0, "the small cache preempts");
            assert_eq!(
                got, want,
                "host first: {host_first}, sampled rows {sampled}"
            );
        }
    }
}
