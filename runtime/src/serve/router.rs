//! The HTTP router: the generation and request routes, the operational routes (`metrics`,
//! `admin`, `info_routes`), and the layers every route goes through: the API key (all but
//! `/health`), the body limit (413 in OpenAI's shape), a tracing span per request with its id, and
//! OpenAI-shaped 404/405 for unknown routes.
//!
//! Design: one `Router<Arc<AppState>>` assembled here from each module's `routes()`; the layers
//! are tower middleware so no handler repeats them.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::limit::RequestBodyLimitLayer;
use tracing::Instrument;

use super::completions::{self, REQUEST_ID};
use super::error::ApiError;
use super::state::AppState;
use super::{admin, info_routes, requests};

/// Default most bytes of a request body.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// The whole application.
pub fn build(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .merge(completions::routes())
        .merge(requests::routes())
        .merge(admin::routes())
        .merge(info_routes::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(RequestBodyLimitLayer::new(max_body))
        .layer(middleware::map_response(move |res: Response| async move {
            openai_413(res, max_body)
        }))
        .layer(middleware::from_fn(span))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::route_not_found(uri.path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Constant-time comparison (the key is a secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key
        && req.uri().path() != "/health"
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The body-limit layer answers 413 in plain text; say it in OpenAI's shape.
fn openai_413(res: Response, limit: usize) -> Response {
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    if res.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return ApiError::payload_too_large(limit).into_response();
    }
    res
}

async fn span(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let span = tracing::info_span!("http", method = %req.method(), path = %req.uri().path(), request_id = %id);
    async move {
        let res = next.run(req).await;
        let assigned = res
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        tracing::info!(status = res.status().as_u16(), id = assigned, "done");
        res
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
