//! Decode steps whose host work overlaps the next forward pass (`EngineConfig::overlap_host`).
//!
//! Design: SGLang's overlap scheduler, at the engine's granularity. A decode step whose rows the
//! model picks on its device (greedy rows and plain drawn ones, [`RowPick::is_token`]) splits each
//! row's host work in two:
//! - the **commit**, right after the pass: the token appended (with its RNG draw, time and
//!   position) and the ends that need no text decided (EOS, length, context). A row such an end
//!   stops makes its text and event at once and leaves in this step, as in turn, so it holds no
//!   blocks into the next;
//! - for every other row, the **text and event** (detokenizing, stop strings, the event queued
//!   and handed to the courier), left pending (`PendingStep`) and run by the next decode step
//!   while its pass computes ([`ForwardModel::forward_pick_overlapped`]: on a GPU between the
//!   launch and the wait for the picked ids).
//!
//! A stop string is only found by the text, so a sequence it ends has already run one more row in
//! the step that found it; that row's token is dropped at the commit and the sequence retired then
//! (the row wrote KV into the sequence's own last block, freed with it): the one place where a
//! sequence leaves a step later than in turn. Every other action ([`super::bind`]) and the engine
//! loop's idle and exit paths first run the pending work (`EngineCore::flush_pending`), so
//! checkpoints, restores, preemption, aborts and the scheduler's other steps see every sequence
//! as [`super::step`]'s in-turn decode leaves it. Tokens, texts, events and finish reasons are
//! those of the in-turn path (`overlap_tests`). Where the model can, the step after this one is
//! launched before this one's tokens come back ([`super::ahead`]); the step in flight is then
//! collected by the next decode step or by `flush_pending`.
use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::codec::TextCodec;
use super::core::EngineCore;
use super::error::EngineError;
use super::forward::{ForwardModel, HostWork, RowPick};
use super::output::{FinishReason, Output};
use super::pending::{AheadStep, PendingRow, PendingStep, match_rows, text_and_event};
use super::sequence::Sequence;
use super::text::TextStream;
use crate::model::batch::SeqChunk;

impl<F: ForwardModel> EngineCore<F> {
    /// Runs the pending text and events of the last overlapped decode step now, and retires the
    /// sequences they end. A no-op when nothing is pending.
    pub(crate) fn flush_pending(&mut self) {
        self.collect_ahead();
        let Some(pending) = self.pending.take() else {
            return;
        };
        let matched = match_rows(&self.running, &pending.rows);
        if matched.len() != pending.rows.len() {
            tracing::error!(
                "{} of {} pending rows lost their sequence",
                pending.rows.len() - matched.len(),
                pending.rows.len()
            );
        }
        let rows: Vec<(usize, PendingRow)> =
            matched.into_iter().map(|(i, r)| (i, r.clone())).collect();
        let ended = self.texts_now(&rows, pending.now);
        self.retire(ended);
    }

    /// The text and event of each of `rows` (running index, committed token) made now, on the
    /// engine thread; returns the rows whose sequence that ends, with the reason.
    fn texts_now(
        &mut self,
        rows: &[(usize, PendingRow)],
        now: Instant,
    ) -> Vec<(usize, FinishReason)> {
        let codec = self.codec.clone();
        let mut ended = Vec::new();
        for (i, row) in rows {
            let s = &mut self.running[*i];
            if let Some(reason) = text_and_event(
                &mut s.text,
                &s.tx,
                row,
                now,
                codec.as_ref(),
                &mut self.outbox,
                &mut self.totals.generation_tokens,
            ) {
                ended.push((*i, reason));
            }
        }
        ended
    }

    /// Runs the pending work (if any; the step in flight collected first) and says whether it
    /// made the cache hold the next decode step's blocks: a sequence a late stop string ended held
    /// blocks the in-turn path had freed.
    pub(crate) fn flush_freed_enough(&mut self) -> bool {
        if self.pending.is_none() && self.ahead.is_none() {
            return false;
        }
        self.flush_pending();
        !self.kv_exhausted()
    }

    /// One decode step with its host work overlapped (see the module doc); falls back to the
    /// in-turn step (after the pending work) when a row is sampled on the host. The step is the
    /// one launched ahead by the call before when one is in flight ([`super::ahead`]), and it
    /// launches its own successor ahead where it may.
    pub(crate) fn decode_overlapped(&mut self) -> Result<(), EngineError> {
        self.overlapped_step(true)
    }

    /// Waits for the decode step launched ahead, commits its tokens and launches nothing more:
    /// the step in flight collected before another action (part of [`Self::flush_pending`]).
    fn collect_ahead(&mut self) {
        if self.ahead.is_some()
            && let Err(e) = self.overlapped_step(false)
        {
            tracing::error!("collecting the decode step in flight failed: {e}");
        }
    }

    /// [`Self::decode_overlapped`]; `go_on` allows launching the next step ahead.
    fn overlapped_step(&mut self, go_on: bool) -> Result<(), EngineError> {
        let t_start = Instant::now();
        let in_flight = self.ahead.take();
        let launched_before = in_flight.is_some();
        // `rows`: the step's rows, by running index (None: the sequence ended since the step
        // was launched ahead; its token is dropped).
        let (rows, picks): (Vec<Option<usize>>, Vec<RowPick>) = match in_flight {
            Some(step) => (self.rows_of(&step.ids), step.picks),
            None => {
                if self.kv_exhausted() {
                    // Preemption moves sequences out of the batch: their pending work goes first.
                    self.flush_pending();
                }
                let idx = self.preempt_until_growable("preempt(decode fallback)");
                if idx.is_empty() {
                    self.flush_pending();
                    return Ok(());
                }
                let picks: Vec<RowPick> = idx.iter().map(|&i| self.row_pick(i)).collect();
                if picks.iter().any(|p| !p.is_token()) {
                    self.flush_pending();
                    return self.decode_in_turn();
                }
                if !self.grow_prefilled(|s| s.tokens.len()) {
                    return Err(EngineError::KvExhausted);
                }
                (idx.into_iter().map(Some).collect(), picks)
            }
        };
        // Running indices of the rows still running, in order.
        let live: Vec<usize> = rows.iter().flatten().copied().collect();
        // The step going ahead: the rows of `live` it runs (indices into `live`), their picks,
        // and for each the row of this step whose token it takes.
        let next = go_on.then(|| self.ahead_picks(&live)).flatten();
        let (ahead_rows, fed): (Vec<usize>, Vec<u32>) = match &next {
            Some((included, _)) => {
                let launch_row: Vec<u32> = (0..rows.len() as u32)
                    .filter(|&k| rows[k as usize].is_some())
                    .collect(); // [live rows]
                included.iter().map(|&j| (live[j], launch_row[j])).unzip()
            }
            None => (Vec::new(), Vec::new()),
        };
        let pending = self.pending.take();
        let t_batch = Instant::now();
        self.decode_steps += 1;

        let (pending_rows, pending_now) =
            pending.map_or((Vec::new(), t_batch), |p| (p.rows, p.now));
        let mut ended: Vec<(u64, FinishReason)> = Vec::new();
        let mut overlapped = Duration::ZERO;
        let (result, t_pass, launched) = {
            let EngineCore {
                model,
                running,
                outbox,
                totals,
                codec,
                forward_time,
                ..
            } = self;
            let codec: &dyn TextCodec = codec.as_ref();
            // One walk over the batch lends each row's tokens and block table to its chunk (this
            // step's unless it is in flight, the next step's when it goes ahead) and each pending
            // row's text stream and channel to the host work.
            let mut chunks: Vec<SeqChunk<'_>> = Vec::with_capacity(live.len()); // [rows]
            let mut ahead: Vec<SeqChunk<'_>> = Vec::new(); // [rows] when launched ahead
            let mut texts: Vec<(&mut TextStream, &Sender<Output>, &PendingRow)> =
                Vec::with_capacity(pending_rows.len()); // [pending rows]
            let mut next_row = live.iter().copied().peekable();
            let mut next_ahead = ahead_rows.iter().copied().peekable();
            let mut next_pending = pending_rows.iter().peekable();
            for (i, s) in running.iter_mut().enumerate() {
                let Sequence {
                    id,
                    tokens,
                    computed,
                    block_table,
                    text,
                    tx,
                    ..
                } = s;
                if next_row.next_if_eq(&i).is_some() {
                    let at = *computed;
                    let tokens: &[u32] = tokens;
                    let block_table: &[u32] = block_table;
                    if !launched_before {
                        chunks.push(SeqChunk {
                            tokens: &tokens[at..at + 1],
                            start_pos: at,
                            block_table,
                        });
                    }
                    if next_ahead.next_if_eq(&i).is_some() {
                        // Its token is a placeholder: the model feeds this row's pick of the
                        // step before.
                        ahead.push(SeqChunk {
                            tokens: &tokens[tokens.len() - 1..],
                            start_pos: tokens.len(),
                            block_table,
                        });
                    }
                }
                if let Some(row) = next_pending.next_if(|r| r.id == *id) {
                    texts.push((text, tx, row));
                }
            }
            if texts.len() != pending_rows.len() {
                tracing::error!(
                    "{} of {} pending rows lost their sequence",
                    pending_rows.len() - texts.len(),
                    pending_rows.len()
                );
            }
            let mut work = || {
                let t0 = Instant::now();
                for (text, tx, row) in texts.iter_mut() {
                    if let Some(reason) = text_and_event(
                        text,
                        tx,
                        row,
                        pending_now,
                        codec,
                        outbox,
                        &mut totals.generation_tokens,
                    ) {
                        ended.push((row.id, reason));
                    }
                }
                outbox.hand_off();
                overlapped = t0.elapsed();
            };
            let mut host = HostWork::new(&mut work);
            let t_pass = Instant::now();
            let launch_next = |model: &mut F| match &next {
                Some((_, next_picks)) => {
                    match model.launch_decode(&ahead, next_picks, Some(&fed)) {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!("launching the next decode step ahead failed: {e}");
                            false
                        }
                    }
                }
                None => false,
            };
            let (result, launched) = if launched_before {
                let launched = launch_next(model);
                host.run();
                (model.wait_decode(), launched)
            } else if model.launches_decode(&picks) {
                match model.launch_decode(&chunks, &picks, None) {
                    Ok(()) => {
                        let launched = launch_next(model);
                        host.run();
                        (model.wait_decode(), launched)
                    }
                    Err(e) => (Err(e), false),
                }
            } else {
                let result = model.forward_pick_overlapped(&chunks, &picks, &mut host);
                (result, false)
            };
            // A model that did not run it (it must): after the pass, never lost.
            host.run();
            if launched && result.is_err() {
                // The step ahead follows a failed one: drained, its rows end with the error.
                if let Err(e) = model.wait_decode() {
                    tracing::warn!("the decode step launched ahead failed too: {e}");
                }
            }
            *forward_time += t_pass.elapsed().saturating_sub(overlapped);
            let ok = result.is_ok();
            (result, t_pass, launched && ok)
        };
        if launched && let Some((_, next_picks)) = next {
            self.decode_host.ahead += 1;
            let ids = ahead_rows.iter().map(|&i| self.running[i].id).collect();
            self.ahead = Some(AheadStep {
                ids,
                picks: next_picks,
            });
        }
        // Building the batch (its chunks and the pending rows' streams) is scheduling.
        self.decode_host.schedule += t_pass - t_start;
        self.decode_host.overlapped += overlapped;
        let t_tokens = Instant::now();
        self.decode_host.steps += 1;
        let ended: HashMap<u64, FinishReason> = ended.into_iter().collect();

        let picked = match self.check_picked(result, &picks) {
            Ok(picked) => picked,
            Err(e) => {
                tracing::error!("forward pass failed for {} sequences: {e}", live.len());
                let error = FinishReason::Error(format!("model forward failed: {e}"));
                let finished = (0..self.running.len())
                    .filter_map(|i| match ended.get(&self.running[i].id) {
                        Some(reason) => Some((i, reason.clone())),
                        None => live.binary_search(&i).is_ok().then(|| (i, error.clone())),
                    })
                    .collect();
                self.retire(finished);
                return Ok(());
            }
        };
        let now = Instant::now();
        let mut committed = Vec::with_capacity(live.len()); // [rows committed, continuing]
        // Rows this token ends (EOS, length, context), by running index: their text and event are
        // made now and they leave in this step, as in turn, so they hold no blocks into the next.
        let mut ending: Vec<(usize, PendingRow)> = Vec::new();
        for (row, token) in rows.iter().zip(&picked.tokens) {
            // A row of a sequence that ended after the step was launched ahead: dropped.
            let Some(i) = *row else {
                continue;
            };
            let s = &mut self.running[i];
            // A row of a sequence whose previous token ended it (a stop string): dropped.
            let (false, Some(token)) = (ended.contains_key(&s.id), *token) else {
                continue;
            };
            // One draw per token, greedy too (see `advance`); a drawn row used these bits.
            s.rng.next_uniform();
            s.computed += 1;
            s.tokens.push(token);
            s.note_token_time(now);
            let row = PendingRow {
                id: s.id,
                token,
                eos: !s.ignore_eos && self.cfg.eos_ids.contains(&token),
                length: s.output().len() >= s.max_tokens,
                context: s.tokens.len() >= self.cfg.context_len,
            };
            if row.ends() {
                ending.push((i, row));
            } else {
                committed.push(row);
            }
        }
        self.offer_full_blocks();
        if !committed.is_empty() {
            self.pending = Some(PendingStep {
                rows: committed,
                now,
            });
        }
        let t_retire = Instant::now();
        self.decode_host.tokens += t_retire - t_tokens;
        let mut finished: Vec<(usize, FinishReason)> = (0..self.running.len())
            .filter_map(|i| ended.get(&self.running[i].id).map(|r| (i, r.clone())))
            .collect();
        // Rows that end always get a reason here.
        finished.extend(self.texts_now(&ending, now));
        if !finished.is_empty() {
            self.retire(finished);
        }
        self.decode_host.retire += t_retire.elapsed();
        Ok(())
    }
}
