//! From a checked [`Job`] to engine requests: one per choice (prompts times `n`, seed + i), each
//! tagged with the server's metadata, journaled together by `submit_many`, then pumped into the
//! registry.
//!
//! Design: the journal write happens here, before any response byte is sent, so every request a
//! client saw accepted survives a crash. Blocking (fsync): call from `spawn_blocking`.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::RngCore;

use super::engine_link;
use super::error::ApiError;
use super::params::Job;
use super::pump::{self, PumpTarget};
use super::registry::{Choice, Ending, Endpoint, Entry, Tag};
use super::state::AppState;
use crate::engine::{Prompt, Request};

/// A fresh external id: `cmpl-…` or `chatcmpl-…` and 32 random hex digits.
pub fn new_id(endpoint: Endpoint) -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match endpoint {
        Endpoint::Completion => format!("cmpl-{hex}"),
        Endpoint::Chat => format!("chatcmpl-{hex}"),
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Gives an unseeded body a random seed, so a retry of an aborted request (and a resume)
/// reproduces the same tokens.
pub fn ensure_seed(body: &mut serde_json::Value) {
    if let Some(obj) = body.as_object_mut()
        && obj.get("seed").is_none_or(|s| s.is_null())
    {
        let seed = rand::thread_rng().next_u32() as i64;
        obj.insert("seed".into(), serde_json::Value::from(seed));
    }
}

/// The engine request of choice `i` of `job`.
fn engine_request(job: &Job, i: usize) -> Request {
    let p = &job.prompts[i / job.n.max(1)];
    let mut sampling = job.sampling.clone();
    sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
    let mut r = Request::new(Prompt::Tokens(p.tokens.clone()), p.max_tokens);
    r.sampling = sampling;
    r.stop = job.stop.clone();
    r.ignore_eos = job.ignore_eos;
    engine_link::set_bias_and_min_tokens(&mut r, &job.logit_bias, job.min_tokens);
    r.grammar = job.grammar.clone();
    r
}

/// Submits choices `which` of `job` for `entry` (all of them for a new request; the aborted ones
/// on a retry), resetting their records, and starts their pumps. Blocking.
pub fn start(
    state: &AppState,
    entry: &Arc<Entry>,
    job: &Job,
    which: &[usize],
) -> Result<(), ApiError> {
    if let Some(max) = state.info.max_waiting {
        let waiting = state.engine.slots().pending_request_count() as usize;
        if waiting + which.len() > max {
            return Err(ApiError::queue_full(1));
        }
    }
    let requests: Vec<_> = which
        .iter()
        .map(|&i| {
            let tag = Tag {
                id: entry.id.clone(),
                choice: i,
                choices: job.choices(),
                created: entry.created,
                endpoint: entry.endpoint,
                body: entry.body.clone(),
            };
            (engine_request(job, i), tag.to_bytes())
        })
        .collect();
    let accepted = Instant::now();
    let submitted = match engine_link::submit(&state.engine, requests) {
        Ok(s) => s,
        Err(e) => {
            entry.update(|d| {
                for &i in which {
                    if d.choices[i].engine_id.is_none() {
                        d.choices[i].ending = Some(Ending::Aborted);
                    }
                }
            });
            return Err(e.into());
        }
    };
    entry.update(|d| {
        for (&i, s) in which.iter().zip(&submitted) {
            d.choices[i] = Choice {
                engine_id: Some(s.id),
                prompt_tokens: job.prompts[i / job.n.max(1)].tokens.len(),
                ..Choice::default()
            };
        }
    });
    for (&i, s) in which.iter().zip(submitted) {
        state.metrics.on_request_start();
        state.registry.link(s.id, &entry.id, i);
        let target = PumpTarget {
            entry: entry.clone(),
            choice: i,
            engine_id: s.id,
            metrics: state.metrics.clone(),
            engine: state.engine.clone(),
            accepted,
        };
        pump::spawn(target, s.rx)
            .map_err(|e| ApiError::internal(format!("cannot start a pump thread: {e}")))?;
    }
    tracing::info!(request = %entry.id, choices = which.len(), "accepted");
    Ok(())
}

/// Claims the choices of `entry` that an abort (a client's disconnect) or a lost engine request
/// ended, and submits them again: same prompt, parameters and seed, so the same tokens. Returns
/// how many; a second caller finds them claimed. Blocking.
pub fn restart_aborted(state: &AppState, entry: &Arc<Entry>) -> Result<usize, ApiError> {
    let claimed: Vec<usize> = {
        let mut d = entry.lock();
        let ids: Vec<usize> = d
            .choices
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.ending, Some(Ending::Aborted | Ending::Lost)))
            .map(|(i, _)| i)
            .collect();
        for &i in &ids {
            d.choices[i] = Choice::default();
        }
        ids
    };
    if claimed.is_empty() {
        return Ok(0);
    }
    if state.engine.interrupted() {
        entry.update(|d| {
            for &i in &claimed {
                d.choices[i].ending = Some(Ending::Lost);
            }
        });
        return Err(ApiError::unavailable("shutting down", 10));
    }
    let job = super::params::parse(entry.endpoint, &entry.body, &state.job_context())?;
    tracing::info!(request = %entry.id, choices = claimed.len(), "re-submitting");
    start(state, entry, &job, &claimed)?;
    Ok(claimed.len())
}
