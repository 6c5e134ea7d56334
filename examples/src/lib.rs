//! Shared helpers for the example binaries: start an engine on a model, run a batch of requests
//! through it concurrently, print each result and the aggregate throughput. [`own_machine`] holds
//! the `own_machine` example's machine (compiled from its own spec) and its run, shared by that
//! binary and its test.

#![warn(missing_docs)]

use std::time::Instant;

use sov::app::start::{EngineOptions, ModelParts, Started, start_engine};
use sov::engine::{Finished, Request};
use sov::scheduler::seed::Scheduler;

pub mod own_machine;

/// Starts an engine running the default machine (`specs/scheduler.toml`).
pub fn start(parts: ModelParts, opts: &EngineOptions) -> anyhow::Result<Started> {
    Ok(start_engine::<Scheduler>(parts, opts)?)
}

/// Submits every request at once (they run as one continuous batch), waits for all, and prints
/// one line per request plus the aggregate output throughput. Returns the finished requests.
pub fn run_batch(
    started: &Started,
    requests: Vec<Request>,
    show_text: bool,
) -> anyhow::Result<Vec<Finished>> {
    let t0 = Instant::now();
    let receivers = requests
        .into_iter()
        .map(|r| started.engine.submit(r))
        .collect::<Result<Vec<_>, _>>()?;
    let mut done = Vec::new();
    for (i, rx) in receivers.iter().enumerate() {
        let finished = loop {
            let out = rx.rx.recv()?;
            if let Some(f) = out.finished {
                break f;
            }
        };
        if show_text {
            println!(
                "[{i}] {:?} ({}): {}",
                finished.reason,
                finished.output_tokens.len(),
                finished.text.trim()
            );
        }
        done.push(finished);
    }
    let secs = t0.elapsed().as_secs_f64();
    let tokens: usize = done.iter().map(|f| f.output_tokens.len()).sum();
    println!(
        "{}: {} requests, {tokens} tokens in {secs:.2}s = {:.1} output tok/s",
        started.model_name,
        done.len(),
        tokens as f64 / secs
    );
    Ok(done)
}
