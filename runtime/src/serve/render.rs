//! OpenAI response bodies: the final `text_completion` / `chat.completion` objects, the streaming
//! chunks (`text_completion`, `chat.completion.chunk`), `usage`, and both logprobs shapes.
//!
//! Design: pure functions from the registry's record of a request to JSON (serde_json values), so
//! a reattached or resumed request renders exactly as the first one did.

use serde_json::{Value, json};

use super::params::{Job, LogprobsMode};
use super::registry::{Delta, Ending, Endpoint, EntryData};
use crate::engine::TextCodec;
use crate::engine::output::Logprobs;

/// What every body of one request shares.
pub struct Head<'a> {
    /// External id.
    pub id: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// Served model id.
    pub model: &'a str,
}

fn token_str(codec: &dyn TextCodec, t: u32) -> String {
    codec.token_text(t)
}

/// `usage` of the request so far: prompt tokens once per prompt, completion tokens over choices.
pub fn usage(job: &Job, data: &EntryData) -> Value {
    let prompt: usize = job.prompts.iter().map(|p| p.tokens.len()).sum();
    let completion: usize = data.choices.iter().map(|c| c.tokens()).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// Completions' logprobs object for `lps`, text offsets starting at `offset` (chars).
pub fn completion_logprobs(codec: &dyn TextCodec, lps: &[Logprobs], offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(lps.len());
    let mut token_logprobs = Vec::with_capacity(lps.len());
    let mut tops = Vec::with_capacity(lps.len());
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        let s = token_str(codec, lp.token);
        offsets.push(*offset);
        *offset += s.chars().count();
        tokens.push(s);
        token_logprobs.push(lp.logprob);
        let mut top = serde_json::Map::new();
        for t in &lp.top {
            top.insert(token_str(codec, t.token), json!(t.logprob));
        }
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}

/// Chat's logprobs `content` entries for `lps`.
pub fn chat_logprobs(codec: &dyn TextCodec, lps: &[Logprobs]) -> Vec<Value> {
    let entry = |t: u32, lp: f32| {
        let s = token_str(codec, t);
        let bytes: Vec<u8> = s.as_bytes().to_vec();
        json!({"token": s, "logprob": lp, "bytes": bytes})
    };
    lps.iter()
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e["top_logprobs"] =
                Value::Array(lp.top.iter().map(|t| entry(t.token, t.logprob)).collect());
            e
        })
        .collect()
}

fn finish_reason(ending: &Option<Ending>) -> Value {
    match ending {
        Some(Ending::Done(r)) => json!(r),
        Some(Ending::Aborted) => json!("abort"),
        _ => Value::Null,
    }
}

/// The final response body (non-streaming).
pub fn final_body(head: &Head<'_>, job: &Job, data: &EntryData, codec: &dyn TextCodec) -> Value {
    let mut choices = Vec::with_capacity(data.choices.len());
    for (i, c) in data.choices.iter().enumerate() {
        let lps: Vec<Logprobs> = c.deltas.iter().flat_map(|d| d.logprobs.clone()).collect();
        let text = c.text();
        if job.endpoint == Endpoint::Chat {
            let logprobs = match job.logprobs {
                LogprobsMode::Off => Value::Null,
                _ => json!({"content": chat_logprobs(codec, &lps), "refusal": null}),
            };
            choices.push(json!({
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": logprobs,
                "finish_reason": finish_reason(&c.ending),
            }));
        } else {
            let prompt = job
                .prompts
                .get(i / job.n.max(1))
                .map_or("", |p| p.text.as_str());
            let mut offset = if job.echo { prompt.chars().count() } else { 0 };
            let logprobs = match job.logprobs {
                LogprobsMode::Off => Value::Null,
                _ => completion_logprobs(codec, &lps, &mut offset),
            };
            let text = if job.echo {
                format!("{prompt}{text}")
            } else {
                text
            };
            choices.push(json!({
                "index": i,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason(&c.ending),
            }));
        }
    }
    let object = match job.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completion => "text_completion",
    };
    json!({
        "id": head.id,
        "object": object,
        "created": head.created,
        "model": head.model,
        "system_fingerprint": null,
        "choices": choices,
        "usage": usage(job, data),
    })
}

/// What one streaming chunk of one choice carries.
pub enum ChunkBody<'a> {
    /// Chat only: the first chunk of a choice, `delta: {role: assistant, content: ""}`.
    Role,
    /// New output (a delta, possibly a part of one: `tokens_from` tokens of it already sent).
    Delta(&'a Delta, String, &'a [Logprobs]),
    /// The choice finished with this reason.
    Finish(Value),
}

/// One streaming chunk for choice `index`. `offset` is the completion's running text offset.
pub fn chunk(
    head: &Head<'_>,
    job: &Job,
    index: usize,
    body: ChunkBody<'_>,
    codec: &dyn TextCodec,
    offset: &mut usize,
) -> Value {
    let chat = job.endpoint == Endpoint::Chat;
    let (delta, logprobs, finish) = match body {
        ChunkBody::Role => (
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            Value::Null,
        ),
        ChunkBody::Delta(_, text, lps) => {
            let logprobs = match job.logprobs {
                LogprobsMode::Off => Value::Null,
                LogprobsMode::Chat(_) => {
                    json!({"content": chat_logprobs(codec, lps), "refusal": null})
                }
                LogprobsMode::Completion(_) => completion_logprobs(codec, lps, offset),
            };
            (json!({"content": text}), logprobs, Value::Null)
        }
        ChunkBody::Finish(reason) => (json!({}), Value::Null, reason),
    };
    let choice = if chat {
        json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
    } else {
        json!({
            "index": index,
            "text": delta.get("content").cloned().unwrap_or(json!("")),
            "logprobs": logprobs,
            "finish_reason": finish,
        })
    };
    let mut v = json!({
        "id": head.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": head.created,
        "model": head.model,
        "system_fingerprint": null,
        "choices": [choice],
    });
    if job.include_usage {
        v["usage"] = Value::Null;
    }
    v
}

/// The last chunk when `stream_options.include_usage`: empty `choices`, the `usage`.
pub fn usage_chunk(head: &Head<'_>, job: &Job, data: &EntryData) -> Value {
    let chat = job.endpoint == Endpoint::Chat;
    json!({
        "id": head.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": head.created,
        "model": head.model,
        "system_fingerprint": null,
        "choices": [],
        "usage": usage(job, data),
    })
}

/// The finish reason value of a choice (null while running).
pub fn reason_value(ending: &Option<Ending>) -> Value {
    finish_reason(ending)
}
