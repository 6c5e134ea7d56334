//! What the server says about itself and its tokenizer, in vLLM's shapes:
//!
//! - `GET /health`: 200 `{"status": "ready"}` while serving, 503 (with `Retry-After`) while
//!   loading, suspended or draining. Public: the router exempts it from the API key.
//! - `GET /v1/models`: OpenAI's list shape with the served model id and `max_model_len`;
//!   `GET /v1/models/{model}` that one model (404 for any other id).
//! - `POST /tokenize`: `{"prompt": TEXT}` or `{"messages": [...]}` (rendered with the chat template
//!   and the assistant header, as `/v1/chat/completions` renders it) ->
//!   `{"tokens": [...], "count": n, "max_model_len": N}`.
//! - `POST /detokenize`: `{"tokens": [...]}` -> `{"prompt": TEXT}`.
//! - `GET /metrics`: Prometheus text, rendered by the server's [`super::metrics::ServerMetrics`] at scrape time.
//!
//! Design: thin handlers over the engine's own codec and serve-core's chat rendering
//! ([`params::chat_prompt`]), so the tokens shown are exactly those a generation request would
//! submit.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::metrics::CONTENT_TYPE;
use super::params::{self, JobContext, Message};
use super::state::{AppState, PhaseKind};

/// Seconds a not-ready server tells health checkers to wait.
pub const HEALTH_RETRY_AFTER: u64 = 2;

/// Routes of this module.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let body = state.metrics.render(&state.engine);
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let phase = state.phase.get();
    if phase == PhaseKind::Ready {
        return (StatusCode::OK, Json(json!({"status": phase.as_str()}))).into_response();
    }
    let mut body = ApiError::unavailable(phase.as_str(), HEALTH_RETRY_AFTER).body();
    body["status"] = Value::String(phase.as_str().into());
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(HEALTH_RETRY_AFTER));
    res
}

/// The one model this server serves, as `/v1/models` lists it.
pub fn model_json(state: &AppState) -> Value {
    let info = &state.info;
    json!({
        "id": info.model_name,
        "object": "model",
        "created": info.created,
        "owned_by": "sov",
        "root": info.model_name,
        "parent": null,
        "max_model_len": info.context_len,
        "permission": [],
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_json(&state)]}))
}

async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_model(&state, Some(&id))?;
    Ok(Json(model_json(&state)))
}

/// Body of `POST /tokenize`: exactly one of `prompt` and `messages`.
#[derive(Debug, Deserialize)]
struct TokenizeBody {
    /// Must name the served model when given.
    model: Option<String>,
    /// Text, tokenized as a completion prompt is.
    prompt: Option<String>,
    /// A conversation, rendered with the chat template first.
    messages: Option<Vec<Message>>,
}

/// Body of `POST /detokenize`.
#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    /// Must name the served model when given.
    model: Option<String>,
    /// Token ids.
    tokens: Vec<u32>,
}

fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != state.info.model_name => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}

async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Json<TokenizeBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    check_model(&state, body.model.as_deref())?;
    let codec = state.engine.codec().as_ref();
    let text = match (body.prompt, body.messages) {
        (Some(p), None) => p,
        (None, Some(messages)) => {
            let cx = JobContext {
                codec,
                template: state.info.chat_template.as_ref(),
                model_name: &state.info.model_name,
                context_len: state.info.context_len,
                vocab_size: state.engine.limits().vocab_size,
            };
            params::chat_prompt(&messages, &cx)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
            ));
        }
    };
    let tokens = codec.encode(&text).map_err(ApiError::internal)?;
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.info.context_len,
        "tokens": tokens,
    })))
}

async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Json<DetokenizeBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    check_model(&state, body.model.as_deref())?;
    let vocab = state.engine.limits().vocab_size;
    if let Some(bad) = body.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is not below the vocabulary size {vocab}"),
        ));
    }
    let prompt = state
        .engine
        .codec()
        .decode(&body.tokens)
        .map_err(ApiError::internal)?;
    Ok(Json(json!({"prompt": prompt})))
}
