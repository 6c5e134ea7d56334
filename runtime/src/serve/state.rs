//! The state every HTTP handler shares: the engine handle, the request registry, what the server
//! says about itself, the API key, the serving phase and the metrics hooks.
//!
//! Design: one [`AppState`] behind an `Arc`, built once by `sov serve` and handed to axum as the
//! router state. The engine thread is the only owner of the model; handlers only submit, abort and
//! read. [`Phase`] is one atomic so the admin routes, the signal handler and every handler agree on
//! whether new requests are taken (503 otherwise).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::params::JobContext;
use crate::engine::Engine;
use crate::loader::ChatTemplate;

pub use super::registry::Registry;

/// Shared state of a running `sov serve`.
pub struct AppState {
    /// The engine; the only owner of the model is its thread.
    pub engine: Arc<Engine>,
    /// Request id -> live or finished request (reattach, `GET /v1/requests/{id}`, resume).
    pub registry: Arc<Registry>,
    /// What the server reports about itself and its model.
    pub info: ServerInfo,
    /// Required as `Authorization: Bearer KEY` on every route except `/health` (never logged).
    pub api_key: Option<String>,
    /// Loading / ready / suspended / draining: whether new requests are accepted.
    pub phase: Arc<Phase>,
    /// Counters and histograms for `/metrics`; handlers call its hooks.
    pub metrics: Arc<crate::serve::metrics::ServerMetrics>,
    /// Where the engine leaves each finished request's signed receipt (None: checkpoints off).
    pub receipts: Option<Arc<std::sync::Mutex<crate::engine::checkpointing::ResumeBook>>>,
    /// The witness client: receipts are re-issued against the newest head a quorum cosigned.
    pub witnesses: Option<Arc<crate::app::witnesses::Witnesses>>,
}

impl AppState {
    /// What parsing a body needs from the server.
    pub fn job_context(&self) -> JobContext<'_> {
        JobContext {
            codec: self.engine.codec().as_ref(),
            template: self.info.chat_template.as_ref(),
            model_name: &self.info.model_name,
            context_len: self.info.context_len,
            vocab_size: self.engine.limits().vocab_size,
        }
    }
}

/// What the server says about itself.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// The model id clients must name (`--served-model-name`, default the model's name).
    pub model_name: String,
    /// Most tokens of prompt plus completion per request.
    pub context_len: usize,
    /// When the server started, unix seconds (`created` of `/v1/models`).
    pub created: u64,
    /// The model's chat template (None: `/v1/chat/completions` answers 400).
    pub chat_template: Option<ChatTemplate>,
    /// Most requests waiting for the engine before new ones get 429 (None: unbounded).
    pub max_waiting: Option<usize>,
}

/// Whether the server takes new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PhaseKind {
    /// The model is loading or the engine restoring (`/health` 503).
    Loading = 0,
    /// Serving.
    Ready = 1,
    /// Suspended by an operator: running requests pause, new ones get 503 + `Retry-After`.
    Suspended = 2,
    /// Shutting down (SIGTERM/SIGINT): new requests get 503; the engine checkpoints and exits.
    Draining = 3,
}

impl PhaseKind {
    /// The lowercase name (`loading`, `ready`, `suspended`, `draining`).
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Loading => "loading",
            PhaseKind::Ready => "ready",
            PhaseKind::Suspended => "suspended",
            PhaseKind::Draining => "draining",
        }
    }
}

/// The serving phase, shared and atomic.
#[derive(Debug)]
pub struct Phase(AtomicU8);

impl Phase {
    /// A phase starting at `kind`.
    pub fn new(kind: PhaseKind) -> Self {
        Phase(AtomicU8::new(kind as u8))
    }

    /// The current phase.
    pub fn get(&self) -> PhaseKind {
        match self.0.load(Ordering::Acquire) {
            0 => PhaseKind::Loading,
            1 => PhaseKind::Ready,
            2 => PhaseKind::Suspended,
            _ => PhaseKind::Draining,
        }
    }

    /// Moves to `kind`. Draining is final: once draining, other phases are ignored.
    pub fn set(&self, kind: PhaseKind) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur != PhaseKind::Draining as u8).then_some(kind as u8)
            });
    }

    /// True when new requests are accepted.
    pub fn accepting(&self) -> bool {
        self.get() == PhaseKind::Ready
    }
}

impl Default for Phase {
    fn default() -> Self {
        Phase::new(PhaseKind::Loading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_moves_and_draining_is_final() {
        let p = Phase::default();
        assert_eq!(p.get(), PhaseKind::Loading);
        assert!(!p.accepting());
        p.set(PhaseKind::Ready);
        assert!(p.accepting());
        p.set(PhaseKind::Suspended);
        assert_eq!(p.get(), PhaseKind::Suspended);
        p.set(PhaseKind::Draining);
        p.set(PhaseKind::Ready);
        assert_eq!(p.get(), PhaseKind::Draining);
    }
}
