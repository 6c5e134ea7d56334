//! `sov serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of one engine, whose
//! requests survive restarts.
//!
//! Design: handlers parse and validate a request ([`params`]), journal it through the engine's
//! `submit_many` (its per-request metadata rides in `Request.tag`) before the first byte is sent,
//! and read its output from the [`registry`], which pump threads fill from the engine's channels.
//! So a request is a durable record, not a connection: a client may drop, reattach by id, or retry
//! after a restart (`--resume`) and read the same output.
//!
//! - [`state`], [`error`]: the shared state and the OpenAI-shaped error every route uses
//! - [`router`]: routes, API key, body limit, request-id spans
//! - [`params`], [`submit`], [`pump`], [`render`], [`sse`]: from body to engine to response
//!   ([`worker`]: their blocking parts off the async threads)
//! - [`completions`], [`requests`]: the generation and request-status routes
//! - [`metrics`], [`admin`], [`info_routes`]: operations (`/metrics`, `/admin/*`, `/health`, ...);
//!   `info_routes` serves `/metrics` from the [`metrics`] recorder

pub mod admin;
pub mod completions;
pub mod engine_link;
pub mod error;
pub mod info_routes;
pub mod metrics;
pub mod params;
pub mod pump;
pub mod reader;
pub mod registry;
pub mod render;
pub mod requests;
pub mod resume;
pub mod router;
pub mod sse;
pub mod state;
pub mod submit;
pub mod worker;

pub use error::ApiError;
pub use state::{AppState, Phase, PhaseKind, ServerInfo};
