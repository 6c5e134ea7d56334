//! Delivery of output events to the request streams, off the engine thread.
//!
//! Design: vLLM V1's split between the engine core's busy loop and its output processing. A step
//! queues its events ([`Outbox::push`]) and hands them over as one batch at its end
//! ([`Outbox::hand_off`]). Sending into a request's channel wakes the client thread blocked on it:
//! a syscall and often a context switch, about 13 µs per event on a 2-core host, so 3.3 ms of a
//! decode step at batch 256 during which an accelerator would idle. With a courier thread
//! ([`Outbox::with_courier`]) those sends overlap the next forward pass and the engine thread pays
//! one channel send per step. At most one batch is in flight: a hand-off first waits until the
//! previous batch is delivered, so a request's events stay in order and a slow client slows the
//! engine instead of growing a queue. [`Outbox::settle`] waits for everything handed off; the
//! engine calls it when it has nothing to do, after a power event and before a restore (not before
//! a checkpoint: the journal, not delivery, is what a resume relies on). Without a courier
//! (a core driven directly, as tests do) a hand-off sends on the calling thread.
//!
//! A client that dropped its receiver is found when an event for it cannot be sent; the request's
//! id is then reported ([`Outbox::is_gone`]) and the engine ends the request at its next token.

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::output::Output;

/// Events of one step, each with the stream it goes to. `[events of the step]`
type Batch = Vec<(Sender<Output>, Output)>;

/// A delivered batch (emptied, for reuse) and the requests whose receivers were gone.
type Receipt = (Batch, Vec<u64>);

/// The thread that sends batches into the request streams.
struct Courier {
    /// Batches to deliver; None once closed.
    batches: Option<Sender<Batch>>,
    /// Delivered batches come back here.
    receipts: Receiver<Receipt>,
    thread: Option<JoinHandle<()>>,
}

/// Output events of the current step, and the delivery of earlier ones.
pub struct Outbox {
    /// `[events queued since the last hand-off]`
    pending: Batch,
    courier: Option<Courier>,
    /// Batches handed to the courier and not yet returned (0 or 1).
    in_flight: usize,
    /// Requests whose receiver was dropped, not yet ended by the engine.
    gone: HashSet<u64>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::inline()
    }
}

impl Outbox {
    /// An outbox that delivers on the thread that hands off.
    pub fn inline() -> Self {
        Self {
            pending: Vec::new(),
            courier: None,
            in_flight: 0,
            gone: HashSet::new(),
        }
    }

    /// An outbox that delivers on its own thread (named `sov-output`); falls back to delivering
    /// inline when the thread cannot be started.
    pub fn with_courier() -> Self {
        let (batch_tx, batch_rx) = mpsc::channel::<Batch>();
        let (receipt_tx, receipt_rx) = mpsc::channel::<Receipt>();
        let thread = std::thread::Builder::new()
            .name("sov-output".into())
            .spawn(move || {
                for mut batch in batch_rx {
                    let gone = deliver(&mut batch);
                    if receipt_tx.send((batch, gone)).is_err() {
                        break;
                    }
                }
            });
        let mut outbox = Self::inline();
        match thread {
            Ok(thread) => {
                outbox.courier = Some(Courier {
                    batches: Some(batch_tx),
                    receipts: receipt_rx,
                    thread: Some(thread),
                });
            }
            Err(e) => tracing::warn!("output thread not started ({e}); delivering inline"),
        }
        outbox
    }

    /// Queues `event` for `stream`; it is sent at the next hand-off.
    pub fn push(&mut self, stream: &Sender<Output>, event: Output) {
        self.pending.push((stream.clone(), event));
    }

    /// Whether request `id`'s receiver was found dropped.
    pub fn is_gone(&self, id: u64) -> bool {
        !self.gone.is_empty() && self.gone.contains(&id)
    }

    /// Stops tracking request `id` (it left the engine).
    pub fn forget(&mut self, id: u64) {
        if !self.gone.is_empty() {
            self.gone.remove(&id);
        }
    }

    /// Waits until every batch handed off so far is delivered, and records the dropped receivers
    /// found.
    pub fn settle(&mut self) {
        while self.in_flight > 0 {
            let receipt = self.courier.as_ref().map(|c| c.receipts.recv());
            self.in_flight -= 1;
            match receipt {
                Some(Ok((batch, gone))) => {
                    self.gone.extend(gone);
                    if self.pending.is_empty() && self.pending.capacity() < batch.capacity() {
                        self.pending = batch;
                    }
                }
                // The courier is gone (it panicked): deliver inline from now on.
                Some(Err(_)) | None => self.courier = None,
            }
        }
    }

    /// Sends the queued events (after the previous batch is delivered): to the courier when there
    /// is one, else right here.
    pub fn hand_off(&mut self) {
        self.settle();
        if self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let batch = match self.courier.as_ref().and_then(|c| c.batches.as_ref()) {
            Some(tx) => match tx.send(batch) {
                Ok(()) => {
                    self.in_flight += 1;
                    return;
                }
                Err(mpsc::SendError(batch)) => {
                    self.courier = None;
                    batch
                }
            },
            None => batch,
        };
        let mut batch = batch;
        let gone = deliver(&mut batch);
        self.gone.extend(gone);
        self.pending = batch;
    }
}

impl Drop for Outbox {
    /// Delivers what is queued, then stops the courier.
    fn drop(&mut self) {
        self.hand_off();
        self.settle();
        if let Some(mut c) = self.courier.take() {
            c.batches.take();
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Sends every event of `batch` (leaving it empty); returns the ids of requests whose receiver is
/// gone, found by a failed send of an event that was not their last.
fn deliver(batch: &mut Batch) -> Vec<u64> {
    let mut gone = Vec::new();
    for (stream, event) in batch.drain(..) {
        let id = event.request_id;
        let last = event.finished.is_some();
        if stream.send(event).is_err() && !last {
            gone.push(id);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn event(id: u64, token: u32, last: bool) -> Output {
        Output {
            request_id: id,
            tokens: vec![token],
            text: String::new(),
            logprobs: Vec::new(),
            time: Instant::now(),
            finished: last.then(|| super::super::output::Finished {
                reason: super::super::output::FinishReason::Length,
                prompt_tokens: 1,
                output_tokens: Vec::new(),
                text: String::new(),
                time_to_first_token: None,
                inter_token_latencies: Vec::new(),
                preemptions: 0,
            }),
        }
    }

    fn check_order_and_gone(mut outbox: Outbox) {
        let (tx_a, rx_a) = mpsc::channel();
        let (tx_b, rx_b) = mpsc::channel();
        drop(rx_b);
        for step in 0..50u32 {
            outbox.push(&tx_a, event(1, step, false));
            outbox.push(&tx_b, event(2, step, false));
            outbox.hand_off();
        }
        outbox.push(&tx_a, event(1, 50, true));
        outbox.hand_off();
        outbox.settle();
        // Everything handed off is delivered after a settle, in order.
        let got: Vec<u32> = rx_a.try_iter().map(|o| o.tokens[0]).collect();
        assert_eq!(got, (0..=50).collect::<Vec<_>>());
        assert!(outbox.is_gone(2) && !outbox.is_gone(1));
        outbox.forget(2);
        assert!(!outbox.is_gone(2));
        // A final event to a dropped receiver reports nothing (the request has left).
        outbox.push(&tx_b, event(2, 0, true));
        outbox.hand_off();
        outbox.settle();
        assert!(!outbox.is_gone(2));
    }

    #[test]
    fn inline_delivers_in_order_and_reports_dropped_receivers() {
        check_order_and_gone(Outbox::inline());
    }

    #[test]
    fn courier_delivers_in_order_and_reports_dropped_receivers() {
        check_order_and_gone(Outbox::with_courier());
    }

    #[test]
    fn dropping_the_outbox_delivers_what_is_queued() {
        let (tx, rx) = mpsc::channel();
        let mut outbox = Outbox::with_courier();
        outbox.push(&tx, event(7, 1, false));
        outbox.hand_off();
        outbox.push(&tx, event(7, 2, true));
        drop(outbox);
        drop(tx);
        let got: Vec<u32> = rx.iter().map(|o| o.tokens[0]).collect();
        assert_eq!(got, vec![1, 2]);
    }
}
