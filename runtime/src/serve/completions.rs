//! `POST /v1/completions` and `POST /v1/chat/completions`: accept (journal) a request, or reattach
//! to a known one by `X-Request-Id`, then answer with the final body or an SSE stream.
//!
//! Design: the id is the request. A POST with a new id parses, journals and submits (blocking
//! work on `spawn_blocking`); a POST with a known id starts no second generation: it reads the
//! same registry record (from the start, or after `Last-Event-ID`), re-submitting only choices an
//! earlier disconnect aborted, with the same prompt, parameters and seed.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::error::ApiError;
use super::params::{self, Job};
use super::reader::ReaderGuard;
use super::registry::{Ending, Endpoint, Entry};
use super::render::{self, Head};
use super::sse;
use super::state::{AppState, PhaseKind};
use super::submit;
use super::worker::blocking;

/// Header naming a request.
pub const REQUEST_ID: &str = "x-request-id";

/// The generation routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Response {
    generate(st, Endpoint::Completion, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Response {
    generate(st, Endpoint::Chat, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// 503 + `Retry-After` unless the server is taking requests.
pub fn refuse_unless_ready(st: &AppState) -> Result<(), ApiError> {
    match st.phase.get() {
        PhaseKind::Ready => Ok(()),
        PhaseKind::Suspended => Err(ApiError::unavailable("suspended", 5)),
        PhaseKind::Loading => Err(ApiError::unavailable("loading", 5)),
        PhaseKind::Draining => Err(ApiError::unavailable("shutting down", 10)),
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The client's `X-Request-Id` (checked), or a fresh one.
fn request_id(headers: &HeaderMap, endpoint: Endpoint) -> Result<String, ApiError> {
    match headers.get(REQUEST_ID) {
        None => Ok(submit::new_id(endpoint)),
        Some(v) => {
            let s = v.to_str().unwrap_or("");
            if s.is_empty() || s.len() > 256 || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ApiError::bad_request(
                    "X-Request-Id must be 1 to 256 visible ASCII characters",
                ));
            }
            Ok(s.to_string())
        }
    }
}

async fn generate(
    st: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    refuse_unless_ready(&st)?;
    let Json(mut body) = body?;
    let id = request_id(&headers, endpoint)?;
    let last_event = header_str(&headers, "last-event-id").map(str::to_string);
    let stream = body.get("stream").and_then(|s| s.as_bool());
    if let Some(entry) = st.registry.get(&id) {
        return reattach(st, entry, stream, last_event).await;
    }
    submit::ensure_seed(&mut body);
    let s = st.clone();
    let (entry, job, fresh) = blocking(move || {
        let job = params::parse(endpoint, &body, &s.job_context())?;
        let entry = Entry::new(id, endpoint, submit::unix_now(), body, job.choices());
        let (entry, fresh) = s.registry.insert(entry);
        if fresh {
            let all: Vec<usize> = (0..job.choices()).collect();
            if let Err(e) = submit::start(&s, &entry, &job, &all) {
                s.registry.remove(&entry.id);
                return Err(e);
            }
        }
        Ok((entry, job, fresh))
    })
    .await?;
    if !fresh {
        return reattach(st, entry, stream, last_event).await;
    }
    respond(st, entry, job, None).await
}

/// Answers for a known request: re-submits choices an earlier disconnect aborted, then streams or
/// returns the record; `stream` (this POST's flag) overrides the stored one.
pub async fn reattach(
    st: Arc<AppState>,
    entry: Arc<Entry>,
    stream: Option<bool>,
    last_event: Option<String>,
) -> Result<Response, ApiError> {
    let s = st.clone();
    let e = entry.clone();
    let mut job = blocking(move || {
        let job = params::parse(e.endpoint, &e.body, &s.job_context())?;
        submit::restart_aborted(&s, &e)?;
        Ok(job)
    })
    .await?;
    if let Some(s) = stream {
        job.stream = s;
    }
    let cursor = match last_event {
        Some(l) if job.stream => Some(
            sse::parse_cursor(&l, job.choices())
                .ok_or_else(|| ApiError::bad_request(format!("malformed Last-Event-ID `{l}`")))?,
        ),
        _ => None,
    };
    respond(st, entry, job, cursor).await
}

/// The response for `entry`: an SSE stream after `cursor`, or the final body once done.
pub async fn respond(
    st: Arc<AppState>,
    entry: Arc<Entry>,
    job: Job,
    cursor: Option<sse::Cursor>,
) -> Result<Response, ApiError> {
    let id = HeaderValue::from_str(&entry.id).ok();
    let mut res = if job.stream {
        sse::respond(st, entry, job, cursor).into_response()
    } else {
        wait_final(st, entry, job).await?.into_response()
    };
    if let Some(id) = id {
        res.headers_mut().insert(REQUEST_ID, id);
    }
    Ok(res)
}

async fn wait_final(
    st: Arc<AppState>,
    entry: Arc<Entry>,
    job: Job,
) -> Result<Json<serde_json::Value>, ApiError> {
    let _guard = ReaderGuard::new(entry.clone(), st.engine.clone());
    let mut changed = entry.subscribe();
    loop {
        changed.borrow_and_update();
        let lost = {
            let data = entry.lock();
            if data.done() {
                let head = Head {
                    id: &entry.id,
                    created: entry.created,
                    model: &st.info.model_name,
                };
                return Ok(Json(render::final_body(
                    &head,
                    &job,
                    &data,
                    st.engine.codec().as_ref(),
                )));
            }
            data.choices
                .iter()
                .any(|c| matches!(c.ending, Some(Ending::Lost | Ending::Aborted)))
        };
        if lost {
            if st.engine.interrupted() {
                return Err(ApiError::unavailable(
                    "shutting down; retry with the same X-Request-Id",
                    10,
                ));
            }
            // Aborted while this reader waited (another reader's disconnect): go again.
            let (s, e) = (st.clone(), entry.clone());
            blocking(move || submit::restart_aborted(&s, &e)).await?;
            continue;
        }
        if changed.changed().await.is_err() {
            return Err(ApiError::internal("request record closed"));
        }
    }
}
