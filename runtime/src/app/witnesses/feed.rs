//! The heads the store signs, handed to the witness threads: the newest head note (older unsent
//! ones are dropped: newest wins) and a copy of the signed tree's leaves, from which each thread
//! builds consistency proofs and receipts are re-issued, never touching the store's lock.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::checkpoint::HeadSink;
use crate::checkpoint::attest::{Leaf, ResponseReceipt};
use crate::checkpoint::merkle::{Hash, Tree, leaf_hash};

/// The newest signed head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The signed note.
    pub note: Arc<str>,
    /// Its tree size.
    pub size: u64,
}

#[derive(Default)]
struct State {
    tree: Tree,
    newest: Option<Head>,
    closed: bool,
}

/// Shared between the store's sink and the witness threads.
#[derive(Default)]
pub struct Feed {
    state: Mutex<State>,
    changed: Condvar,
}

/// The store's side: appends the leaves and replaces the newest head.
pub struct FeedSink(pub Arc<Feed>);

impl HeadSink for FeedSink {
    fn signed(&mut self, note: &str, size: u64, new_leaves: &[Hash]) {
        let mut s = self.0.lock();
        for l in new_leaves {
            s.tree.push(*l);
        }
        if s.tree.size() == size {
            s.newest = Some(Head {
                note: note.into(),
                size,
            });
        }
        drop(s);
        self.0.changed.notify_all();
    }
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned feed only means a witness thread panicked; the data is plain.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait up to `timeout` for a head larger than `size`; None when there is none (or closed).
    pub fn wait_newer(&self, size: u64, timeout: Duration) -> Option<Head> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(h) = s.newest.as_ref().filter(|h| h.size > size) {
                return Some(h.clone());
            }
            let now = Instant::now();
            if s.closed || now >= deadline {
                return None;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The newest head, if any.
    pub fn newest(&self) -> Option<Head> {
        self.lock().newest.clone()
    }

    /// Size of the newest head (0: none).
    pub fn newest_size(&self) -> u64 {
        self.lock().newest.as_ref().map_or(0, |h| h.size)
    }

    /// Whether the client is shutting down.
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// RFC 6962 consistency proof from `old` to `new` leaves (None when either is beyond the tree).
    pub fn consistency_proof(&self, old: u64, new: u64) -> Option<Vec<Hash>> {
        self.lock().tree.consistency_proof(old, new).ok()
    }

    /// `receipt`'s leaf proven in the head of `size` (note `note`), when the leaf is ours.
    pub fn reissue(
        &self,
        receipt: &ResponseReceipt,
        size: u64,
        note: &str,
    ) -> Option<ResponseReceipt> {
        let (leaf, request) = receipt.leaves().ok()?;
        let s = self.lock();
        for (i, b) in [
            (receipt.leaf_index, &leaf),
            (receipt.request_index, &request),
        ] {
            if s.tree.leaves().get(i as usize) != Some(&leaf_hash(b)) {
                return None;
            }
        }
        ResponseReceipt::build(
            &s.tree,
            Leaf {
                index: receipt.leaf_index,
                body: &leaf,
            },
            Leaf {
                index: receipt.request_index,
                body: &request,
            },
            note,
            size,
        )
        .ok()
    }

    /// Stop: waiting threads return.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}
