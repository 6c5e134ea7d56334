//! [`ApiError`]: every error the HTTP API returns, rendered in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status (and
//! `Retry-After` on 429/503).
//!
//! Design: one error type for all routes (serve-core's and the operational ones), built by named
//! constructors so the status, the `type` and the `code` always agree; axum's JSON rejections and
//! the engine's refusals convert into it.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::EngineError;

/// An error response in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// Machine-readable code, e.g. `model_not_found`.
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// Names the field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 400: a bad value or an unsupported combination.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 for one named parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect or missing API key (send `Authorization: Bearer KEY`).",
        )
        .with_code("invalid_api_key")
    }

    /// 404: the model named is not served.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist."),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 404: no such request id.
    pub fn request_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("No request with id `{id}`."),
        )
        .with_code("request_not_found")
    }

    /// 404: no such route.
    pub fn route_not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Unknown route {path}."),
        )
        .with_code("not_found")
    }

    /// 405: the route exists, the method does not.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "Method not allowed on this route.",
        )
    }

    /// 413: the body is over the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than {limit} bytes."),
        )
        .with_code("payload_too_large")
    }

    /// 422: the JSON is well formed but a field has the wrong type.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            message,
        )
    }

    /// 429: the waiting queue is full.
    pub fn queue_full(retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "The server's request queue is full; retry later.",
        )
        .with_code("rate_limit_exceeded");
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: suspended, loading or draining.
    pub fn unavailable(why: &str, retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            format!("The server is {why}; retry later."),
        )
        .with_code("service_unavailable");
        e.retry_after = Some(retry_after);
        e
    }

    /// 500: something failed on the server's side.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonDataError(e) => ApiError::unprocessable(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => ApiError::bad_request(e.body_text()),
            JsonRejection::MissingJsonContentType(e) => ApiError::bad_request(e.body_text()),
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                let mut err = ApiError::payload_too_large(0);
                err.message = "The request body is too large.".into();
                err
            }
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match &e {
            EngineError::EngineStopped => ApiError::unavailable("shutting down", 5),
            EngineError::InvalidSampling { name, .. } => {
                ApiError::invalid_param(name, e.to_string())
            }
            EngineError::InvalidGrammar(_) => {
                ApiError::invalid_param("response_format", e.to_string())
            }
            EngineError::Forward(_)
            | EngineError::KvCacheAlloc { .. }
            | EngineError::KvBudget(_)
            | EngineError::KvExhausted
            | EngineError::SlotFile { .. }
            | EngineError::Scheduler(_)
            | EngineError::Checkpoint(_) => ApiError::internal(e.to_string()),
            _ => ApiError::bad_request(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_shape_with_retry_after() {
        let e = ApiError::model_not_found("gpt-x");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let b = e.body();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "model_not_found");
        assert_eq!(b["error"]["param"], "model");
        assert!(
            b["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("gpt-x"))
        );
        let res = ApiError::unavailable("suspended", 7).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            res.headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("7")
        );
    }

    #[test]
    fn engine_refusals_are_client_errors() {
        let e: ApiError = EngineError::ZeroMaxTokens.into();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e: ApiError = EngineError::EngineStopped.into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
