//! Load on the default model (CPU): 200 concurrent greedy streams each equal to the same request
//! run alone, and 50 clients that hang up after their first token leave no KV block and no running
//! sequence behind within a few seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::server::{MODEL, Server};

/// Distinct prompts; the 200 clients cycle through them.
const PROMPTS: &[&str] = &[
    "The capital of France is",
    "One, two, three,",
    "def fibonacci(n):",
    "The quick brown fox",
    "Water boils at",
    "Once upon a time",
    "The largest planet in the solar system is",
    "To make a cup of tea,",
];

fn body(prompt: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_streams_equal_solo_runs() {
    let Some(s) = Server::start(None, &["--kv-memory-mb", "512"]) else {
        return;
    };
    let s = Arc::new(s);
    let mut solo = Vec::new();
    for p in PROMPTS {
        solo.push(s.stream_completion(&body(p, 8)).await);
    }
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let p = PROMPTS[i % PROMPTS.len()];
                (i, s.stream_completion(&body(p, 8)).await)
            })
        })
        .collect();
    let all = tokio::time::timeout(
        Duration::from_secs(300),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("200 streams finish within 300 s");
    let elapsed = t0.elapsed();
    let mut differ = Vec::new();
    for r in all {
        let (i, text) = r.expect("client task");
        if text != solo[i % PROMPTS.len()] {
            differ.push((i, text));
        }
    }
    eprintln!(
        "200 concurrent streams of 8 tokens: {:.2} s",
        elapsed.as_secs_f64()
    );
    assert!(
        differ.is_empty(),
        "{} of 200 differ from their solo run, e.g. client {} got {:?}, alone {:?}",
        differ.len(),
        differ[0].0,
        differ[0].1,
        solo[differ[0].0 % PROMPTS.len()]
    );
    let length = [("finished_reason", "length")];
    let finished = s.settled("sov_request_success_total", &length, 208.0).await;
    assert_eq!(finished, Some(208.0), "every request finished by length");
    let generated = s
        .settled("sov_generation_tokens_total", &[], 208.0 * 8.0)
        .await;
    assert_eq!(generated, Some(208.0 * 8.0));
    let m = s.metrics().await;
    assert_eq!(m.value("sov_num_requests_running", &[]), Some(0.0));
    assert_eq!(m.value("sov_kv_blocks_used", &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn early_disconnects_free_the_kv_cache() {
    let Some(s) = Server::start(None, &["--kv-memory-mb", "512"]) else {
        return;
    };
    let s = Arc::new(s);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut b = body(PROMPTS[i % PROMPTS.len()], 1000);
                b["stream"] = Value::Bool(true);
                let mut res = s
                    .req(reqwest::Method::POST, "/v1/completions")
                    .json(&b)
                    .send()
                    .await
                    .expect("request sent");
                assert_eq!(res.status().as_u16(), 200);
                // Wait for a first token event, then hang up.
                let mut sse = super::server::Sse::default();
                while let Some(chunk) = res.chunk().await.expect("stream reads") {
                    if sse.feed(&chunk).iter().any(|e| e.contains("\"text\"")) {
                        break;
                    }
                }
                drop(res);
            })
        })
        .collect();
    for t in tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("50 clients get a first token within 120 s")
    {
        t.expect("client task");
    }
    let hung_up = Instant::now();
    let (mut kv, mut running, mut waiting) = (None, None, None);
    while hung_up.elapsed() < Duration::from_secs(5) {
        let m = s.metrics().await;
        kv = m.value("sov_kv_blocks_used", &[]);
        running = m.value("sov_num_requests_running", &[]);
        waiting = m.value("sov_num_requests_waiting", &[]);
        if (kv, running, waiting) == (Some(0.0), Some(0.0), Some(0.0)) {
            eprintln!(
                "50 disconnects freed everything in {} ms",
                hung_up.elapsed().as_millis()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "5 s after 50 clients hung up: kv_blocks_used {kv:?}, running {running:?}, waiting \
         {waiting:?}"
    );
}
