//! `GET /v1/requests/{id}`: a request's status, output so far and finish reasons (JSON), or, with
//! `Accept: text/event-stream` or a `Last-Event-ID`, its SSE stream resumed after that event.
//!
//! Design: a read of the registry record, the same record a reattaching POST reads; `receipt` is
//! null until attested outputs fill it.

use crate::checkpoint::ResponseReceipt;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::completions;
use super::error::ApiError;
use super::registry::{Ending, Endpoint};
use super::render;
use super::state::AppState;

/// The request-status route.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/requests/{id}", get(status))
}

async fn status(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(entry) = st.registry.get(&id) else {
        return ApiError::request_not_found(&id).into_response();
    };
    let last_event = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let wants_stream = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if last_event.is_some() || wants_stream {
        return completions::reattach(st, entry, Some(true), last_event)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    let mut data = entry.lock();
    if let Some(book) = &st.receipts
        && let Ok(mut book) = book.lock()
    {
        for c in data.choices.iter_mut().filter(|c| c.receipt.is_none()) {
            if let Some(r) = c.engine_id.and_then(|id| book.receipts.remove(&id)) {
                c.receipt = serde_json::to_value(r).ok();
            }
        }
    }
    if let Some(w) = &st.witnesses {
        // Cosignatures arrive after the answer: re-issue against the newest quorate head.
        for c in data.choices.iter_mut() {
            let Some(r) = c
                .receipt
                .take()
                .and_then(|v| serde_json::from_value::<ResponseReceipt>(v).ok())
            else {
                continue;
            };
            c.receipt = serde_json::to_value(w.upgrade(r)).ok();
        }
    }
    let status = if data.done() {
        "finished"
    } else if data
        .choices
        .iter()
        .any(|c| matches!(c.ending, Some(Ending::Lost)))
    {
        "interrupted"
    } else if data
        .choices
        .iter()
        .any(|c| matches!(c.ending, Some(Ending::Aborted)))
    {
        "aborted"
    } else {
        "running"
    };
    let choices: Vec<Value> = data
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "index": i,
                "text": if c.readable() { Value::from(c.text()) } else { Value::Null },
                "completion_tokens": c.tokens(),
                "prompt_tokens": c.prompt_tokens,
                "finish_reason": render::reason_value(&c.ending),
                "receipt": c.receipt,
            })
        })
        .collect();
    let prompt: usize = data
        .choices
        .iter()
        .step_by(
            entry
                .body
                .get("n")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .max(1) as usize,
        )
        .map(|c| c.prompt_tokens)
        .sum();
    let completion: usize = data.choices.iter().map(|c| c.tokens()).sum();
    axum::Json(json!({
        "id": entry.id,
        "object": match entry.endpoint {
            Endpoint::Chat => "chat.completion.request",
            Endpoint::Completion => "text_completion.request",
        },
        "created": entry.created,
        "model": st.info.model_name,
        "status": status,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }))
    .into_response()
}
