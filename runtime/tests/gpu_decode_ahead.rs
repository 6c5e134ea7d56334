//! Decode steps launched ahead on a GPU (`engine::ahead`: step N + 1 enqueued before step N's
//! tokens reach the host, its token ids fed on the device), and prefill passes launched ahead
//! (`engine::prefill_ahead`), give every request the tokens of steps and passes run one at a
//! time, through the whole engine, with prompts in passes of their own and mixed into decode
//! steps: greedy and seeded drawn rows, requests of
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

/// What a run gave: every request's tokens, the decode steps launched ahead and run, and the
/// prefill passes launched ahead.
struct Ran {
    tokens: Vec<Vec<u32>>,
    decode_ahead: u64,
    decode_steps: u64,
    prefill_ahead: u64,
}

/// A run with steps and passes launched ahead (`ahead`) or not, prompts mixed into decode steps
/// (`mixed`) or in prefill passes of their own (the GPU's default).
fn run(ahead: bool, mixed: bool) -> Ran {
    let started = start_engine::<Scheduler>(
        ModelParts::random(tiny_config(), 11, WeightDtype::BF16, "tiny"),
        &EngineOptions {
            device: Device::Cuda(0),
            kv_budget: KvBudget::Bytes(64 << 20),
            max_batch: 16,
            mixed_prefill: mixed,
            overlap_host: true,
            decode_ahead: ahead,
            prefill_ahead: ahead,
            // Prompts of 5..=40 tokens, 64 a pass: several prefill passes, some prompts split.
            max_prefill_tokens: 64,
            ..EngineOptions::default()
        },
    )
    .expect("engine starts on the GPU");
    // All at once, so both runs schedule the same batches.
    let streams = started.engine.submit_many(requests()).expect("submitted");
    let tokens = streams.iter().map(|s| wait(&s.rx).output_tokens).collect();
    let stats = started.engine.shutdown().expect("engine stops");
    Ran {
        tokens,
        decode_ahead: stats.decode_host.ahead,
        decode_steps: stats.decode_steps,
        prefill_ahead: stats.prefill_passes_ahead,
    }
}

#[test]
fn decode_ahead_gives_the_tokens_of_steps_run_one_at_a_time() {
    if let Err(e) = CudaBackend::new(0) {
        println!("skipped: no CUDA device ({e})");
        return;
    }
    for mixed in [false, true] {
        let want = run(false, mixed);
        assert_eq!((want.decode_ahead, want.prefill_ahead), (0, 0));
        let got = run(true, mixed);
        assert_eq!(
            got.tokens, want.tokens,
            "tokens launched ahead (mixed {mixed})"
        );
        assert_eq!(got.decode_steps, want.decode_steps, "the same decode steps");
        assert!(got.decode_ahead > 0, "no step went ahead (mixed {mixed})");
        assert!(
            mixed || got.prefill_ahead > 0,
            "no prefill pass went ahead (mixed {mixed})"
        );
        println!(
            "mixed {mixed}: {} of {} decode steps and {} prefill passes launched ahead; every \
             request's tokens the same",
            got.decode_ahead, got.decode_steps, got.prefill_ahead
        );
    }
}
