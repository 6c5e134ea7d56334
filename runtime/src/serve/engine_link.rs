//! The few engine calls the server makes, in one place: submit with a tag, abort, structured
//! output, finish reasons.
//!
//! Design: an adapter over `Engine`'s API so the rest of the server does not change when the
//! engine's front-end API grows (request tags, abort, grammars); each function is the one place
//! that knows how the engine spells it.

use crate::engine::{Engine, EngineError, FinishReason, Request};

use super::error::ApiError;

pub use crate::engine::handle::Submitted;

/// Journals and queues `requests` together (one group commit), each with its tag.
pub fn submit(
    engine: &Engine,
    requests: Vec<(Request, Vec<u8>)>,
) -> Result<Vec<Submitted>, EngineError> {
    let reqs = requests
        .into_iter()
        .map(|(mut r, tag)| {
            r.tag = tag;
            r
        })
        .collect();
    engine.submit_many(reqs)
}

/// Ends engine request `id` (its KV blocks freed within a step); unknown ids are ignored.
pub fn abort(engine: &Engine, id: u64) {
    if let Err(e) = engine.abort(id) {
        tracing::debug!(engine_id = id, "abort: {e}");
    }
}

/// Whether the engine ended this request because it was aborted.
pub fn is_abort(reason: &FinishReason) -> bool {
    matches!(reason, FinishReason::Abort)
}

/// Whether a journaled finish reason (OpenAI spelling) is an abort.
pub fn is_abort_record(reason: &str) -> bool {
    reason == FinishReason::Abort.as_openai()
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

/// Applies `logit_bias` and `min_tokens` to an engine request.
pub fn set_bias_and_min_tokens(req: &mut Request, bias: &[(u32, f32)], min_tokens: usize) {
    req.sampling.logit_bias = bias.to_vec();
    req.sampling.min_tokens = min_tokens;
}
