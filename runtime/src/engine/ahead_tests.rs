//! Decode steps launched ahead ([`super::ahead`]) against the in-turn path on the deterministic
//! [`FakeModel`], run the way a GPU runs them: a launched step computes at once (its KV written
//! before the host commits the step before, as the device's one stream orders it) and its picks
//! wait until asked for; a fed row's input token is the model's own pick of the same row one
//! launch earlier. Every request's tokens, text, events and finish reason are the in-turn ones,
//! with stop strings, EOS, length and context limits, drawn and host-sampled rows, preemption,
//! mixed prefill and a failed pass, and steps really went ahead. The same fake launches prefill
//! passes ahead ([`super::prefill_ahead`]; `Mode::Ahead` turns both on, as a GPU does), with
//! failed pass launches and waits.
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::core::EngineCore;
use super::error::EngineError;
use super::fake::FakeModel;
use super::forward::{ForwardModel, PickedRows, RowPick};
use super::hook::CheckpointHook;
use super::overlap_tests::{
    BS, Mode, Received, VOCAB, fake, requests, run, run_checkpointed, run_with,
};
use crate::model::batch::SeqChunk;

/// [`FakeModel`] with [`ForwardModel::launch_decode`]: launched steps queue their picks; fed
/// steps take the last launch's picks as their tokens, through the row map; waiting for launch number `fail_at`
/// fails, as a device reports a failed step when the host waits for it. Any call made out of order (an unfed launch
/// or an in-turn pass while a step is in flight, a fed launch with none, rows that do not line
/// up, a third step in flight) is an error, which ends the run's requests and fails the test.
struct Ahead {
    model: FakeModel,
    /// Launch number and picks of the launched steps not yet waited for, oldest first.
    queue: VecDeque<(usize, PickedRows)>,
    /// Decode steps launched so far.
    launches: usize,
    /// `[rows]` the tokens the last launched step picked.
    last: Vec<u32>,
    /// Fed launches so far.
    fed: Arc<AtomicUsize>,
    /// The launch (counting from 1) whose wait fails, if any.
    fail_at: Option<usize>,
    /// Every this many fed launches, one fails before it enqueues anything.
    fail_fed_every: Option<usize>,
    /// Picks of the prefill passes launched and not yet waited for, with their launch number
    /// (counting from 1), oldest first.
    passes: VecDeque<(usize, PickedRows)>,
    /// Prefill passes launched so far.
    pass_launches: usize,
    /// Prefill passes launched while another was in flight.
    passes_ahead: Arc<AtomicUsize>,
    /// The pass (counting launches from 1) whose wait fails, if any.
    fail_pass_at: Option<usize>,
    /// Every this many pass launches, one fails before it enqueues anything.
    fail_pass_launch_every: Option<usize>,
}

impl Ahead {
    fn new(model: FakeModel) -> Self {
        Self {
            model,
            queue: VecDeque::new(),
            launches: 0,
            last: Vec::new(),
            fed: Arc::default(),
            fail_at: None,
            fail_fed_every: None,
            passes: VecDeque::new(),
            pass_launches: 0,
            passes_ahead: Arc::default(),
            fail_pass_at: None,
            fail_pass_launch_every: None,
        }
    }

    fn idle(&self) -> Result<(), String> {
        match (self.queue.len(), self.passes.len()) {
            (0, 0) => Ok(()),
            (n, p) => Err(format!(
                "an in-turn pass with {n} decode steps and {p} passes in flight"
            )),
        }
    }
}

impl ForwardModel for Ahead {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.idle()?;
        self.model.forward(chunks)
    }
    fn launches_decode(&self, picks: &[RowPick]) -> bool {
        picks.iter().all(RowPick::is_token)
    }
    fn launch_decode(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), String> {
        if chunks.len() != picks.len() || !chunks.iter().all(|c| c.tokens.len() == 1) {
            return Err("not a decode step".into());
        }
        let tokens: Vec<u32> = if let Some(map) = fed {
            let rows = self.last.len();
            if self.queue.len() != 1
                || map.len() != chunks.len()
                || map.iter().any(|&r| r as usize >= rows)
                || !map.is_sorted()
            {
                return Err(format!(
                    "fed launch of {} rows (map {map:?}) with {} steps in flight, {rows} rows before",
                    chunks.len(),
                    self.queue.len(),
                ));
            }
            let fed = self.fed.fetch_add(1, Ordering::Relaxed) + 1;
            if self.fail_fed_every.is_some_and(|k| fed.is_multiple_of(k)) {
                return Err("the launch failed".into());
            }
            map.iter().map(|&r| self.last[r as usize]).collect()
        } else {
            self.idle()?;
            chunks.iter().map(|c| c.tokens[0]).collect()
        };
        let fed_chunks: Vec<SeqChunk<'_>> = chunks
            .iter()
            .zip(&tokens)
            .map(|(c, t)| SeqChunk {
                tokens: std::slice::from_ref(t),
                start_pos: c.start_pos,
                block_table: c.block_table,
            })
            .collect();
        let picked = self.model.forward_pick(&fed_chunks, picks)?;
        self.launches += 1;
        self.last = picked
            .tokens
            .iter()
            .map(|t| t.ok_or("a row without a token"))
            .collect::<Result<_, _>>()?;
        self.queue.push_back((self.launches, picked));
        Ok(())
    }
    fn wait_decode(&mut self) -> Result<PickedRows, String> {
        match self.queue.pop_front() {
            Some((n, _)) if Some(n) == self.fail_at => Err("the device fell over".into()),
            Some((_, picked)) => Ok(picked),
            None => Err("no decode step in flight".into()),
        }
    }
    fn launches_pass(&self, picks: &[RowPick]) -> bool {
        picks.iter().all(|p| *p != RowPick::Logits)
    }
    /// Computes the pass at once (its KV written before any later pass, as the device's one
    /// stream orders it) and queues its picks.
    fn launch_pass(&mut self, chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> Result<(), String> {
        if !self.queue.is_empty() || self.passes.len() >= 2 {
            return Err(format!(
                "a pass launched with {} decode steps and {} passes in flight",
                self.queue.len(),
                self.passes.len()
            ));
        }
        if picks.contains(&RowPick::Logits) {
            return Err("a pass launched with a row the host samples".into());
        }
        self.pass_launches += 1;
        if (self.fail_pass_launch_every).is_some_and(|k| self.pass_launches.is_multiple_of(k)) {
            return Err("the pass launch failed".into());
        }
        if !self.passes.is_empty() {
            self.passes_ahead.fetch_add(1, Ordering::Relaxed);
        }
        let picked = self.model.forward_pick(chunks, picks)?;
        self.passes.push_back((self.pass_launches, picked));
        Ok(())
    }
    fn wait_pass(&mut self) -> Result<PickedRows, String> {
        match self.passes.pop_front() {
            Some((n, _)) if Some(n) == self.fail_pass_at => Err("the pass fell over".into()),
            Some((_, picked)) => Ok(picked),
            None => Err("no pass in flight".into()),
        }
    }
}

/// An [`Ahead`] over [`fake`] and its count of fed launches.
fn ahead(num_blocks: usize) -> (Ahead, Arc<AtomicUsize>) {
    let m = Ahead::new(fake(num_blocks));
    let fed = m.fed.clone();
    (m, fed)
}

#[test]
fn decode_ahead_gives_the_in_turn_outputs() {
    for (mixed, sampled) in [(false, false), (true, false), (false, true), (true, true)] {
        let case = format!("mixed {mixed}, sampled rows {sampled}");
        let (want, _, _) = run(fake(256), Mode::InTurn, 256, mixed, sampled);
        let (model, fed) = ahead(256);
        let (got, _, overlapped) = run(model, Mode::Ahead, 256, mixed, sampled);
        assert_eq!(got, want, "{case}");
        assert!(overlapped > std::time::Duration::ZERO, "{case}");
        let fed = fed.load(Ordering::Relaxed);
        eprintln!("{case}: {fed} steps ahead");
        assert!(fed > 0, "steps went ahead ({case})");
        // Overlapped without going ahead, the model's launches still give the same outputs.
        let (model, fed) = ahead(256);
        assert_eq!(
            run(model, Mode::Overlap, 256, mixed, sampled).0,
            want,
            "{case}"
        );
        assert_eq!(fed.load(Ordering::Relaxed), 0, "{case}");
    }
}

#[test]
fn decode_ahead_survives_preemption() {
    let mut preempted = 0;
    for sampled in [false, true] {
        let (want, _, _) = run(fake(256), Mode::InTurn, 256, false, sampled);
        for blocks in [10, 12, 14] {
            let case = format!("{blocks} blocks, sampled rows {sampled}");
            let (model, fed) = ahead(blocks);
            let (got, preemptions, _) = run(model, Mode::Ahead, blocks, false, sampled);
            assert_eq!(got, want, "{case}");
            assert!(fed.load(Ordering::Relaxed) > 0, "{case}");
            preempted += preemptions;
        }
    }
    assert!(
        preempted > 0,
        "the small caches preempt with steps going ahead"
    );
}

#[test]
fn a_failed_launch_ahead_loses_nothing() {
    // Every third fed launch fails before it enqueues anything: the step in flight is waited
    // for as usual and the next step launched in turn.
    let (want, _, _) = run(fake(256), Mode::InTurn, 256, false, false);
    let mut model = Ahead::new(fake(256));
    model.fail_fed_every = Some(3);
    let fed = model.fed.clone();
    let (got, _, _) = run(model, Mode::Ahead, 256, false, false);
    assert_eq!(got, want);
    assert!(
        fed.load(Ordering::Relaxed) >= 6,
        "launches failed and others went ahead"
    );
}

#[test]
fn decode_ahead_ends_at_the_context_as_in_turn() {
    let want = run_with(fake(256), Mode::InTurn, 256, false, requests(false), 48).0;
    assert!(
        want.iter()
            .any(|r| r.3 == super::output::FinishReason::ContextLength)
    );
    let (model, fed) = ahead(256);
    assert_eq!(
        run_with(model, Mode::Ahead, 256, false, requests(false), 48).0,
        want
    );
    assert!(fed.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_failed_step_ends_the_same_requests_ahead_or_not() {
    // The decode step whose wait fails: the first, and two in the middle of the run.
    for fail_at in [1, 20, 21] {
        let mut model = Ahead::new(fake(256));
        model.fail_at = Some(fail_at);
        let want: Vec<Received> =
            run_with(model, Mode::Overlap, 256, false, requests(false), 2048).0;
        let errors = want
            .iter()
            .filter(|r| matches!(r.3, super::output::FinishReason::Error(_)))
            .count();
        assert!(
            errors > 0,
            "the failed pass ended requests (call {fail_at})"
        );
        let mut model = Ahead::new(fake(256));
        model.fail_at = Some(fail_at);
        let got = run_with(model, Mode::Ahead, 256, false, requests(false), 2048).0;
        // The step launched ahead of the failed one ran for the same rows and is dropped.
        assert_eq!(got, want, "failure at launch {fail_at}");
    }
}

/// Records, at each checkpoint, whether a step was in flight or its work pending.
struct InFlightAtCheckpoint(Arc<std::sync::Mutex<Vec<bool>>>);

impl CheckpointHook<EngineCore<Ahead>> for InFlightAtCheckpoint {
    fn checkpoint(&mut self, core: &mut EngineCore<Ahead>) -> Result<(), EngineError> {
        if let Ok(mut v) = self.0.lock() {
            v.push(
                core.ahead.is_some()
                    || core.pending.is_some()
                    || !core.model.queue.is_empty()
                    || !core.model.passes.is_empty(),
            );
        }
        Ok(())
    }
    fn restore(&mut self, _core: &mut EngineCore<Ahead>) -> Result<(), EngineError> {
        Ok(())
    }
}

#[test]
fn checkpoints_see_no_step_in_flight() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let model = Ahead::new(FakeModel::new(VOCAB, 256, BS));
    let fed = model.fed.clone();
    let hook = Box::new(InFlightAtCheckpoint(seen.clone()));
    let (_, every) = run_checkpointed(model, hook, true);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 2, "{} checkpoints", seen.len());
    assert!(
        seen.iter().all(|p| !p),
        "a step in flight at a checkpoint: {seen:?}"
    );
    assert!(fed.load(Ordering::Relaxed) > every, "steps went ahead");
}

#[test]
fn prefill_passes_go_ahead_with_the_in_turn_outputs() {
    // 24 prompts of 5 to 44 tokens, 64 prompt tokens a pass: prompts split across passes.
    for sampled in [false, true] {
        let (want, _, _) = run(fake(256), Mode::InTurn, 256, false, sampled);
        let model = Ahead::new(fake(256));
        let ahead = model.passes_ahead.clone();
        let (got, _, _) = run(model, Mode::Ahead, 256, false, sampled);
        assert_eq!(got, want, "sampled rows {sampled}");
        assert!(
            ahead.load(Ordering::Relaxed) > 0,
            "passes went ahead (sampled rows {sampled})"
        );
    }
}

#[test]
fn a_failed_prefill_pass_ends_only_its_requests() {
    let (want, _, _) = run(fake(256), Mode::InTurn, 256, false, false);
    // The wait of pass 1 or 3 fails, or every second launch fails before it enqueues anything.
    for (fail_at, launch_every) in [(Some(1), None), (Some(3), None), (None, Some(2))] {
        let case = format!("wait {fail_at:?} fails, every {launch_every:?} launch fails");
        let mut model = Ahead::new(fake(256));
        model.fail_pass_at = fail_at;
        model.fail_pass_launch_every = launch_every;
        let (got, _, _) = run(model, Mode::Ahead, 256, false, false);
        let mut errors = 0;
        for (g, w) in got.iter().zip(&want) {
            match &g.3 {
                super::output::FinishReason::Error(_) => {
                    errors += 1;
                    assert!(g.0.is_empty(), "a failed prompt streams nothing ({case})");
                }
                _ => assert_eq!(g, w, "{case}"),
            }
        }
        assert!(errors > 0, "the failure ended requests ({case})");
        assert!(errors < got.len(), "the others ran on ({case})");
    }
}
