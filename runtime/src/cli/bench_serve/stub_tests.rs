//! The online client against a stub OpenAI-compatible SSE server (a test fixture only): a raw
//! tokio `TcpListener` answering HTTP/1.1 with a close-delimited `text/event-stream` body shaped as
//! the OpenAI API reference documents streamed chunks. The stub writes events split across writes
//! (mid-line and mid-JSON), with keep-alive comments and `data: [DONE]`, and sleeps between tokens,
//! so the client's timings, SSE reassembly and token counting are checked end to end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::client::{self, Api, RequestSettings};
use super::workload::WorkItem;
use crate::cli::sampling_args::FilterArgs;

/// How the stub answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Completions chunks, one token each, and a usage chunk.
    Completions,
    /// Chat chunks: a role-only delta first, no usage chunk.
    ChatNoUsage,
    /// HTTP 500 with an OpenAI error body.
    Fail,
}

const FIRST_DELAY: Duration = Duration::from_millis(40);
const GAP: Duration = Duration::from_millis(8);

/// Starts the stub; returns its base URL and the request bodies it has received.
async fn start_stub(mode: Mode) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&bodies);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let _ = serve_one(conn, mode, seen).await;
            });
        }
    });
    (format!("http://{addr}"), bodies)
}

async fn serve_one(
    mut conn: TcpStream,
    mode: Mode,
    seen: Arc<Mutex<Vec<Value>>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut piece).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&piece[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = conn.read(&mut piece).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&piece[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(1) as usize;
    if let Ok(mut b) = seen.lock() {
        b.push(body);
    }
    if mode == Mode::Fail {
        let err = r#"{"error":{"message":"stub failure","type":"server_error"}}"#;
        let resp = format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{err}",
            err.len()
        );
        return conn.write_all(resp.as_bytes()).await;
    }
    conn.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
    )
    .await?;
    if mode == Mode::ChatNoUsage {
        let role = json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
        conn.write_all(format!("data: {role}\n\n").as_bytes())
            .await?;
    }
    conn.write_all(b": keep-alive\n\n").await?;
    tokio::time::sleep(FIRST_DELAY).await;
    for i in 0..max_tokens {
        let chunk = match mode {
            Mode::ChatNoUsage => {
                json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": format!(" t{i}")}, "finish_reason": null}]})
            }
            _ => {
                json!({"object": "text_completion", "choices": [{"index": 0, "text": format!(" t{i}"), "finish_reason": null}]})
            }
        };
        let event = format!("data: {chunk}\r\n\r\n");
        // Split each event mid-JSON across two writes.
        let (a, b) = event.split_at(event.len() / 2);
        conn.write_all(a.as_bytes()).await?;
        conn.flush().await?;
        tokio::task::yield_now().await;
        conn.write_all(b.as_bytes()).await?;
        if i + 1 < max_tokens {
            tokio::time::sleep(GAP).await;
        }
    }
    if mode == Mode::Completions {
        let usage = json!({"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": max_tokens, "total_tokens": 5 + max_tokens}});
        conn.write_all(format!("data: {usage}\n\n").as_bytes())
            .await?;
    }
    conn.write_all(b"data: [DONE]\n\n").await
}

/// A request of five token ids; `text` also gives it a text form (sent instead of the ids).
fn item(n_out: usize, text: bool) -> WorkItem {
    WorkItem {
        ids: vec![11, 12, 13, 14, 15],
        text: text.then(|| "hello".to_string()),
        output_len: n_out,
    }
}

fn settings(base: &str, api: Api, endpoint: &str) -> RequestSettings {
    RequestSettings {
        url: super::endpoint_url(base, endpoint),
        model: Some("stub".into()),
        api,
        temperature: 0.0,
        filters: FilterArgs::default(),
        api_key: Some("k".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stream_is_timed_and_counted() {
    let (base, bodies) = start_stub(Mode::Completions).await;
    let s = settings(&base, Api::Completions, "/v1/completions");
    let http = reqwest::Client::new();
    let n = 6;
    let out = client::send(&http, &s, &item(n, false), Instant::now()).await;
    assert!(out.success, "{:?}", out.error);
    assert_eq!((out.chunks, out.completion_tokens), (n, Some(n)));
    assert_eq!(out.prompt_tokens, Some(5));
    assert!(out.ttft >= FIRST_DELAY, "ttft {:?}", out.ttft);
    assert_eq!(out.itl.len(), n - 1);
    // The stub sleeps GAP between tokens: the decode span covers at least most of the gaps.
    assert!(out.latency - out.ttft >= GAP * (n as u32 - 1) * 4 / 5);
    let body = bodies.lock().expect("lock")[0].clone();
    assert_eq!(body["prompt"], json!([11, 12, 13, 14, 15]));
    assert_eq!(body["max_tokens"], json!(n));
    assert_eq!(body["ignore_eos"], json!(true));
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"]["include_usage"], json!(true));
    assert_eq!(body["model"], json!("stub"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_usage_counts_chunks_and_skips_the_role_delta() {
    let (base, bodies) = start_stub(Mode::ChatNoUsage).await;
    let s = settings(&base, Api::Chat, "/v1/chat/completions");
    let out = client::send(&reqwest::Client::new(), &s, &item(4, true), Instant::now()).await;
    assert!(out.success, "{:?}", out.error);
    assert_eq!(
        (out.chunks, out.completion_tokens, out.output_tokens()),
        (4, None, 4)
    );
    // The role-only delta came at once; the first text only after FIRST_DELAY.
    assert!(out.ttft >= FIRST_DELAY);
    let body = bodies.lock().expect("lock")[0].clone();
    assert_eq!(body["messages"][0]["content"], json!("hello"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_concurrency_limit() {
    let (base, _) = start_stub(Mode::Fail).await;
    let s = settings(&base, Api::Completions, "/v1/completions");
    let out = client::send(&reqwest::Client::new(), &s, &item(3, false), Instant::now()).await;
    assert!(!out.success);
    let err = out.error.unwrap_or_default();
    assert!(err.contains("500") && err.contains("stub failure"), "{err}");

    let (base, _) = start_stub(Mode::Completions).await;
    let s = Arc::new(settings(&base, Api::Completions, "/v1/completions"));
    let work: Vec<WorkItem> = (0..6).map(|_| item(3, true)).collect();
    let (outs, duration) =
        super::drive(&reqwest::Client::new(), &s, work, &[0.0; 6], Some(2)).await;
    assert!(outs.iter().all(|o| o.success));
    let info = super::report::RunInfo {
        url: base,
        model: "stub".into(),
        request_rate: "inf".into(),
        burstiness: 1.0,
        max_concurrency: Some(2),
        slos: Vec::new(),
    };
    let r = super::report::compute(info, &outs, &[5; 6], duration);
    assert_eq!((r.completed, r.total_output_tokens), (6, 18));
    assert!(r.peak_concurrent_requests <= 2 && r.peak_concurrent_requests >= 1);
    // Three waves of two requests, each at least FIRST_DELAY + 2 GAPs long.
    assert!(duration >= (FIRST_DELAY + GAP * 2) * 3);
}

#[test]
fn sampling_filters_are_sent_only_when_set() {
    let plain = client::request_body(
        &item(4, false),
        &settings("http://x", Api::Completions, "/v1/completions"),
    );
    for key in ["top_p", "top_k", "min_p"] {
        assert!(
            plain.get(key).is_none(),
            "{key} sent while disabled: {plain}"
        );
    }
    let mut s = settings("http://x", Api::Completions, "/v1/completions");
    s.temperature = 0.8;
    s.filters = FilterArgs {
        top_p: 0.9,
        top_k: 40,
        min_p: 0.05,
    };
    let body = client::request_body(&item(4, false), &s);
    assert_eq!(body["top_k"], json!(40));
    assert!((body["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    assert!((body["min_p"].as_f64().unwrap() - 0.05).abs() < 1e-6);
}
