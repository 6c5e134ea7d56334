//! Pump threads: one per engine request, moving its output events from the engine's channel into
//! the registry and calling the metrics hooks when it finishes.
//!
//! Design: the engine's receivers are blocking `std::sync::mpsc`, so each is drained on its own
//! small OS thread, never on the tokio runtime; the registry entry's `watch` wakes the async
//! readers.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use super::engine_link;
use super::metrics::ServerMetrics;
use super::registry::{Delta, Ending, Entry};
use crate::engine::{Engine, Output};

const PUMP_STACK: usize = 256 << 10;

/// Where a pump writes and what it reports to.
pub struct PumpTarget {
    /// The request.
    pub entry: Arc<Entry>,
    /// Which of its choices.
    pub choice: usize,
    /// The engine request (a choice re-submitted after an abort has a newer one; events of the
    /// old one are then ignored).
    pub engine_id: u64,
    /// Metrics hooks.
    pub metrics: Arc<ServerMetrics>,
    /// The engine (to tell a shutdown from a failure when the channel closes).
    pub engine: Arc<Engine>,
    /// When the request was accepted (end-to-end latency).
    pub accepted: Instant,
}

/// Starts draining `rx` into `target` on a new thread.
pub fn spawn(target: PumpTarget, rx: Receiver<Output>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("sov-serve-pump".into())
        .stack_size(PUMP_STACK)
        .spawn(move || run(target, rx))
        .map(|_| ())
}

fn run(t: PumpTarget, rx: Receiver<Output>) {
    let c = t.choice;
    while let Ok(out) = rx.recv() {
        let finished = out.finished;
        if let Some(f) = &finished
            && t.entry.lock().choices[c].engine_id == Some(t.engine_id)
        {
            // Counted before the client is released, so a scrape after the answer sees it.
            if let Some(ttft) = f.time_to_first_token {
                t.metrics.on_first_token(ttft);
            }
            for gap in &f.inter_token_latencies {
                t.metrics.on_token_gap(*gap);
            }
            t.metrics.on_finish(
                f.reason.as_openai(),
                t.accepted.elapsed(),
                f.prompt_tokens,
                f.output_tokens.len(),
            );
        }
        let mut current = true;
        t.entry.update(|d| {
            let ch = &mut d.choices[c];
            if ch.engine_id != Some(t.engine_id) {
                current = false;
                return;
            }
            if !out.tokens.is_empty() || !out.text.is_empty() {
                let end = ch.tokens() + out.tokens.len();
                ch.deltas.push(Delta {
                    tokens: out.tokens,
                    text: out.text,
                    logprobs: out.logprobs,
                    end,
                });
            }
            if let Some(f) = &finished {
                if ch.prefix_unknown {
                    // Resumed mid-generation: the final record holds the whole output.
                    ch.deltas = vec![Delta {
                        tokens: f.output_tokens.clone(),
                        text: f.text.clone(),
                        logprobs: Vec::new(),
                        end: f.output_tokens.len(),
                    }];
                    ch.prefix_unknown = false;
                }
                ch.prompt_tokens = f.prompt_tokens;
                ch.ending = Some(if engine_link::is_abort(&f.reason) {
                    Ending::Aborted
                } else {
                    Ending::Done(f.reason.as_openai().to_string())
                });
            }
        });
        if !current {
            return;
        }
        if finished.is_some() {
            return;
        }
    }
    if !t.engine.interrupted() {
        tracing::warn!(request = %t.entry.id, choice = c, "engine channel closed before the request finished");
    }
    t.entry.update(|d| {
        let ch = &mut d.choices[c];
        if ch.engine_id == Some(t.engine_id) && ch.ending.is_none() {
            ch.ending = Some(Ending::Lost);
        }
    });
}
