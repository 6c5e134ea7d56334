//! Rebuilding the request registry after `sov serve --resume`: every journaled request of the
//! run, finished or still generating, under its external id.
//!
//! Design: the server's metadata rides in each engine request's tag ([`Tag`]); a resumed engine
//! hands the tags back in its `ResumeBook`, and this module turns them into registry entries:
//! finished choices from their journal record (an aborted one stays retryable), live ones pumped
//! from the engine (their pre-checkpoint tokens arrive with the final event). Engine ids ascend,
//! so when a retry re-submitted a choice, the newest engine request wins.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::engine_link;
use super::params;
use super::pump::{self, PumpTarget};
use super::registry::{Choice, Delta, Ending, Entry, Tag};
use super::state::AppState;
use crate::engine::checkpointing::{ResumeBook, ResumedRequest};

/// Errors rebuilding the registry.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The resume book's lock was poisoned.
    #[error("the resume book's lock is poisoned")]
    Poisoned,
    /// A pump thread could not start.
    #[error("cannot start a pump thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What the rebuild found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Requests (external ids) registered.
    pub requests: usize,
    /// Engine requests still generating.
    pub live: usize,
    /// Engine requests without a server tag (not reattachable).
    pub untagged: usize,
}

fn entry_for(state: &AppState, tag: &Tag) -> Arc<Entry> {
    state
        .registry
        .insert(Entry::new(
            tag.id.clone(),
            tag.endpoint,
            tag.created,
            tag.body.clone(),
            tag.choices,
        ))
        .0
}

/// Tokens in the prompt of choice `choice` (re-tokenized from the journaled body; 0 when it no
/// longer parses).
fn prompt_tokens(state: &AppState, entry: &Entry, choice: usize) -> usize {
    params::parse(entry.endpoint, &entry.body, &state.job_context())
        .ok()
        .and_then(|j| j.prompts.get(choice / j.n.max(1)).map(|p| p.tokens.len()))
        .unwrap_or(0)
}

/// Fills `state.registry` from `book` (taking its live receivers).
pub fn rebuild(state: &AppState, book: &Arc<Mutex<ResumeBook>>) -> Result<Rebuilt, ResumeError> {
    let requests = {
        let mut book = book.lock().map_err(|_| ResumeError::Poisoned)?;
        std::mem::take(&mut book.requests)
    };
    let mut out = Rebuilt::default();
    let now = Instant::now();
    for (engine_id, r) in requests {
        let raw = match &r {
            ResumedRequest::Live { tag, .. } | ResumedRequest::Finished { tag, .. } => tag,
        };
        let Some(tag) = Tag::from_bytes(raw) else {
            out.untagged += 1;
            continue;
        };
        let entry = entry_for(state, &tag);
        if tag.choice >= entry.lock().choices.len() {
            out.untagged += 1;
            continue;
        }
        state.registry.link(engine_id, &tag.id, tag.choice);
        match r {
            ResumedRequest::Live {
                id,
                rx,
                prompt_tokens,
                output,
                text,
                ..
            } => {
                // What was generated before the checkpoint streams at once; the rest follows.
                let end = output.len();
                let deltas = if end == 0 && text.is_empty() {
                    Vec::new()
                } else {
                    vec![Delta {
                        tokens: output,
                        text,
                        logprobs: Vec::new(),
                        end,
                    }]
                };
                entry.update(|d| {
                    d.choices[tag.choice] = Choice {
                        engine_id: Some(id),
                        prompt_tokens,
                        deltas,
                        prefix_unknown: false,
                        ..Choice::default()
                    }
                });
                out.live += 1;
                let target = PumpTarget {
                    entry: entry.clone(),
                    choice: tag.choice,
                    engine_id: id,
                    metrics: state.metrics.clone(),
                    engine: state.engine.clone(),
                    accepted: now,
                };
                pump::spawn(target, rx)?;
            }
            ResumedRequest::Finished { record, .. } => {
                let prompt = prompt_tokens(state, &entry, tag.choice);
                let end = record.output.len();
                entry.update(|d| {
                    d.choices[tag.choice] = Choice {
                        engine_id: Some(engine_id),
                        prompt_tokens: prompt,
                        deltas: vec![Delta {
                            tokens: record.output,
                            text: record.text,
                            logprobs: Vec::new(),
                            end,
                        }],
                        ending: Some(if engine_link::is_abort_record(&record.reason) {
                            Ending::Aborted
                        } else {
                            Ending::Done(record.reason)
                        }),
                        prefix_unknown: false,
                        receipt: None, // taken from the engine's book when read
                    }
                });
            }
        }
    }
    // A request whose choices were never all journaled (impossible with one group commit, but a
    // torn journal could) has choices with no record: mark them retryable.
    out.requests = state.registry.len();
    state.registry.for_each(|e| {
        e.update(|d| {
            for c in &mut d.choices {
                if c.engine_id.is_none() && c.ending.is_none() {
                    c.ending = Some(Ending::Aborted);
                }
            }
        })
    });
    Ok(out)
}
