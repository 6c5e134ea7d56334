//! The few engine calls the server makes, in one place: submit with a tag, abort, structured
//! output, finish reasons.
//!
//! Design: an adapter over `Engine`'s API so the rest of the server does not change when the
//! engine's front-end API grows (request tags, abort, grammars); each function is the one place
//! that knows how the engine spells it.

use crate::engine::constraint::Grammar;
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

/// The structured-output constraint for `response_format` (`text`: none; `json_object`,
/// `json_schema`: a grammar), to be set on every engine request. The grammar is compiled when
/// the engine accepts the request, so an invalid schema is refused there too (400).
pub fn structured(format: &serde_json::Value) -> Result<Option<Grammar>, ApiError> {
    Grammar::from_openai_response_format(format)
        .map_err(|e| ApiError::invalid_param("response_format", e.to_string()))
}

/// Applies `logit_bias` and `min_tokens` to an engine request.
pub fn set_bias_and_min_tokens(req: &mut Request, bias: &[(u32, f32)], min_tokens: usize) {
    req.sampling.logit_bias = bias.to_vec();
    req.sampling.min_tokens = min_tokens;
}
