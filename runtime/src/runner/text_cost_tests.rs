//! Detokenization cost per token, the real tokenizer against the byte codec (ignored by default;
//! run with `cargo test --release -p sov --lib runner::text_cost_tests -- --ignored --nocapture`).
//! It lives with [`TokenizerCodec`], the adapter it measures; `engine::host_bench` measures the
//! rest of the engine's host work per step.

use std::time::Instant;

use super::TokenizerCodec;
use crate::engine::codec::{ByteCodec, TextCodec};
use crate::engine::text::TextStream;

/// Llama-3's vocabulary, for the byte codec's ids.
const VOCAB: usize = 128_256;
/// Streams, as at a batch-256 decode step.
const BATCH: usize = 256;
/// Tokens pushed per stream.
const OUTPUT: usize = 256;

/// Detokenization cost per token with a real tokenizer (the cached default model's; skipped with a
/// message when it is not cached) against the byte codec, over `BATCH` streams of random ids.
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release mode"]
fn text_stream_cost_per_token() {
    let Some(path) = crate::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| crate::loader::cached_default_model(&d.cache))
    else {
        println!("text_stream_cost: skipped, the default model is not cached");
        return;
    };
    let loaded = crate::loader::load_model(&path, false).unwrap();
    let vocab = loaded.config.vocab_size;
    let real = TokenizerCodec {
        tokenizer: loaded.tokenizer,
        add_special: false,
    };
    let measure = |codec: &dyn TextCodec, vocab: usize| {
        let mut streams: Vec<TextStream> = (0..BATCH)
            .map(|i| TextStream::new(&[(i % vocab) as u32], Vec::new()))
            .collect();
        let t0 = Instant::now();
        let mut bytes = 0;
        for step in 0..OUTPUT {
            for (i, s) in streams.iter_mut().enumerate() {
                let id = (((i * 7919 + step * 104_729) ^ (step << 7)) % vocab) as u32;
                bytes += s.push(codec, id).unwrap().text.len();
            }
        }
        let per_token = t0.elapsed().as_secs_f64() * 1e6 / (BATCH * OUTPUT) as f64;
        (per_token, bytes)
    };
    let (real_us, real_bytes) = measure(&real, vocab);
    let (byte_us, byte_bytes) = measure(&ByteCodec, VOCAB);
    println!(
        "text_stream_cost us_per_token: tokenizer({})={real_us:.2} ({real_bytes} bytes) \
         byte_codec={byte_us:.3} ({byte_bytes} bytes); at batch {BATCH}: {:.0} / {:.0} us per step",
        loaded.name,
        real_us * BATCH as f64,
        byte_us * BATCH as f64
    );
}
