//! The `own_machine` example's library half: a machine of its own (`examples/own_machine/spec.toml`,
//! the `waves` machine) compiled with `sov_macros::machine!` against sov's runtime interface
//! ([`sov::scheduler`]) from outside the `sov` crate, and [`run`], which serves requests with it on
//! sov's engine, steers it through the slots and verifies the checkpoints it wrote.
//!
//! Design: everything a user's own crate would do, in the order it would do it, using only sov's
//! public API: `machine!` generates `machine::Scheduler` (implementing [`sov::scheduler::Machine`]);
//! [`start_engine`] builds the engine for a model and that machine; requests go in with
//! [`sov::engine::Engine::submit_many`] and stream back per request; the live slots are read and
//! written through [`sov::scheduler::Slots`]; the checkpoint directory is audited with
//! [`sov::checkpoint::audit`]. The binary (`examples/own_machine/main.rs`) picks the model and
//! prints; the test (`examples/tests/own_machine.rs`) checks what [`run`] returns.
//!
//! The smallest use, as the README's "Using sov as a library" shows it (compiled as a doctest, so
//! that text stays true):
//!
//! ```no_run
//! mod machine {
//!     sov_macros::machine!("own_machine/spec.toml", interface = sov::scheduler);
//! }
//! use sov::app::start::{EngineOptions, ModelParts, start_engine};
//! use sov::engine::{Prompt, Request};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let dirs = sov::app::SovDirs::from_process_env()?;
//!     let path = sov::loader::resolve_model(None, &dirs.cache)?;
//!     let parts = ModelParts::from(sov::loader::load_model(&path, true)?);
//!     let started = start_engine::<machine::Scheduler>(parts, &EngineOptions::default())?;
//!     let rx = started.engine.submit(Request::new(Prompt::Text("Once upon a time".into()), 64))?.rx;
//!     for out in rx {
//!         print!("{}", out.text);
//!         if out.finished.is_some() {
//!             break;
//!         }
//!     }
//!     println!("{}", started.engine.slots().batch_size());
//!     started.engine.slots().set_power_state(sov::scheduler::PowerState::Suspend);
//!     println!("{}", machine::MERMAID);
//!     Ok(())
//! }
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sov::app::start::{
    CheckpointOptions, Device, EngineOptions, KvBudget, ModelParts, Started, start_engine,
};
use sov::checkpoint::digest::to_hex;
use sov::checkpoint::{Anchor, AuditOptions, CheckpointError, audit, keys};
use sov::engine::{EngineError, EngineStats, Finished, Request, TraceEntry};
use sov::scheduler::{Machine, PowerState};

/// The example's machine, generated from `examples/own_machine/spec.toml` against the interface
/// module `sov::scheduler` (where sov expanded `interface!` for `specs/runtime.toml`). The build
/// fails if the spec's interface file differs from the one sov was built with.
pub mod machine {
    sov_macros::machine!("own_machine/spec.toml", interface = sov::scheduler);
}

/// The machine type the engine runs.
pub type Waves = machine::Scheduler;

/// Where a run keeps its files.
#[derive(Debug, Clone)]
pub struct RunPlaces {
    /// The run directory: the slot file and `checkpoints/` (must not hold a run already).
    pub run_dir: PathBuf,
    /// sov's config directory, where the default signing key lives (created on first use).
    pub config_dir: PathBuf,
}

/// What [`run`] saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// The model's name.
    pub model_name: String,
    /// Per request, in submission order: its final accounting.
    pub finished: Vec<Finished>,
    /// Per request: how many stream events it delivered before finishing.
    pub events: Vec<usize>,
    /// Every transition the machine took (no-op steps excluded).
    pub trace: Vec<TraceEntry>,
    /// The engine's counters when it stopped.
    pub stats: EngineStats,
    /// The audit of the checkpoints the run wrote.
    pub verified: Verified,
    /// The wall time from the first submission to the last output.
    pub elapsed: Duration,
}

impl Report {
    /// The states the machine was in or moved to, by name.
    pub fn states_visited(&self) -> BTreeSet<&'static str> {
        self.trace.iter().flat_map(|t| [t.from, t.to]).collect()
    }

    /// Tokens generated over all requests.
    pub fn output_tokens(&self) -> usize {
        self.finished.iter().map(|f| f.output_tokens.len()).sum()
    }
}

/// The checkpoint chain of a run, verified.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The checkpoint directory audited.
    pub dir: PathBuf,
    /// The public key the receipts verified against.
    pub public_key: PathBuf,
    /// Receipts on the chain (every signature, link, snapshot and block checked).
    pub receipts: usize,
    /// The newest receipt's digest, lowercase hex (the slots' `receipt_digest`).
    pub head: String,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Starting the engine or submitting failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Reading the key or auditing the checkpoint directory failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The engine stopped before a request finished (the request's index).
    #[error("request {0}'s stream ended before it finished")]
    StreamEnded(usize),
    /// The suspend written to the slots did not lead to a checkpoint in time.
    #[error("the engine did not checkpoint within {0:?} of the suspend")]
    NoCheckpoint(Duration),
    /// Checkpoints were off, or signed with a key whose public half is unknown here.
    #[error("the run wrote no checkpoint key to verify against")]
    NoKey,
    /// The chain is empty or a receipt names another machine.
    #[error("verification failed: {0}")]
    Verify(String),
}

/// The engine options the example uses on `device`: a small batch, so the waves show, the
/// transition trace on, and checkpoints in `places.run_dir`.
pub fn engine_options(device: Device, places: &RunPlaces, max_batch: usize) -> EngineOptions {
    EngineOptions {
        device,
        kv_budget: KvBudget::Bytes(256 << 20),
        max_batch,
        trace: true,
        run_dir: Some(places.run_dir.clone()),
        checkpoints: Some(CheckpointOptions {
            mode: None,
            key: None,
            config_dir: places.config_dir.clone(),
            resume: false,
        }),
        ..EngineOptions::default()
    }
}

/// Serves `requests` with the `waves` machine, then suspends it through the slots (its suspend
/// interrupt checkpoints), stops the engine and audits the checkpoint chain.
pub fn run(
    parts: ModelParts,
    opts: &EngineOptions,
    requests: Vec<Request>,
) -> Result<Report, RunError> {
    let started: Started = start_engine::<Waves>(parts, opts)?;
    let engine = &started.engine;
    let t0 = Instant::now();
    let receivers = engine.submit_many(requests)?;
    let mut finished = Vec::with_capacity(receivers.len());
    let mut events = Vec::with_capacity(receivers.len());
    for (i, rx) in receivers.iter().enumerate() {
        let mut n = 0;
        let done = loop {
            let out = rx.rx.recv().map_err(|_| RunError::StreamEnded(i))?;
            n += 1;
            if let Some(f) = out.finished {
                break f;
            }
        };
        finished.push(done);
        events.push(n);
    }
    let elapsed = t0.elapsed();

    // Steer: raise power_state = suspend from outside, as `sov slots set power_state suspend`
    // would; the machine's interrupt checkpoints and parks in `suspended`.
    let slots = engine.slots().clone();
    let before = engine.stats().checkpoints;
    slots.set_power_state(PowerState::Suspend);
    let limit = Duration::from_secs(30);
    let waited = Instant::now();
    while engine.stats().checkpoints == before {
        if waited.elapsed() > limit {
            return Err(RunError::NoCheckpoint(limit));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let trace = engine.trace();
    let checkpoints = started.checkpoints;
    let stats = started.engine.shutdown()?;

    let info = checkpoints.ok_or(RunError::NoKey)?;
    let public_key = info.public_key.ok_or(RunError::NoKey)?;
    let verified = verify(&info.dir, &public_key, &slots.raw())?;
    Ok(Report {
        model_name: started.model_name,
        finished,
        events,
        trace,
        stats,
        verified,
        elapsed,
    })
}

/// Audits the checkpoint directory `dir` against `public_key` and the chain head the slots
/// published (a rolled-back directory fails), and checks that every receipt names this machine.
pub fn verify(dir: &Path, public_key: &Path, slots: &[u32; 32]) -> Result<Verified, RunError> {
    let key = keys::load_public(public_key)?;
    let a = audit(
        dir,
        AuditOptions {
            key: &key,
            policy: None,
            anchor: Anchor::from_slots(slots),
        },
    )?;
    let head = a
        .head()
        .ok_or_else(|| RunError::Verify("the chain holds no receipt".into()))?;
    if let Some(link) = a
        .chain
        .iter()
        .find(|l| l.receipt.body.spec != <Waves as Machine>::SPEC_DIGEST)
    {
        return Err(RunError::Verify(format!(
            "receipt {} names spec {}, not this machine's",
            link.receipt.body.height,
            to_hex(&link.receipt.body.spec)
        )));
    }
    Ok(Verified {
        dir: dir.to_path_buf(),
        public_key: public_key.to_path_buf(),
        receipts: a.chain.len(),
        head: to_hex(&head.receipt.digest),
    })
}

/// How often the machine took each transition (same states, cause and actions), in the order
/// first taken: one line per edge of its graph that the run used, e.g.
/// `generate -> checkpoint  rule:2  decode  x16`.
pub fn transition_counts(trace: &[TraceEntry]) -> Vec<String> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for t in trace {
        let actions = if t.actions.is_empty() {
            "-".to_string()
        } else {
            t.actions.join(",")
        };
        let line = format!("{} -> {}  {}  {}", t.from, t.to, t.cause, actions);
        match out.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => out.push((line, 1)),
        }
    }
    out.into_iter().map(|(l, n)| format!("{l}  x{n}")).collect()
}

/// The steps at which the machine ran `action`, with the state it ran it from.
pub fn steps_with(trace: &[TraceEntry], action: &str) -> Vec<(u64, &'static str)> {
    trace
        .iter()
        .filter(|t| t.actions.contains(&action))
        .map(|t| (t.step, t.from))
        .collect()
}
