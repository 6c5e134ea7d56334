//! The run directories under sov's state directory, as a user manages them: list each run with
//! its size, age and request counts, and prune old ones.
//!
//! Design: a run's state is read from its journal (`checkpoints/journal.log`: accepted requests
//! minus finished ones are its unfinished requests) and from its [`RunLock`] (held while an
//! engine uses it). Pruning never deletes a run that is in use, nor one with unfinished requests
//! unless forced: those are work a `--resume` would still deliver.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::run_dir::{RunLock, checkpoint_dir};
use crate::checkpoint::journal;

/// Errors of listing or pruning runs.
#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    /// A file system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A prune was asked for without saying what to keep.
    #[error("say what to prune: --keep N and/or --older-than DURATION")]
    NoPolicy,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunsError + '_ {
    move |source| RunsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One run directory as `sov runs list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// The run directory.
    pub dir: PathBuf,
    /// Bytes of every file in it.
    pub bytes: u64,
    /// When it was last written (its newest file).
    pub modified: SystemTime,
    /// Requests its journal accepted.
    pub requests: usize,
    /// Of those, the ones with no finished record (a resume would continue them).
    pub unfinished: usize,
    /// Its journal could not be read (the message); counts are then 0.
    pub journal_error: Option<String>,
    /// An engine holds the run now.
    pub in_use: bool,
}

impl RunSummary {
    /// `in use`, `unfinished` (resumable), `finished` or `unreadable`, for display.
    pub fn state(&self) -> &'static str {
        if self.in_use {
            "in use"
        } else if self.journal_error.is_some() {
            "unreadable"
        } else if self.unfinished > 0 {
            "unfinished"
        } else {
            "finished"
        }
    }
}

/// Size of everything under `dir`, and the newest modification time of its files (the lock file
/// aside: taking the lock is not work; a run without files counts from the directory's own time).
fn disk_usage(dir: &Path) -> Result<(u64, SystemTime), RunsError> {
    let mut bytes = 0;
    let mut newest = None;
    let lock = super::run_dir::lock_path(dir);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(io(&d))? {
            let entry = entry.map_err(io(&d))?;
            let meta = entry.metadata().map_err(io(&entry.path()))?;
            if meta.is_dir() {
                stack.push(entry.path());
                continue;
            }
            bytes += meta.len();
            if entry.path() != lock
                && let Ok(m) = meta.modified()
            {
                newest = Some(newest.map_or(m, |n: SystemTime| n.max(m)));
            }
        }
    }
    let newest = match newest {
        Some(t) => t,
        None => std::fs::metadata(dir)
            .and_then(|m| m.modified())
            .map_err(io(dir))?,
    };
    Ok((bytes, newest))
}

/// Summarizes one run directory.
pub fn summarize(dir: &Path) -> Result<RunSummary, RunsError> {
    let (bytes, modified) = disk_usage(dir)?;
    let (requests, unfinished, journal_error) = match journal::scan(&checkpoint_dir(dir)) {
        Ok(scan) => {
            let finished: std::collections::HashSet<u64> =
                scan.finished().map(|f| f.request_id).collect();
            let accepted: std::collections::HashSet<u64> =
                scan.accepted().iter().map(|a| a.request_id).collect();
            let open = accepted.iter().filter(|id| !finished.contains(id)).count();
            (accepted.len(), open, None)
        }
        Err(e) => (0, 0, Some(e.to_string())),
    };
    Ok(RunSummary {
        dir: dir.to_path_buf(),
        bytes,
        modified,
        requests,
        unfinished,
        journal_error,
        in_use: RunLock::is_held(dir),
    })
}

/// Every run directory under `<state_dir>/runs`, oldest first (by last write).
pub fn list_runs(state_dir: &Path) -> Result<Vec<RunSummary>, RunsError> {
    let runs = state_dir.join("runs");
    let entries = match std::fs::read_dir(&runs) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&runs)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(&runs))?;
        if entry.file_type().map_err(io(&entry.path()))?.is_dir() {
            out.push(summarize(&entry.path())?);
        }
    }
    out.sort_by(|a, b| a.modified.cmp(&b.modified).then(a.dir.cmp(&b.dir)));
    Ok(out)
}

/// What `sov runs prune` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrunePolicy {
    /// Keep the newest N runs.
    pub keep: Option<usize>,
    /// Remove only runs last written longer ago than this.
    pub older_than: Option<Duration>,
    /// Also remove runs with unfinished requests (never one in use).
    pub force: bool,
    /// Say what would go, remove nothing.
    pub dry_run: bool,
}

/// What a prune did.
#[derive(Debug, Default)]
pub struct PruneReport {
    /// Runs removed (or, in a dry run, that would be).
    pub removed: Vec<RunSummary>,
    /// Runs the policy selected but that were kept, with why.
    pub kept: Vec<(RunSummary, &'static str)>,
}

/// Removes the runs `policy` selects: beyond the newest `keep`, and older than `older_than`
/// (both when both are given), never one in use, nor one with unfinished requests or an
/// unreadable journal unless forced.
pub fn prune(
    state_dir: &Path,
    policy: PrunePolicy,
    now: SystemTime,
) -> Result<PruneReport, RunsError> {
    if policy.keep.is_none() && policy.older_than.is_none() {
        return Err(RunsError::NoPolicy);
    }
    let runs = list_runs(state_dir)?;
    let keep_from = runs.len().saturating_sub(policy.keep.unwrap_or(0));
    let mut report = PruneReport::default();
    for (i, run) in runs.into_iter().enumerate() {
        let beyond_keep = policy.keep.is_none() || i < keep_from;
        let old_enough = policy.older_than.is_none_or(|age| {
            now.duration_since(run.modified)
                .is_ok_and(|elapsed| elapsed > age)
        });
        if !(beyond_keep && old_enough) {
            continue;
        }
        if run.in_use {
            report.kept.push((run, "in use by a running engine"));
        } else if run.unfinished > 0 && !policy.force {
            report
                .kept
                .push((run, "has unfinished requests (resume it, or --force)"));
        } else if run.journal_error.is_some() && !policy.force {
            report.kept.push((
                run,
                "its journal cannot be read (see `sov runs list`; or --force)",
            ));
        } else {
            if !policy.dry_run {
                std::fs::remove_dir_all(&run.dir).map_err(io(&run.dir))?;
            }
            report.removed.push(run);
        }
    }
    Ok(report)
}

/// Parses a duration as `30s`, `15m`, `12h`, `7d` or `2w`.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}`: give a unit (s, m, h, d or w), e.g. 7d"))?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{text}`: expected a number then a unit, e.g. 7d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (s, m, h, d or w)")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}`: too long"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixture::request;
    use crate::checkpoint::journal::{FinishedRecord, Journal, JournalRecord};

    /// A run directory with `accepted` requests of which `finished` finished, last written
    /// `age` ago.
    fn run(state: &Path, name: &str, accepted: u64, finished: u64, age: Duration) -> PathBuf {
        let dir = state.join("runs").join(name);
        let cp = checkpoint_dir(&dir);
        std::fs::create_dir_all(&cp).unwrap();
        let mut j = Journal::new(&cp, 0);
        for id in 1..=accepted {
            j.append(&JournalRecord::Accepted(request(id))).unwrap();
        }
        for id in 1..=finished {
            j.append(&JournalRecord::Finished(FinishedRecord {
                request_id: id,
                output: vec![1],
                text: "a".into(),
                reason: "stop".into(),
                detail: String::new(),
            }))
            .unwrap();
        }
        let when = SystemTime::now() - age;
        let journal = std::fs::File::options()
            .append(true)
            .open(cp.join(journal::JOURNAL_FILE))
            .unwrap();
        journal.set_modified(when).unwrap();
        dir
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn list_reports_counts_and_state_oldest_first() {
        let state = tempfile::tempdir().unwrap();
        run(state.path(), "b", 3, 3, DAY);
        run(state.path(), "a", 2, 1, 3 * DAY);
        let held = run(state.path(), "c", 1, 1, Duration::ZERO);
        let _lock = RunLock::acquire(&held).unwrap();
        let runs = list_runs(state.path()).unwrap();
        let got: Vec<_> = runs
            .iter()
            .map(|r| {
                (
                    r.dir.file_name().unwrap().to_str().unwrap().to_string(),
                    r.requests,
                    r.unfinished,
                    r.state(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), 2, 1, "unfinished"),
                ("b".into(), 3, 0, "finished"),
                ("c".into(), 1, 0, "in use"),
            ]
        );
        assert!(runs.iter().all(|r| r.bytes > 0));
    }

    #[test]
    fn prune_never_takes_unfinished_or_running_work_unless_forced() {
        let state = tempfile::tempdir().unwrap();
        let unfinished = run(state.path(), "old-open", 2, 1, 10 * DAY);
        let done = run(state.path(), "old-done", 2, 2, 9 * DAY);
        let recent = run(state.path(), "recent", 1, 1, DAY);
        let now = SystemTime::now();
        let week = PrunePolicy {
            older_than: Some(7 * DAY),
            ..PrunePolicy::default()
        };
        let dry = prune(
            state.path(),
            PrunePolicy {
                dry_run: true,
                ..week
            },
            now,
        )
        .unwrap();
        assert_eq!(dry.removed.len(), 1);
        assert!(done.exists(), "a dry run removes nothing");
        let report = prune(state.path(), week, now).unwrap();
        assert_eq!(report.removed[0].dir, done);
        assert_eq!(report.kept[0].0.dir, unfinished);
        assert!(!done.exists() && unfinished.exists() && recent.exists());
        let lock = RunLock::acquire(&unfinished).unwrap();
        let forced = PrunePolicy {
            force: true,
            ..week
        };
        let report = prune(state.path(), forced, now).unwrap();
        assert!(report.removed.is_empty(), "in use");
        drop(lock);
        prune(state.path(), forced, now).unwrap();
        assert!(!unfinished.exists() && recent.exists());
        // --keep 0 with nothing else removes everything finished.
        let all = PrunePolicy {
            keep: Some(0),
            ..PrunePolicy::default()
        };
        prune(state.path(), all, now).unwrap();
        assert!(list_runs(state.path()).unwrap().is_empty());
        assert!(matches!(
            prune(state.path(), PrunePolicy::default(), now),
            Err(RunsError::NoPolicy)
        ));
    }

    #[test]
    fn keep_keeps_the_newest() {
        let state = tempfile::tempdir().unwrap();
        for (i, name) in ["x", "y", "z"].iter().enumerate() {
            run(state.path(), name, 1, 1, DAY * (3 - i as u32));
        }
        let keep1 = PrunePolicy {
            keep: Some(1),
            ..PrunePolicy::default()
        };
        let report = prune(state.path(), keep1, SystemTime::now()).unwrap();
        assert_eq!(report.removed.len(), 2);
        let left = list_runs(state.path()).unwrap();
        assert_eq!(left[0].dir.file_name().unwrap(), "z");
    }

    #[test]
    fn ages_parse_with_units() {
        assert_eq!(parse_age("7d"), Ok(7 * DAY));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("2w"), Ok(14 * DAY));
        for bad in ["7", "d", "7y", "-1d", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
