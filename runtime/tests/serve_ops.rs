//! `sov serve` operations end to end, against the real binary on the default model (CPU; each
//! test skips, saying why, when the model is not in sov's cache):
//!
//! - `/metrics` is valid Prometheus text with vLLM-style names and types, and its counters move
//!   after a request;
//! - bad input gets its status and an OpenAI-shaped error (`{"error": {message, type, param,
//!   code}}`);
//! - `POST /admin/suspend` turns new requests away with 503 + `Retry-After`, pauses a running
//!   stream without losing it, `POST /admin/resume` serves again; the admin slots and
//!   `sov slots get/set` on the run directory see the same control surface;
//! - `/health`, `/v1/models`, `/tokenize`, `/detokenize`;
//! - load (in `serve_ops/load.rs`): 200 concurrent streams equal to solo runs, and early
//!   disconnects free every KV block.

#[path = "serve_ops/load.rs"]
mod load;
#[path = "serve_ops/prom.rs"]
mod prom;
#[path = "serve_ops/server.rs"]
mod server;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use server::{MODEL, Server};

const KEY: &str = "test-key-123";

/// Asserts an OpenAI-shaped error with `status`; returns its `error` object.
fn openai_error(what: &str, got: (u16, Value), status: u16) -> Value {
    let (code, body) = got;
    assert_eq!(code, status, "{what}: body {body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: no message in {body}"
    );
    assert!(e["type"].is_string(), "{what}: no type in {body}");
    let obj = e.as_object().expect("error is an object");
    assert!(
        obj.contains_key("param") && obj.contains_key("code"),
        "{what}: param/code missing in {body}"
    );
    e.clone()
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
                          "temperature": 0});
    if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

const NAMES: &[(&str, &str)] = &[
    ("sov_num_requests_running", "gauge"),
    ("sov_num_requests_waiting", "gauge"),
    ("sov_kv_blocks_used", "gauge"),
    ("sov_kv_blocks_total", "gauge"),
    ("sov_receipt_height", "gauge"),
    ("sov_prompt_tokens_total", "counter"),
    ("sov_generation_tokens_total", "counter"),
    ("sov_request_success_total", "counter"),
    ("sov_num_preemptions_total", "counter"),
    ("sov_checkpoints_total", "counter"),
    ("sov_spec_decode_accepted_tokens_total", "counter"),
    ("sov_kv_blocks_swapped_out_total", "counter"),
    ("sov_kv_blocks_swapped_in_total", "counter"),
    ("sov_kv_blocks_spilled_total", "counter"),
    ("sov_num_recomputed_sequences_total", "counter"),
    ("sov_prefix_cache_queries_total", "counter"),
    ("sov_prefix_cache_hits_total", "counter"),
];

const HISTOGRAMS: &[&str] = &[
    "sov_time_to_first_token_seconds",
    "sov_inter_token_latency_seconds",
    "sov_e2e_request_latency_seconds",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_info_and_bad_input() {
    let Some(s) = Server::start(Some(KEY), &["--kv-memory-mb", "256"]) else {
        return;
    };
    // Health is public; everything else wants the key.
    let health = s.http.get(s.url("/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "{}", s.log());
    let no_key = s.http.get(s.url("/metrics")).send().await.unwrap();
    let got = (
        no_key.status().as_u16(),
        no_key.json().await.unwrap_or(Value::Null),
    );
    openai_error("missing key", got, 401);
    let wrong = s
        .http
        .post(s.url("/v1/completions"))
        .bearer_auth("wrong")
        .json(&completion(json!({})))
        .send()
        .await
        .unwrap();
    let got = (
        wrong.status().as_u16(),
        wrong.json().await.unwrap_or(Value::Null),
    );
    assert_eq!(
        openai_error("wrong key", got, 401)["code"],
        "invalid_api_key"
    );

    // Before any request: every family is declared with its type, counters at 0.
    let before = s.metrics().await;
    for (name, ty) in NAMES {
        assert_eq!(before.type_of(name), Some(*ty), "{name}");
    }
    assert_eq!(before.value("sov_num_requests_running", &[]), Some(0.0));
    assert_eq!(before.value("sov_kv_blocks_used", &[]), Some(0.0));
    assert!(before.value("sov_kv_blocks_total", &[]).unwrap_or(0.0) > 0.0);
    let finished = [("finished_reason", "length")];
    assert_eq!(
        before.value("sov_request_success_total", &finished),
        Some(0.0)
    );
    assert_eq!(before.value("sov_generation_tokens_total", &[]), Some(0.0));

    // One request that runs into max_tokens, streamed (so inter-token gaps are measured).
    let text = s
        .stream_completion(&completion(json!({"max_tokens": 5, "ignore_eos": true})))
        .await;
    assert!(!text.is_empty(), "empty completion");
    let done = s.settled("sov_request_success_total", &finished, 1.0).await;
    assert_eq!(done, Some(1.0));
    let generated = s.settled("sov_generation_tokens_total", &[], 5.0).await;
    assert_eq!(generated, Some(5.0));
    let after = s.metrics().await;
    assert!(after.value("sov_prompt_tokens_total", &[]).unwrap_or(0.0) >= 5.0);
    for h in HISTOGRAMS {
        assert_eq!(after.type_of(h), Some("histogram"), "{h}");
        let inf = after.value(&format!("{h}_bucket"), &[("le", "+Inf")]);
        let count = after.value(&format!("{h}_count"), &[]);
        assert!(count.unwrap_or(0.0) >= 1.0, "{h}_count: {count:?}");
        assert_eq!(inf, count, "{h}: +Inf bucket equals the count");
    }
    assert_eq!(
        after.value("sov_inter_token_latency_seconds_count", &[]),
        Some(4.0)
    );
    assert_eq!(after.value("sov_num_requests_running", &[]), Some(0.0));

    info_routes(&s).await;
    bad_input(&s).await;
}

async fn info_routes(s: &Server) {
    let (status, text) = s.get_text("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    let max_len = models["data"][0]["max_model_len"]
        .as_u64()
        .expect("max_model_len");
    assert!(max_len >= 512, "{models}");

    let (status, tok) = s.post("/tokenize", &json!({"prompt": "Hello world"})).await;
    assert_eq!(status, 200, "{tok}");
    let tokens = tok["tokens"].as_array().expect("tokens").clone();
    assert_eq!(tok["count"].as_u64(), Some(tokens.len() as u64));
    assert_eq!(tok["max_model_len"].as_u64(), Some(max_len));
    let (status, detok) = s.post("/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(status, 200, "{detok}");
    assert_eq!(detok["prompt"], "Hello world");
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let (status, tok) = s.post("/tokenize", &chat).await;
    assert_eq!(status, 200, "{tok}");
    let (_, detok) = s
        .post("/detokenize", &json!({"tokens": tok["tokens"]}))
        .await;
    let rendered = detok["prompt"].as_str().unwrap_or_default().to_string();
    assert!(
        rendered.contains("Hi") && rendered.len() > 2,
        "{rendered:?}"
    );
    let got = s
        .post("/tokenize", &json!({"prompt": "x", "model": "nope"}))
        .await;
    openai_error("tokenize, unknown model", got, 404);
    let got = s.post("/detokenize", &json!({"tokens": [u32::MAX]})).await;
    openai_error("detokenize, id past the vocabulary", got, 400);
}

async fn bad_input(s: &Server) {
    let raw = |body: Vec<u8>| async move {
        let res = s
            .req(Method::POST, "/v1/completions")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        match res {
            Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
            Err(e) => panic!("request failed: {e}"),
        }
    };
    openai_error("malformed JSON", raw(b"{\"prompt\": ".to_vec()).await, 400);
    let wrong_type = completion(json!({"max_tokens": "eight"}));
    openai_error(
        "max_tokens a string",
        s.post("/v1/completions", &wrong_type).await,
        422,
    );
    let wrong_type = completion(json!({"temperature": [1]}));
    openai_error(
        "temperature a list",
        s.post("/v1/completions", &wrong_type).await,
        422,
    );
    openai_error("64 MiB body", s.post_huge(64 << 20).await, 413);

    let cases: &[(&str, Value, u16, &str)] = &[
        (
            "negative max_tokens",
            json!({"max_tokens": -1}),
            400,
            "max_tokens",
        ),
        (
            "huge max_tokens",
            json!({"max_tokens": 1u64 << 40}),
            400,
            // OpenAI names `messages` in its context_length_exceeded error.
            "max_tokens|messages",
        ),
        (
            "temperature above 2",
            json!({"temperature": 2.5}),
            400,
            "temperature",
        ),
        (
            "negative temperature",
            json!({"temperature": -0.1}),
            400,
            "temperature",
        ),
        ("top_p above 1", json!({"top_p": 1.5}), 400, "top_p"),
        ("top_p 0", json!({"top_p": 0.0}), 400, "top_p"),
        ("unknown model", json!({"model": "gpt-9"}), 404, "model"),
        (
            "stream_options without stream",
            json!({"stream_options": {"include_usage": true}}),
            400,
            "stream_options",
        ),
        (
            "invalid JSON schema",
            json!({"response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
            400,
            "response_format",
        ),
    ];
    for (what, extra, status, param) in cases {
        let e = openai_error(
            what,
            s.post("/v1/completions", &completion(extra.clone())).await,
            *status,
        );
        let got = e["param"].as_str().unwrap_or_default();
        assert!(
            param.split('|').any(|p| p == got),
            "{what}: param {got:?}: {e}"
        );
    }
    // Chat takes the same checks.
    let chat = json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]});
    openai_error(
        "chat, unknown model",
        s.post("/v1/chat/completions", &chat).await,
        404,
    );

    // A prompt longer than the context.
    let (_, models) = s.get_text("/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    let max_len = models["data"][0]["max_model_len"].as_u64().unwrap_or(8192) as usize;
    let long = vec![" hello"; max_len + 16].concat();
    let (_, tok) = s.post("/tokenize", &json!({"prompt": long})).await;
    assert!(
        tok["count"].as_u64().unwrap_or(0) as usize > max_len,
        "{}",
        tok["count"]
    );
    let got = s
        .post("/v1/completions", &completion(json!({"prompt": long})))
        .await;
    openai_error("prompt over the context", got, 400);

    // None of these left anything running.
    let m = s.metrics().await;
    assert_eq!(m.value("sov_num_requests_running", &[]), Some(0.0));
    assert_eq!(m.value("sov_kv_blocks_used", &[]), Some(0.0));
}

fn sov_slots(s: &Server, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sov"))
        .arg("slots")
        .args(args)
        .arg("--run")
        .arg(&s.run_dir)
        .output()
        .expect("sov slots runs");
    assert!(
        out.status.success(),
        "sov slots {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn admin_slots(s: &Server) -> Value {
    let (status, text) = s.get_text("/admin/slots").await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_pauses_and_resume_serves() {
    let Some(s) = Server::start(None, &["--kv-memory-mb", "256"]) else {
        return;
    };
    let slots = admin_slots(&s).await;
    assert_eq!(slots["phase"], "ready");
    assert_eq!(slots["slots"]["power_state"], "active");
    for name in [
        "pending_request_count",
        "batch_size",
        "kv_blocks_used",
        "receipt_digest",
    ] {
        assert!(
            slots["slots"].get(name).is_some(),
            "{name} missing: {slots}"
        );
    }

    // The admin API and `sov slots` on the run directory are one control surface.
    let put = s
        .req(Method::PUT, "/admin/slots/speculative_draft_len")
        .json(&json!({"value": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    assert_eq!(sov_slots(&s, &["get", "speculative_draft_len"]), "3");
    sov_slots(&s, &["set", "speculative_draft_len", "0"]);
    assert_eq!(admin_slots(&s).await["slots"]["speculative_draft_len"], 0);
    let put = s
        .req(Method::PUT, "/admin/slots/kv_blocks_used")
        .json(&json!({"value": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.status().as_u16(),
        400,
        "engine-kept slots are not writable"
    );
    let put = s
        .req(Method::PUT, "/admin/slots/power_state")
        .json(&json!({"value": "sideways"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 400, "a bad enum value");

    // A long stream is running when the server is suspended.
    let body = completion(json!({"max_tokens": 200, "ignore_eos": true, "stream": true}));
    let mut stream = s
        .req(Method::POST, "/v1/completions")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    let mut sse = server::Sse::default();
    let mut text = String::new();
    let mut done = false;
    let first = stream.chunk().await.unwrap().expect("a first event");
    done |= feed(&mut sse, &first, &mut text);
    let (status, _) = s.post("/admin/suspend", &json!({})).await;
    assert_eq!(status, 200);
    // `suspend` until the engine's next step takes the interrupt, whose updates set it back to
    // `active` while the machine sits in `suspended` (a race the test must not depend on).
    let power = sov_slots(&s, &["get", "power_state"]);
    assert!(power == "suspend" || power == "active", "{power}");

    let res = s
        .req(Method::POST, "/v1/completions")
        .json(&completion(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 503);
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok());
    assert!(
        retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|n| n > 0)),
        "Retry-After: {retry:?}"
    );
    let got = (503, res.json().await.unwrap_or(Value::Null));
    openai_error("suspended", got, 503);
    let (status, _) = s.get_text("/health").await;
    assert_eq!(status, 503, "not ready while suspended");

    // Paused: the running count stays, and no (or at most one in-flight) event arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused_at = text.len();
    let mut late = Vec::new();
    let waited = tokio::time::timeout(Duration::from_millis(700), async {
        while let Ok(Some(c)) = stream.chunk().await {
            late.push(c);
        }
    })
    .await;
    assert!(waited.is_err(), "the stream ended while suspended");
    for c in &late {
        done |= feed(&mut sse, c, &mut text);
    }
    assert!(!done, "the stream finished while suspended");
    let m = s.metrics().await;
    assert_eq!(m.value("sov_num_requests_running", &[]), Some(1.0));

    // Resume through the slot route (what `sov slots set power_state resume` writes).
    let res = s
        .req(Method::PUT, "/admin/slots/power_state")
        .json(&json!({"value": "resume"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["phase"], "ready", "{body}");
    while !done {
        match stream.chunk().await.unwrap() {
            Some(c) => done = feed(&mut sse, &c, &mut text),
            None => break,
        }
    }
    assert!(done, "the paused stream finished after resume");
    assert!(text.len() >= paused_at);
    let (status, body) = s
        .post("/v1/completions", &completion(json!({"ignore_eos": true})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.get_text("/health").await.0, 200);
    let length = [("finished_reason", "length")];
    let finished = s.settled("sov_request_success_total", &length, 2.0).await;
    assert_eq!(finished, Some(2.0), "both requests finished by length");

    // And the plain routes, on an idle server.
    let (status, body) = s.post("/admin/suspend", &json!({})).await;
    assert_eq!(
        (status, &body["phase"]),
        (200, &json!("suspended")),
        "{body}"
    );
    let (status, body) = s.post("/admin/resume", &json!({})).await;
    assert_eq!((status, &body["phase"]), (200, &json!("ready")), "{body}");
    let (status, body) = s.post("/v1/completions", &completion(json!({}))).await;
    assert_eq!(status, 200, "served after suspend and resume: {body}");
}

/// Feeds one chunk of a completion stream; appends its text, returns whether `[DONE]` came.
fn feed(sse: &mut server::Sse, chunk: &[u8], text: &mut String) -> bool {
    for ev in sse.feed(chunk) {
        if ev == "[DONE]" {
            return true;
        }
        let v: Value = serde_json::from_str(&ev).expect("event is JSON");
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or_default());
    }
    false
}
