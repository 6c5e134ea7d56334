//! A reproducible measure of the engine's host work per decode step at batch 256, the time an
//! accelerator would idle between forward passes. Run it with
//! `cargo test --release -p sov --lib engine::host_bench -- --ignored --nocapture`.
//!
//! The real engine runs (its thread, the default machine `seed`, block manager, sampler, text
//! streams, output channels to one client thread per request, as `sov bench` has them) over a model
//! whose forward pass is a sleep, the accelerator's time during which the host is free, answering
//! greedy rows with pseudo-random ids of Llama-3's vocabulary decoded by the byte codec, as
//! `random:llama3-8b` does. It prints microseconds per decode step by phase; it asserts only that
//! every request got all its tokens, never a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::codec::ByteCodec;
use super::forward::{ForwardModel, PickedRows, RowPick};
use super::handle::{Engine, EngineConfig};
use super::request::{Prompt, Request, SamplingParams};
use crate::model::batch::SeqChunk;
use crate::scheduler::seed::Scheduler;

const VOCAB: usize = 128_256;
const BATCH: usize = 256;
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
        Ok(PickedRows {
            tokens: chunks
                .iter()
                .zip(picks)
                .map(|(c, p)| (*p == RowPick::Argmax).then(|| token_for(c)))
                .collect(),
            logits: Vec::new(),
        })
    }
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release mode"]
fn host_time_per_decode_step_at_batch_256() {
    run_batch("greedy", SamplingParams::greedy(), OUTPUT);
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
    run_batch("sampled t=1", sampling, 16);
}

/// Runs `BATCH` requests of `PROMPT` tokens and `output` new tokens with `sampling`; prints the
/// engine's host time per decode step.
fn run_batch(label: &str, sampling: SamplingParams, output: usize) {
    let engine = Engine::start::<Scheduler, _>(
        SleepingModel,
        Arc::new(ByteCodec),
        EngineConfig {
            num_blocks: BATCH * (PROMPT + output).div_ceil(16) + 64,
            max_batch: BATCH,
            max_prefill_tokens: 2048,
            context_len: 2048,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let requests: Vec<Request> = (0..BATCH)
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
    assert_eq!(tokens, BATCH * output, "every request got all its tokens");
    let h = stats.decode_host;
    let other = stats
        .busy_time
        .saturating_sub(stats.forward_time + stats.checkpoint_time + h.total());
    println!(
        "host_bench {label} batch={BATCH} prompt={PROMPT} output={output} forward_sleep_ms={} \
         decode_steps={} wall_s={:.2}",
        FORWARD.as_millis(),
        h.steps,
        wall.as_secs_f64()
    );
    println!(
        "host_bench {label} us_per_decode_step: schedule={:.1} tokens={:.1} retire={:.1} total={:.1} \
         other(prefill, loop)={:.1}",
        h.per_step_us(h.schedule),
        h.per_step_us(h.tokens),
        h.per_step_us(h.retire),
        h.per_step_us(h.total()),
        h.per_step_us(other),
    );
}
