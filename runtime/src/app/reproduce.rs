//! Re-executing a run: every finished request of a run directory's journal becomes a fresh
//! request with its journaled prompt and sampling parameters (seed included), and the tokens a
//! new engine generates are compared, token for token, with what the journal says was delivered.
//!
//! Design: the journal is the input, nothing else. A request that ended by `length`, `stop` or EOS
//! replays as it was submitted; one the client aborted replays up to the tokens it had when it
//! was aborted (its `max_tokens` cut to that length), since an abort's timing is not part of the
//! request; one that failed (`error`) is not replayable and is counted apart. Exactness holds where
//! the engine is batch-invariant and the backend and precision match the run's (the CPU backend).

use std::collections::HashMap;

use crate::checkpoint::Platform;
use crate::checkpoint::journal::{FinishedRecord, JournalScan};
use crate::engine::checkpointing::core_io::engine_sampling;
use crate::engine::constraint::Grammar;
use crate::engine::{Finished, Prompt, Request};

/// One finished request to replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Its id in the run.
    pub request_id: u64,
    /// The request as the journal accepted it.
    pub request: Request,
    /// What the journal says was delivered.
    pub expected: FinishedRecord,
}

/// What the journal offers for replay.
#[derive(Debug, Default)]
pub struct ReplayPlan {
    /// Requests to re-execute.
    pub replays: Vec<Replay>,
    /// Finished requests that cannot be replayed, with why (ended by an engine error, or never
    /// accepted in this journal).
    pub skipped: Vec<(u64, String)>,
    /// Accepted requests without a finished record (a `--resume` would continue them).
    pub unfinished: usize,
}

/// Builds the replay of every finished request in `scan`.
pub fn plan(scan: &JournalScan) -> ReplayPlan {
    let accepted: HashMap<u64, _> = scan
        .accepted()
        .into_iter()
        .map(|a| (a.request_id, a))
        .collect();
    let mut plan = ReplayPlan::default();
    let mut finished_ids = std::collections::HashSet::new();
    for f in scan.finished() {
        if !finished_ids.insert(f.request_id) {
            continue;
        }
        let Some(a) = accepted.get(&f.request_id) else {
            plan.skipped
                .push((f.request_id, "finished but never accepted".into()));
            continue;
        };
        if f.reason == "error" {
            plan.skipped.push((
                f.request_id,
                format!("ended by an engine error: {}", f.detail),
            ));
            continue;
        }
        let max_tokens = if f.reason == "abort" {
            f.output.len()
        } else {
            a.sampling.max_tokens as usize
        };
        let grammar = match a.sampling.grammar.as_deref().map(Grammar::from_record) {
            None => None,
            Some(Ok(g)) => Some(g),
            Some(Err(e)) => {
                plan.skipped.push((f.request_id, e.to_string()));
                continue;
            }
        };
        if max_tokens == 0 {
            plan.skipped
                .push((f.request_id, "aborted before its first token".into()));
            continue;
        }
        plan.replays.push(Replay {
            request_id: f.request_id,
            request: Request {
                prompt: Prompt::Tokens(a.prompt.clone()),
                max_tokens,
                sampling: engine_sampling(&a.sampling),
                stop: a.sampling.stop.clone(),
                ignore_eos: a.sampling.ignore_eos,
                tag: Vec::new(),
                grammar,
            },
            expected: f.clone(),
        });
    }
    plan.unfinished = accepted
        .keys()
        .filter(|id| !finished_ids.contains(id))
        .count();
    plan.replays.sort_by_key(|r| r.request_id);
    plan
}

/// How one replay compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Same tokens (and, unless aborted, the same text and finish reason).
    Reproduced,
    /// The tokens differ from position `at` on (or the text or reason differs: `at` is None).
    Differs {
        /// First token index that differs (None: tokens equal, text or reason not).
        at: Option<usize>,
        /// What differs, for a person.
        what: String,
    },
}

/// Compares a replay's result with what the journal recorded.
pub fn compare(expected: &FinishedRecord, got: &Finished) -> Verdict {
    let ours = &got.output_tokens;
    let theirs = &expected.output;
    if ours != theirs {
        let at = ours
            .iter()
            .zip(theirs)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(theirs.len()));
        return Verdict::Differs {
            at: Some(at),
            what: format!(
                "token {at}: replay {:?}, journal {:?} ({} vs {} tokens)",
                ours.get(at),
                theirs.get(at),
                ours.len(),
                theirs.len()
            ),
        };
    }
    if expected.reason == "abort" {
        return Verdict::Reproduced;
    }
    if got.reason.as_openai() != expected.reason {
        return Verdict::Differs {
            at: None,
            what: format!(
                "finish reason: replay {}, journal {}",
                got.reason.as_openai(),
                expected.reason
            ),
        };
    }
    if got.text != expected.text {
        return Verdict::Differs {
            at: None,
            what: "same tokens, different text".into(),
        };
    }
    Verdict::Reproduced
}

/// Why a replay on `replay` may not reproduce a run that its heads say ran on `run` bit for bit
/// (None: same backend, precision and sampler, and a batch-invariant backend). A head without
/// the backend and precision lines (older runs) gives no reason; one without the sampler line
/// (before the draw rule was named) says sampled requests were drawn by an earlier rule.
pub fn replay_caveat(run: &Platform, replay: &Platform) -> Option<String> {
    let name = |p: &Platform| {
        format!(
            "{}/{}",
            p.backend.as_deref().unwrap_or("?"),
            p.precision.as_deref().unwrap_or("?")
        )
    };
    if run.backend.is_none() && run.precision.is_none() {
        return None;
    }
    if (&run.backend, &run.precision) != (&replay.backend, &replay.precision) {
        return Some(format!(
            "the run's signed heads say it ran on {}, this replay runs on {}: the arithmetic \
             differs, so outputs can differ without any forgery; replay on {} for a bit-exact audit",
            name(run),
            name(replay),
            name(run)
        ));
    }
    if run.sampler != replay.sampler {
        let rule = |p: &Platform| {
            p.sampler
                .clone()
                .unwrap_or_else(|| "an earlier rule".into())
        };
        return Some(format!(
            "the run's signed heads say its sampled tokens were drawn by {}, this replay draws by \
             {}: sampled requests can differ without any forgery (greedy ones must not)",
            rule(run),
            rule(replay)
        ));
    }
    let invariant = run.backend.as_deref() == Some("cpu")
        || run
            .precision
            .as_deref()
            .is_some_and(|p| p.contains("-deterministic"));
    if !invariant {
        return Some(format!(
            "the run ran on {} without batch-invariant kernels (--deterministic): a request's \
             tokens can depend on its batch, so a difference is not proof of forgery",
            name(run)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixture::request;
    use crate::checkpoint::journal::JournalRecord;
    use crate::engine::FinishReason;

    fn finished(id: u64, output: Vec<u32>, reason: &str) -> FinishedRecord {
        FinishedRecord {
            request_id: id,
            output,
            text: "ab".into(),
            reason: reason.into(),
            detail: String::new(),
        }
    }

    fn scan(records: Vec<JournalRecord>) -> JournalScan {
        JournalScan {
            records: records.into_iter().map(|r| (0, r)).collect(),
            ..JournalScan::default()
        }
    }

    #[test]
    fn plan_replays_finished_requests_with_their_seed_and_cuts_aborted_ones() {
        let s = scan(vec![
            JournalRecord::Accepted(request(1)),
            JournalRecord::Accepted(request(2)),
            JournalRecord::Accepted(request(3)),
            JournalRecord::Accepted(request(4)),
            JournalRecord::Finished(finished(2, vec![7, 8, 9], "abort")),
            JournalRecord::Finished(finished(1, vec![1], "length")),
            JournalRecord::Finished(finished(3, vec![], "error")),
            JournalRecord::Finished(finished(9, vec![1], "stop")),
        ]);
        let p = plan(&s);
        let ids: Vec<u64> = p.replays.iter().map(|r| r.request_id).collect();
        assert_eq!(ids, [1, 2]);
        let r1 = &p.replays[0].request;
        assert_eq!(r1.max_tokens, 32);
        assert_eq!(r1.sampling.seed, Some(1));
        assert_eq!(r1.sampling.temperature, 0.8);
        assert_eq!(r1.prompt, Prompt::Tokens(vec![1, 2, 3, 1]));
        assert_eq!(
            p.replays[1].request.max_tokens, 3,
            "aborted: up to its tokens"
        );
        let skipped: Vec<u64> = p.skipped.iter().map(|s| s.0).collect();
        assert_eq!(skipped, [3, 9]);
        assert_eq!(p.unfinished, 1);
    }

    #[test]
    fn compare_names_the_first_differing_token() {
        let got = |tokens: Vec<u32>, reason| Finished {
            reason,
            prompt_tokens: 4,
            output_tokens: tokens,
            text: "ab".into(),
            time_to_first_token: None,
            inter_token_latencies: Vec::new(),
            preemptions: 0,
        };
        let e = finished(1, vec![1, 2, 3], "length");
        assert_eq!(
            compare(&e, &got(vec![1, 2, 3], FinishReason::Length)),
            Verdict::Reproduced
        );
        assert!(matches!(
            compare(&e, &got(vec![1, 5, 3], FinishReason::Length)),
            Verdict::Differs { at: Some(1), .. }
        ));
        assert!(matches!(
            compare(&e, &got(vec![1, 2], FinishReason::Length)),
            Verdict::Differs { at: Some(2), .. }
        ));
        assert!(matches!(
            compare(&e, &got(vec![1, 2, 3], FinishReason::Eos)),
            Verdict::Differs { at: None, .. }
        ));
        let aborted = finished(1, vec![1, 2, 3], "abort");
        assert_eq!(
            compare(&aborted, &got(vec![1, 2, 3], FinishReason::Length)),
            Verdict::Reproduced
        );
    }

    #[test]
    fn replay_caveats_name_backend_and_precision() {
        let p = |b: &str, q: &str| Platform {
            backend: Some(b.into()),
            precision: Some(q.into()),
            sampler: Some("draw-1".into()),
        };
        assert_eq!(replay_caveat(&p("cpu", "f32"), &p("cpu", "f32")), None);
        let gpu_on_cpu = replay_caveat(&p("cuda", "bf16"), &p("cpu", "f32")).unwrap();
        assert!(
            gpu_on_cpu.contains("cuda/bf16") && gpu_on_cpu.contains("cpu/f32"),
            "{gpu_on_cpu}"
        );
        assert!(replay_caveat(&p("cuda", "bf16"), &p("cuda", "bf16")).is_some());
        let det = p("cuda", "bf16-deterministic");
        assert_eq!(replay_caveat(&det, &det), None);
        assert!(replay_caveat(&det, &p("cuda", "bf16")).is_some());
        // Another attention split length rounds differently: named, and invariant in itself.
        let split256 = p("cuda", "bf16-deterministic-split256");
        assert_eq!(replay_caveat(&split256, &split256), None);
        assert!(replay_caveat(&det, &split256).is_some());
        assert_eq!(replay_caveat(&Platform::default(), &p("cpu", "f32")), None);
        // A run from before the draw rule was named, or drawn by another rule.
        let unnamed = Platform {
            sampler: None,
            ..p("cpu", "f32")
        };
        let why = replay_caveat(&unnamed, &p("cpu", "f32")).unwrap();
        assert!(
            why.contains("an earlier rule") && why.contains("draw-1"),
            "{why}"
        );
        let other = Platform {
            sampler: Some("draw-0".into()),
            ..p("cpu", "f32")
        };
        assert!(replay_caveat(&other, &p("cpu", "f32")).is_some());
    }
}
