//! The host work an overlapped decode step leaves for later ([`super::overlap`]): its committed
//! tokens (`PendingStep`) and the text and event of each (`text_and_event`), the second half of
//! [`super::advance::append`] for a row whose token the model chose; and the step it launched
//! ahead, still in flight (`AheadStep`, [`super::ahead`]).
//!
//! Design: plain data and free functions over one sequence's text stream and channel, so the
//! engine can run them while the next forward pass borrows the batch's tokens and block tables.

use std::sync::mpsc::Sender;
use std::time::Instant;

use super::codec::TextCodec;
use super::forward::RowPick;
use super::outbox::Outbox;
use super::output::{FinishReason, Output};
use super::sequence::Sequence;
use super::text::TextStream;

/// A token a decode step committed whose text and event are still to come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingRow {
    /// The sequence (running sequences keep their order, so rows are matched by a merge walk).
    pub(crate) id: u64,
    pub(crate) token: u32,
    /// An end-of-sequence token (it adds no text).
    pub(crate) eos: bool,
    /// The sequence reached its max_tokens with this token.
    pub(crate) length: bool,
    /// The sequence filled the context with this token.
    pub(crate) context: bool,
}

impl PendingRow {
    /// The sequence ends with this token whatever its text says (such a row is finished at its
    /// commit, never left pending).
    pub(crate) fn ends(&self) -> bool {
        self.eos || self.length || self.context
    }
}

/// The committed rows of the last overlapped decode step, in running order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingStep {
    /// `[rows committed]`
    pub(crate) rows: Vec<PendingRow>,
    /// When the step's tokens arrived (their events' time).
    pub(crate) now: Instant,
}

/// The decode step launched ahead ([`super::ahead`]) and still in flight: the rows it runs, by sequence id in
/// running order, and what it picks for each.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AheadStep {
    /// `[rows]` the sequence of each row.
    pub(crate) ids: Vec<u64>,
    /// `[rows]` the pick of each row.
    pub(crate) picks: Vec<RowPick>,
}

/// The text and event of one committed token: detokenizes it (unless EOS), queues its event and
/// says why the sequence ends, if it does (counting the token into `generated`): [`super::advance::append`]'s rules in its order (EOS,
/// stop string, length, context), then a receiver that went away.
pub(crate) fn text_and_event(
    text: &mut TextStream,
    tx: &Sender<Output>,
    row: &PendingRow,
    now: Instant,
    codec: &dyn TextCodec,
    outbox: &mut Outbox,
    generated: &mut u64,
) -> Option<FinishReason> {
    let delta = if row.eos {
        Ok((String::new(), false))
    } else {
        text.push(codec, row.token).map(|d| (d.text, d.stopped))
    };
    let (text, stopped) = match delta {
        Ok(d) => d,
        Err(e) => return Some(FinishReason::Error(format!("detokenize: {e}"))),
    };
    let reason = if row.eos {
        Some(FinishReason::Eos)
    } else if stopped {
        Some(FinishReason::Stop)
    } else if row.length {
        Some(FinishReason::Length)
    } else if row.context {
        Some(FinishReason::ContextLength)
    } else {
        None
    };
    let gone = outbox.is_gone(row.id);
    *generated += 1;
    outbox.push(
        tx,
        Output {
            request_id: row.id,
            tokens: vec![row.token],
            text,
            logprobs: Vec::new(),
            time: now,
            finished: None,
        },
    );
    reason.or(gone.then_some(FinishReason::Abort))
}

/// Running sequences (by index) for each pending row, by a merge walk over both in running order.
/// A row whose sequence left the batch would end the walk (the rows after it unmatched): the engine
/// runs the pending work before anything takes a sequence out ([`super::overlap`]), so every row
/// matches; the callers log it if one does not.
pub(crate) fn match_rows<'r>(
    running: &[Sequence],
    rows: &'r [PendingRow],
) -> Vec<(usize, &'r PendingRow)> {
    let mut out = Vec::with_capacity(rows.len());
    let mut next = rows.iter().peekable();
    for (i, s) in running.iter().enumerate() {
        if let Some(row) = next.next_if(|r| r.id == s.id) {
            out.push((i, row));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::super::codec::ByteCodec;
    use super::super::intake::{IntakeLimits, build_sequence};
    use super::super::request::{Prompt, Request};
    use super::*;

    /// A sequence with stop string "b" and its stream's receiver.
    fn seq(id: u64) -> (Sequence, mpsc::Receiver<Output>) {
        let limits = IntakeLimits {
            context_len: 64,
            vocab_size: 300,
            num_blocks: 8,
            block_size: 16,
            max_tokens_cap: 64,
        };
        let mut r = Request::new(Prompt::Tokens(vec![65, 66]), 8);
        r.stop = vec!["b".into()];
        let (tx, rx) = mpsc::channel();
        (build_sequence(id, r, &ByteCodec, &limits, tx).unwrap(), rx)
    }

    fn row(id: u64, token: u32, eos: bool, length: bool) -> PendingRow {
        PendingRow {
            id,
            token,
            eos,
            length,
            context: false,
        }
    }

    /// `append`'s order of reasons: EOS (no text), then a stop string over the length limit; a
    /// plain token streams its text and ends nothing; every token is counted and has its event.
    #[test]
    fn text_and_event_follows_appends_rules() {
        let (mut s, rx) = seq(7);
        let (now, mut outbox, mut generated) = (Instant::now(), Outbox::inline(), 0);
        let mut step = |s: &mut Sequence, r: PendingRow| {
            text_and_event(
                &mut s.text,
                &s.tx,
                &r,
                now,
                &ByteCodec,
                &mut outbox,
                &mut generated,
            )
        };
        assert_eq!(step(&mut s, row(7, u32::from(b'x'), false, false)), None);
        assert_eq!(
            step(&mut s, row(7, 299, true, true)),
            Some(FinishReason::Eos)
        );
        assert_eq!(
            step(&mut s, row(7, u32::from(b'b'), false, true)),
            Some(FinishReason::Stop)
        );
        assert_eq!(
            step(&mut s, row(7, u32::from(b'y'), false, true)),
            Some(FinishReason::Length)
        );
        outbox.hand_off();
        let events: Vec<Output> = rx.try_iter().collect();
        assert_eq!(generated, 4);
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].text, "x");
        assert_eq!(
            (events[1].tokens.clone(), events[1].text.as_str()),
            (vec![299], "")
        );
        assert!(events.iter().all(|e| e.request_id == 7 && e.time == now));
    }

    /// Rows are matched to the running sequences they belong to, in running order; a row whose
    /// sequence left ends the walk.
    #[test]
    fn rows_match_their_sequences_in_running_order() {
        let running: Vec<Sequence> = [3, 5, 9, 11].map(|id| seq(id).0).into();
        let rows = [
            row(5, 1, false, false),
            row(9, 2, false, false),
            row(11, 3, false, false),
        ];
        let matched: Vec<(usize, u64)> = match_rows(&running, &rows)
            .into_iter()
            .map(|(i, r)| (i, r.id))
            .collect();
        assert_eq!(matched, vec![(1, 5), (2, 9), (3, 11)]);
        let gone = [row(4, 1, false, false), row(9, 2, false, false)];
        let matched: Vec<u64> = match_rows(&running, &gone)
            .into_iter()
            .map(|(_, r)| r.id)
            .collect();
        assert_eq!(
            matched,
            Vec::<u64>::new(),
            "a missing sequence stops the walk"
        );
    }
}
