//! Sends one streamed request of the online benchmark and times it, as vLLM `bench serve`'s
//! OpenAI backends do: TTFT is the send-to-first-text time, every later text chunk adds one
//! inter-token gap, the end-to-end latency ends at the last text chunk, and the output length is
//! `usage.completion_tokens` when the server reports it, else the number of text chunks.
//!
//! Design: reqwest (tokio) POSTs the JSON body and reads the body as a byte stream through the
//! [`SseDecoder`]; each decoded `data:` is read by [`parse_chunk`]. Timestamps are taken when the
//! bytes that complete an event arrive.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::chunk::parse_chunk;
use super::sse::{SseDecoder, SseEvent};
use super::workload::WorkItem;
use crate::cli::sampling_args::FilterArgs;

/// Which OpenAI endpoint the benchmark drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`: `prompt`, chunks carry `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: one user message, chunks carry `choices[0].delta.content`.
    Chat,
}

/// What is sent besides the prompt.
#[derive(Debug, Clone)]
pub struct RequestSettings {
    /// Full URL of the endpoint.
    pub url: String,
    /// `model` field (omitted when `None`).
    pub model: Option<String>,
    /// Endpoint kind.
    pub api: Api,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// `top_p`, `top_k`, `min_p`: each sent when set.
    pub filters: FilterArgs,
    /// `Authorization: Bearer` key.
    pub api_key: Option<String>,
}

/// Timing of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Whether the request streamed text and ended without an error.
    pub success: bool,
    /// Why it failed.
    pub error: Option<String>,
    /// When the request was sent, from the start of the run.
    pub start: Duration,
    /// Send to first text chunk.
    pub ttft: Duration,
    /// Gaps between consecutive text chunks.
    pub itl: Vec<Duration>,
    /// Send to last text chunk.
    pub latency: Duration,
    /// Text chunks received.
    pub chunks: usize,
    /// `usage.completion_tokens`, when sent.
    pub completion_tokens: Option<usize>,
    /// `usage.prompt_tokens`, when sent.
    pub prompt_tokens: Option<usize>,
}

impl Outcome {
    /// Generated tokens: the server's count when it sent one, else the text chunks.
    pub fn output_tokens(&self) -> usize {
        self.completion_tokens.unwrap_or(self.chunks)
    }
}

/// The JSON body for `item`.
pub fn request_body(item: &WorkItem, s: &RequestSettings) -> Value {
    let mut body = json!({
        "max_tokens": item.output_len,
        "temperature": s.temperature,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(model) = &s.model {
        body["model"] = json!(model);
    }
    let f = &s.filters;
    if f.top_p < 1.0 {
        body["top_p"] = json!(f.top_p);
    }
    if f.top_k > 0 {
        body["top_k"] = json!(f.top_k);
    }
    if f.min_p > 0.0 {
        body["min_p"] = json!(f.min_p);
    }
    let text = item.text.clone();
    match s.api {
        Api::Completions => {
            body["prompt"] = match text {
                Some(t) => json!(t),
                None => json!(item.ids),
            }
        }
        Api::Chat => {
            body["messages"] = json!([{"role": "user", "content": text.unwrap_or_default()}]);
        }
    }
    body
}

/// Sends `item` and times its stream; `t0` is the start of the run.
pub async fn send(
    client: &reqwest::Client,
    s: &RequestSettings,
    item: &WorkItem,
    t0: Instant,
) -> Outcome {
    let sent = Instant::now();
    let mut out = Outcome {
        start: sent.duration_since(t0),
        ..Outcome::default()
    };
    if let Err(e) = stream(client, s, item, sent, &mut out).await {
        out.error = Some(e);
    } else if out.chunks == 0 {
        out.error = Some("the stream carried no text".into());
    } else {
        out.success = true;
    }
    out
}

async fn stream(
    client: &reqwest::Client,
    s: &RequestSettings,
    item: &WorkItem,
    sent: Instant,
    out: &mut Outcome,
) -> Result<(), String> {
    let mut req = client.post(&s.url).json(&request_body(item, s));
    if let Some(key) = &s.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    let mut decoder = SseDecoder::new();
    let mut bytes = resp.bytes_stream();
    let mut last: Option<Instant> = None;
    let mut done = false;
    while !done {
        let events = match bytes.next().await {
            Some(piece) => decoder.feed(&piece.map_err(|e| format!("stream broke: {e}"))?),
            None => {
                done = true;
                decoder.finish()
            }
        };
        let now = Instant::now();
        for event in events {
            let data = match event {
                SseEvent::Done => {
                    done = true;
                    continue;
                }
                SseEvent::Data(d) => d,
            };
            let chunk = parse_chunk(&data)?;
            if chunk.completion_tokens.is_some() {
                out.completion_tokens = chunk.completion_tokens;
                out.prompt_tokens = chunk.prompt_tokens;
            }
            if chunk.has_text() {
                match last {
                    None => out.ttft = now.duration_since(sent),
                    Some(prev) => out.itl.push(now.duration_since(prev)),
                }
                last = Some(now);
                out.chunks += 1;
            }
        }
    }
    out.latency = last.map_or(Duration::ZERO, |l| l.duration_since(sent));
    Ok(())
}
