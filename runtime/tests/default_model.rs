//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) end to end on the CPU backend with a
//! plain greedy loop: the chat answer names Paris, a raw story prompt continues in English, and
//! (ignored by default, run in release) decode speed at batch 1.
//!
//! Runs only when the model is in sov's cache (`sov::loader::cached_default_model`); otherwise
//! each test prints why it skipped. CI fetches the model first.
//!
//! Speed: `cargo test --release -p sov --test default_model -- --ignored --nocapture`

use std::time::Instant;

use sov::backend::cpu::CpuBackend;
use sov::loader::{ChatMessage, LoadedModel, cached_default_model, load_model};
use sov::model::batch::SeqChunk;
use sov::model::{KvCache, LlamaModel};

const BLOCK_SIZE: usize = 16;

struct Setup {
    loaded: LoadedModel,
    model: LlamaModel<CpuBackend>,
}

fn setup(test: &str) -> Option<Setup> {
    let Some(path) = sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| cached_default_model(&d.cache))
    else {
        println!(
            "{test}: skipped: the default model is not in sov's cache (run `sov` once, or .ci/run, to fetch it)"
        );
        return None;
    };
    let loaded = load_model(&path, false).expect("default model loads");
    let model =
        LlamaModel::new(CpuBackend::new(), &loaded.config, &loaded.tensors).expect("model builds");
    Some(Setup { loaded, model })
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of up to `max_new` tokens after `prompt`, stopping at an EOS id.
/// Returns the new tokens and the decode-only time per token in seconds.
fn greedy(s: &Setup, prompt: &[u32], max_new: usize) -> (Vec<u32>, f64) {
    let total = prompt.len() + max_new;
    let blocks = total.div_ceil(BLOCK_SIZE);
    let mut kv: KvCache<CpuBackend> = s.model.new_kv_cache(blocks, BLOCK_SIZE).expect("cache");
    // Blocks in reverse order, so the table is not the identity.
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let logits = s
        .model
        .forward(
            &mut kv,
            &[SeqChunk {
                tokens: prompt,
                start_pos: 0,
                block_table: &table,
            }],
        )
        .expect("prefill");
    let mut out = vec![argmax(&logits)];
    let start = Instant::now();
    while out.len() < max_new
        && !s
            .loaded
            .eos_token_ids
            .contains(out.last().expect("one token"))
    {
        let pos = prompt.len() + out.len() - 1;
        let last = [*out.last().expect("one token")];
        let logits = s
            .model
            .forward(
                &mut kv,
                &[SeqChunk {
                    tokens: &last,
                    start_pos: pos,
                    block_table: &table,
                }],
            )
            .expect("decode");
        out.push(argmax(&logits));
    }
    let per_token = start.elapsed().as_secs_f64() / (out.len() - 1).max(1) as f64;
    (out, per_token)
}

#[test]
fn chat_answer_names_paris() {
    let Some(s) = setup("chat_answer_names_paris") else {
        return;
    };
    let template = s
        .loaded
        .chat_template
        .as_ref()
        .expect("SmolLM2 ships a chat template");
    let text = template
        .apply(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .expect("template renders");
    let prompt = s.loaded.tokenizer.encode(&text, false).expect("encode");
    let (tokens, _) = greedy(&s, &prompt, 48);
    let answer = s
        .loaded
        .tokenizer
        .decode_skip_special(&tokens)
        .expect("decode");
    println!("answer: {answer:?}");
    assert!(
        answer.contains("Paris"),
        "answer does not name Paris: {answer:?}"
    );
    assert!(
        answer.split_whitespace().count() >= 3,
        "not a sentence: {answer:?}"
    );
}

#[test]
fn story_prompt_continues_in_english() {
    let Some(s) = setup("story_prompt_continues_in_english") else {
        return;
    };
    let prompt_text = "Once upon a time, there was a little";
    let prompt = s
        .loaded
        .tokenizer
        .encode(prompt_text, true)
        .expect("encode");
    let (tokens, _) = greedy(&s, &prompt, 32);
    let text = s
        .loaded
        .tokenizer
        .decode_skip_special(&tokens)
        .expect("decode");
    println!("{prompt_text}{text}");
    let words: Vec<&str> = text.split_whitespace().collect();
    let wordlike = words
        .iter()
        .filter(|w| {
            w.trim_matches(|c: char| c.is_ascii_punctuation())
                .chars()
                .all(|c| c.is_ascii_alphabetic())
        })
        .count();
    assert!(words.len() >= 10, "too short: {text:?}");
    assert!(
        wordlike * 10 >= words.len() * 8,
        "mostly not English words: {text:?}"
    );
    let ascii = text.chars().filter(|c| c.is_ascii()).count();
    assert!(
        ascii * 100 >= text.chars().count() * 95,
        "mostly non-ASCII: {text:?}"
    );
    let mut distinct = tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() >= 10, "degenerate repetition: {text:?}");
    // The first word after "a little" continues the noun phrase: a lowercase English word.
    let first = words[0].trim_matches(|c: char| c.is_ascii_punctuation());
    assert!(
        first.chars().all(|c| c.is_ascii_lowercase()),
        "odd continuation: {text:?}"
    );
}

/// CPU time of every thread of this process so far, in seconds (Linux `schedstat`; `None`
/// elsewhere). Lets the benchmark show what decode costs apart from other load on the machine.
fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}

/// Decode of `n` tokens after `prompt` at batch 1: (prefill seconds, decode seconds, decode
/// CPU seconds).
fn timed_decode(s: &Setup, prompt: &[u32], n: usize) -> (f64, f64, Option<f64>) {
    let blocks = (prompt.len() + n).div_ceil(BLOCK_SIZE);
    let mut kv: KvCache<CpuBackend> = s.model.new_kv_cache(blocks, BLOCK_SIZE).expect("cache");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let t0 = Instant::now();
    let logits = s
        .model
        .forward(
            &mut kv,
            &[SeqChunk {
                tokens: prompt,
                start_pos: 0,
                block_table: &table,
            }],
        )
        .expect("prefill");
    let prefill = t0.elapsed().as_secs_f64();
    let mut next = argmax(&logits);
    let cpu0 = process_cpu_seconds();
    let t1 = Instant::now();
    for i in 0..n {
        let chunk = [SeqChunk {
            tokens: &[next],
            start_pos: prompt.len() + i,
            block_table: &table,
        }];
        next = argmax(&s.model.forward(&mut kv, &chunk).expect("decode"));
    }
    let decode = t1.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds().zip(cpu0).map(|(b, a)| b - a);
    (prefill, decode, cpu)
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn decode_speed_batch_1() {
    let Some(s) = setup("decode_speed_batch_1") else {
        return;
    };
    let threads = s.model.backend().threads();
    let story = s
        .loaded
        .tokenizer
        .encode("Once upon a time, there was a little", true)
        .expect("encode");
    greedy(&s, &story, 8); // warm-up
    let long: Vec<u32> = story.iter().cycle().take(128).copied().collect();
    for (label, prompt) in [("short prompt", &story), ("128-token prompt", &long)] {
        let n = 128;
        let (prefill, decode, cpu) = timed_decode(&s, prompt, n);
        println!(
            "default model, CPU backend, {threads} threads, {label}: prefill {} tokens in {:.1} ms ({:.0} tok/s); \
             decode {n} tokens at batch 1: {:.1} tok/s ({:.2} ms/token wall{})",
            prompt.len(),
            prefill * 1e3,
            prompt.len() as f64 / prefill,
            n as f64 / decode,
            decode * 1e3 / n as f64,
            cpu.map(|c| format!(
                ", {:.2} ms/token CPU time over all threads",
                c * 1e3 / n as f64
            ))
            .unwrap_or_default(),
        );
    }
}
