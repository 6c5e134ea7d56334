//! `sov runs list` and `sov runs prune`: the run directories under sov's state directory, with
//! their size, age and requests, and their removal (see [`crate::app::runs`] for the rules).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::app::SovDirs;
use crate::app::runs::{PrunePolicy, RunSummary, list_runs, parse_age, prune};

/// `sov runs ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RunsCommand {
    /// Every run directory, oldest first: size, last write, requests, state.
    List {
        /// One JSON object per run instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove old run directories. Never removes one in use, nor one with unfinished requests
    /// (which `--resume` would still deliver) unless `--force`.
    Prune {
        /// Keep the newest N runs.
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
        /// Remove only runs last written longer ago than this (30m, 12h, 7d, 2w).
        #[arg(long, value_name = "AGE", value_parser = parse_age)]
        older_than: Option<Duration>,
        /// Also remove runs with unfinished requests.
        #[arg(long)]
        force: bool,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn age(run: &RunSummary, now: SystemTime) -> String {
    let secs = now
        .duration_since(run.modified)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s if s < 172_800 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// Runs `sov runs`.
pub fn run(cmd: RunsCommand, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now();
    match cmd {
        RunsCommand::List { json } => {
            let runs = list_runs(&dirs.state)?;
            if json {
                for r in &runs {
                    let modified_s = r
                        .modified
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    println!(
                        "{}",
                        json!({
                            "dir": r.dir, "bytes": r.bytes, "modified_unix_s": modified_s,
                            "requests": r.requests, "unfinished": r.unfinished,
                            "state": r.state(), "journal_error": r.journal_error,
                        })
                    );
                }
            } else if runs.is_empty() {
                eprintln!("sov: no runs under {}", dirs.state.join("runs").display());
            } else {
                println!(
                    "{:<10} {:>10} {:>9} {:>10}  DIR",
                    "STATE", "SIZE", "REQUESTS", "WRITTEN"
                );
                for r in &runs {
                    println!(
                        "{:<10} {:>10} {:>9} {:>10}  {}",
                        r.state(),
                        human_bytes(r.bytes),
                        format!("{}/{}", r.requests - r.unfinished, r.requests),
                        age(r, now),
                        r.dir.display()
                    );
                }
                let total: u64 = runs.iter().map(|r| r.bytes).sum();
                println!("{} runs, {}", runs.len(), human_bytes(total));
            }
        }
        RunsCommand::Prune {
            keep,
            older_than,
            force,
            dry_run,
        } => {
            let policy = PrunePolicy {
                keep,
                older_than,
                force,
                dry_run,
            };
            let report = prune(&dirs.state, policy, now)?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for r in &report.removed {
                println!("{verb} {} ({})", r.dir.display(), human_bytes(r.bytes));
            }
            for (r, why) in &report.kept {
                println!("kept {}: {why}", r.dir.display());
            }
            let freed: u64 = report.removed.iter().map(|r| r.bytes).sum();
            eprintln!(
                "sov: {verb} {} run{}, {}",
                report.removed.len(),
                if report.removed.len() == 1 { "" } else { "s" },
                human_bytes(freed)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
