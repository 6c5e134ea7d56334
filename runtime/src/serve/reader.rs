//! [`ReaderGuard`]: counts the clients reading a request; when the last one goes away before the
//! request finished, its engine requests are aborted (KV blocks freed within a step).
//!
//! Design: RAII on the handler's future or the SSE task: axum drops both when the client
//! disconnects, so the count is right however a connection ends. An aborted request stays in the
//! registry; a retry with its id submits it again with the same prompt, parameters and seed.

use std::sync::Arc;

use super::engine_link;
use super::registry::Entry;
use crate::engine::Engine;

/// Held while a client reads `entry`.
pub struct ReaderGuard {
    entry: Arc<Entry>,
    engine: Arc<Engine>,
}

impl ReaderGuard {
    /// Counts one more reader of `entry`.
    pub fn new(entry: Arc<Entry>, engine: Arc<Engine>) -> Self {
        entry.lock().readers += 1;
        ReaderGuard { entry, engine }
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        let to_abort: Vec<u64> = {
            let mut d = self.entry.lock();
            d.readers = d.readers.saturating_sub(1);
            if d.readers > 0 {
                return;
            }
            d.choices
                .iter()
                .filter(|c| c.ending.is_none())
                .filter_map(|c| c.engine_id)
                .collect()
        };
        if !to_abort.is_empty() {
            tracing::info!(request = %self.entry.id, "client went away; aborting");
        }
        for id in to_abort {
            engine_link::abort(&self.engine, id);
        }
    }
}
