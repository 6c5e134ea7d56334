//! Decode steps launched ahead on a GPU (`engine::ahead`: step N + 1 enqueued before step N's
//! tokens reach the host, its token ids fed on the device) give every request the tokens of steps
//! run one at a time, through the whole engine: greedy and seeded drawn rows, requests of
//! different lengths leaving the batch at different steps, more requests than the batch holds.
//! Skips, saying why, without a CUDA device.

mod common;

use common::engine_stream::wait;
use sov::app::Device;
use sov::app::start::{EngineOptions, KvBudget, ModelParts, start_engine};
use sov::backend::cuda::CudaBackend;
use sov::engine::{Prompt, Request, SamplingParams};
use sov::model::random::{WeightDtype, tiny_config};
use sov::scheduler::seed::Scheduler;

/// 24 prompts; every third request sampled with its own seed; lengths 9..=40.
fn requests() -> Vec<Request> {
    (0..24usize)
        .map(|i| {
            let prompt: Vec<u32> = (0..(5 + 7 * (i % 6)))
                .map(|j| ((i * 37 + j * 13) % 400) as u32 + 30)
                .collect();
            let mut r = Request::new(Prompt::Tokens(prompt), 9 + (i * 11) % 32);
            r.ignore_eos = true;
            r.sampling = if i % 3 == 2 {
                SamplingParams {
                    temperature: 0.8,
                    top_p: 0.9,
                    seed: Some(100 + i as u64),
                    ..SamplingParams::default()
                }
            } else {
                SamplingParams::greedy()
            };
            r
        })
        .collect()
}

/// Every request's tokens, and the decode steps launched ahead / run, with `ahead` on or off.
fn run(ahead: bool) -> (Vec<Vec<u32>>, u64, u64) {
    let started = start_engine::<Scheduler>(
        ModelParts::random(tiny_config(), 11, WeightDtype::BF16, "tiny"),
        &EngineOptions {
            device: Device::Cuda(0),
            kv_budget: KvBudget::Bytes(64 << 20),
            max_batch: 16,
            overlap_host: true,
            decode_ahead: ahead,
            ..EngineOptions::default()
        },
    )
    .expect("engine starts on the GPU");
    // All at once, so both runs schedule the same batches.
    let streams = started.engine.submit_many(requests()).expect("submitted");
    let tokens = streams.iter().map(|s| wait(&s.rx).output_tokens).collect();
    let stats = started.engine.shutdown().expect("engine stops");
    (tokens, stats.decode_host.ahead, stats.decode_steps)
}

#[test]
fn decode_ahead_gives_the_tokens_of_steps_run_one_at_a_time() {
    if let Err(e) = CudaBackend::new(0) {
        println!("skipped: no CUDA device ({e})");
        return;
    }
    let (want, none, steps) = run(false);
    assert_eq!(none, 0);
    let (got, ahead, ahead_run_steps) = run(true);
    assert_eq!(got, want, "tokens with decode steps launched ahead");
    assert_eq!(ahead_run_steps, steps, "the same decode steps");
    assert!(ahead > 0, "no step went ahead");
    println!("{ahead} of {steps} decode steps launched ahead; every request's tokens the same");
}
