//! A reproducible measure of the engine's host work per decode step at batch 256 (or
//! `SOV_BENCH_HOST_BATCH`), the time an accelerator would idle between forward passes, with the
//! host work in turn and overlapped with the next pass (`EngineConfig::overlap_host`). Run it with
//! `[SOV_BENCH_HOST_BATCH=1024] cargo test --release -p sov --lib engine::host_bench -- --ignored --nocapture`.
//!
//! The real engine runs (its thread, the default machine `seed`, block manager, sampler, text
//! streams, output channels to one client thread per request, as `sov bench` has them) over a model
//! whose forward pass is a sleep, the accelerator's time during which the host is free, answering
//! greedy rows with pseudo-random ids of Llama-3's vocabulary decoded by the byte codec, as
//! `random:llama3-8b` does. Its overlapped pass runs the host work while it sleeps, as a GPU's
//! launched step computes. It prints microseconds per decode step by phase and the wall time per
//! decode step; it asserts only that every request got all its tokens, never a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::codec::ByteCodec;
use super::forward::{ForwardModel, HostWork, PickedRows, RowPick};
use super::handle::{Engine, EngineConfig};
use super::request::{Prompt, Request, SamplingParams};
use crate::model::batch::SeqChunk;
use crate::scheduler::seed::Scheduler;

const VOCAB: usize = 128_256;
/// Requests decoding at once unless `SOV_BENCH_HOST_BATCH` names another count.
const DEFAULT_BATCH: usize = 256;
const PROMPT: usize = 128;
const OUTPUT: usize = 256;
/// Stand-in for the accelerator's time per forward pass (an H200 decode step of the 8B shape at
/// batch 256 takes about 13 ms).
const FORWARD: Duration = Duration::from_millis(12);

/// Sleeps for [`FORWARD`], then picks each row's token by hashing its context end.
struct SleepingModel;

fn token_for(chunk: &SeqChunk<'_>) -> u32 {
    let last = u64::from(chunk.tokens.last().copied().unwrap_or(0));
    let pos = (chunk.start_pos + chunk.tokens.len()) as u64;
    let h = (last ^ (pos << 32))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29);
    (h % VOCAB as u64) as u32
}

impl ForwardModel for SleepingModel {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    /// One-hot rows at the picked token (only used for rows the host samples).
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        std::thread::sleep(FORWARD);
        let mut logits = vec![0.0f32; chunks.len() * VOCAB]; // [chunks, vocab]
        for (row, chunk) in chunks.iter().enumerate() {
            logits[row * VOCAB + token_for(chunk) as usize] = 1.0;
        }
        Ok(logits)
    }

    fn forward_pick(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        if picks.contains(&RowPick::Logits) {
            return super::forward::pick_on_host(VOCAB, self.forward(chunks)?, picks);
        }
        std::thread::sleep(FORWARD);
        Ok(picked_rows(chunks, picks))
    }

    /// The host work runs first, inside the pass's [`FORWARD`] (a GPU computing the launched
    /// step); the pass ends when both are done.
    fn forward_pick_overlapped(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        if picks.contains(&RowPick::Logits) {
            let picked = self.forward_pick(chunks, picks);
            host.run();
            return picked;
        }
        let t0 = Instant::now();
        host.run();
        std::thread::sleep(FORWARD.saturating_sub(t0.elapsed()));
        Ok(picked_rows(chunks, picks))
    }
}

/// The model's choice for every row it picks (greedy in this bench).
fn picked_rows(chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> PickedRows {
    PickedRows {
        tokens: chunks
            .iter()
            .zip(picks)
            .map(|(c, p)| p.is_token().then(|| token_for(c)))
            .collect(),
        logits: Vec::new(),
    }
}

/// Prefill passes of `batch` prompts of `PROMPT` tokens at 2048 prompt tokens a pass.
fn prefill_passes(batch: usize) -> usize {
    (batch * PROMPT).div_ceil(2048)
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release mode"]
fn host_time_per_decode_step_at_batch_256() {
    run_batch("greedy", SamplingParams::greedy(), OUTPUT, false);
    run_batch("greedy overlapped", SamplingParams::greedy(), OUTPUT, true);
}

/// Seeded sampling at temperature 1 (the default request): every row's logits go to the host
/// sampler. Fewer tokens, since each step samples 256 rows of 128K logits.
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release mode"]
fn host_time_per_sampled_decode_step_at_batch_256() {
    let sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    };
    run_batch("sampled t=1", sampling, 16, false);
}

/// Runs `batch` requests of `PROMPT` tokens and `output` new tokens with `sampling`, the host work
/// overlapped or not; prints the engine's host time per decode step.
fn run_batch(label: &str, sampling: SamplingParams, output: usize, overlap: bool) {
    let batch = std::env::var("SOV_BENCH_HOST_BATCH")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&b| b > 0)
        .unwrap_or(DEFAULT_BATCH);
    let engine = Engine::start::<Scheduler, _>(
        SleepingModel,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: batch * (PROMPT + output).div_ceil(16) + 64,
            max_batch: batch,
            max_prefill_tokens: 2048,
            mixed_prefill: false,
            overlap_host: overlap,
            context_len: 2048,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let requests: Vec<Request> = (0..batch)
        .map(|i| {
            let prompt = (0..PROMPT)
                .map(|j| ((i * 7919 + j * 104_729) % VOCAB) as u32)
                .collect();
            Request {
                sampling: sampling.clone(),
                ignore_eos: true,
                ..Request::new(Prompt::Tokens(prompt), output)
            }
        })
        .collect();
    let t0 = Instant::now();
    let receivers = engine.submit_many(requests).unwrap();
    // One client thread per request, blocked on its stream as `sov bench`'s are.
    let tokens: usize = std::thread::scope(|scope| {
        let clients: Vec<_> = receivers
            .into_iter()
            .map(|rx| {
                scope.spawn(move || {
                    let mut n = 0;
                    for out in rx.rx {
                        n += out.tokens.len();
                        if out.finished.is_some() {
                            break;
                        }
                    }
                    n
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap_or(0)).sum()
    });
    let wall = t0.elapsed();
    let stats = engine.shutdown().unwrap();
    assert_eq!(tokens, batch * output, "every request got all its tokens");
    let h = stats.decode_host;
    let other = stats
        .busy_time
        .saturating_sub(stats.forward_time + stats.checkpoint_time + h.total() + h.overlapped);
    println!(
        "host_bench {label} batch={batch} prompt={PROMPT} output={output} forward_sleep_ms={} \
         decode_steps={} wall_s={:.2}",
        FORWARD.as_millis(),
        h.steps,
        wall.as_secs_f64()
    );
    println!(
        "host_bench {label} us_per_decode_step: schedule={:.1} tokens={:.1} retire={:.1} total={:.1} \
         overlapped={:.1} other(prefill, loop)={:.1}",
        h.per_step_us(h.schedule),
        h.per_step_us(h.tokens),
        h.per_step_us(h.retire),
        h.per_step_us(h.total()),
        h.per_step_us(h.overlapped),
        h.per_step_us(other),
    );
    // The decode steps' share of the run: the busy time less the prefill passes' forward sleeps.
    let decode_busy = stats
        .busy_time
        .saturating_sub(FORWARD * prefill_passes(batch) as u32);
    println!(
        "host_bench {label} wall_us_per_decode_step={:.1} (forward sleep {} us)",
        decode_busy.as_secs_f64() * 1e6 / h.steps.max(1) as f64,
        FORWARD.as_micros()
    );
}
