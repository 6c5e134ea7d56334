//! Decode steps launched ahead: step N + 1 is enqueued on the model's device before step N's
//! tokens reach the host, so the GPU never waits for the host between two decode steps
//! (`EngineConfig::decode_ahead`, on top of [`super::overlap`]).
//!
//! Design: SGLang's overlap scheduler with its "future" token ids. The host knows everything a
//! decode step needs but the tokens: a row's next position is its current length, its block
//! table can be grown one token further, and its sampling bits are its RNG's next but one. The
//! model is told to take each row's input token from its own pick of the same row one step
//! earlier ([`ForwardModel::launch_decode`] with `fed`), so the token never travels to the host
//! and back before the step can start. An overlapped decode call then:
//! 1. has step N in flight: launched ahead by the call before, or launched now;
//! 2. launches step N + 1 fed from N when `EngineCore::ahead_picks` allows it: nothing waiting
//!    to be admitted, every prefilled sequence in N, every row's pick a token the model chooses,
//!    and room in the cache for one more token each. Its rows are N's less those that ended since
//!    N was launched and those N's token ends by length or context; the model takes each row's
//!    token from N's pick of the same sequence (a row map, `fed`);
//! 3. runs the text and events of step N - 1 ([`super::overlap`]), waits for N's tokens and
//!    commits them, while N + 1 computes.
//!
//! A row that N's token ends (EOS, or a stop string the text of N finds one call later) has run
//! one discarded step: its token is dropped, and the KV it wrote lies in the sequence's own last
//! block, past its committed length (never in a full block the prefix cache holds), written
//! before any later pass can reuse the block on the model's one stream. Every action but
//! `admit` and `decode`, and the loop's idle and exit paths, first collect the step in flight
//! (`EngineCore::flush_pending`), so they see the sequences as the in-turn path leaves them.
//! Tokens, texts, events and finish reasons are those of the in-turn path (`ahead_tests`).

use std::collections::HashMap;

use super::core::EngineCore;
use super::forward::{ForwardModel, RowPick};
use super::sequence::Sequence;

impl<F: ForwardModel> EngineCore<F> {
    /// The running index of each of `ids` (sequence ids in running order), None for those no
    /// longer running (ended since the step was launched).
    pub(crate) fn rows_of(&self, ids: &[u64]) -> Vec<Option<usize>> {
        let at: HashMap<u64, usize> = self
            .running
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id, i))
            .collect();
        ids.iter().map(|id| at.get(id).copied()).collect()
    }

    /// The decode step to launch now, one token after the step in flight whose rows still
    /// running are `live` (running indices, in order): the rows of `live` it runs (indices into
    /// `live`: all but those the step in flight ends by length or context) and its pick for each;
    /// None when no step may go ahead (module doc, step 2). When one may, the block tables of
    /// its rows are grown to hold its token first.
    pub(crate) fn ahead_picks(&mut self, live: &[usize]) -> Option<(Vec<usize>, Vec<RowPick>)> {
        if !self.decode_ahead
            || live.is_empty()
            || !self.waiting.is_empty()
            || self.running.iter().filter(|s| s.prefilled).count() != live.len()
        {
            return None;
        }
        let context_len = self.cfg.context_len;
        let ends = move |s: &Sequence| {
            s.output().len() + 1 >= s.max_tokens || s.tokens.len() + 1 >= context_len
        };
        let mut included = Vec::with_capacity(live.len()); // [rows ahead]
        let mut picks = Vec::with_capacity(live.len()); // [rows ahead]
        for (j, &i) in live.iter().enumerate() {
            if ends(&self.running[i]) {
                continue;
            }
            let pick = self.row_pick_after(i, 1);
            if !pick.is_token() {
                return None;
            }
            included.push(j);
            picks.push(pick);
        }
        if picks.is_empty() || !self.model.launches_decode(&picks) {
            return None;
        }
        self.grow_prefilled(|s| s.tokens.len() + usize::from(!ends(s)))
            .then_some((included, picks))
    }
}
