//! The one collective tensor parallelism needs, an all-reduce (sum) of a buffer over the ranks of
//! a group, and its in-process stand-in.
//!
//! [`LocalGroup`] sums on the host: each rank downloads its `[n, hidden]` partial sum into its
//! slot, waits for the others, and every rank adds the slots in rank order (0, 1, ...), so all
//! ranks get bit-identical results whatever the thread timing. Its barrier can be aborted: a rank
//! whose step fails calls [`LocalGroup::abort`] and every rank waiting in it (now or later) gets
//! an error instead of waiting forever for a rank that will never arrive.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::backend::{Backend, BackendError};

/// Sums the first `len` elements of `buf` (f32) over every rank of a group, in place, on every rank.
pub trait AllReduce<B: Backend>: Send + Sync {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world(&self) -> usize;
    /// Replaces this rank's `buf` by the sum of every rank's `buf`. Every rank must call it the
    /// same number of times with the same `len`.
    fn all_reduce_sum(
        &self,
        backend: &B,
        buf: &mut B::Buffer,
        len: usize,
    ) -> Result<(), BackendError>;
}

/// State shared by the ranks of a [`LocalGroup`].
struct Shared {
    /// `[world][len]`: each rank's contribution to the current all-reduce.
    slots: Vec<Vec<f32>>,
    /// Ranks that reached the current barrier.
    arrived: usize,
    /// Barriers passed so far; a waiter leaves when it changes.
    generation: u64,
    /// Set by [`LocalGroup::abort`]: every wait fails from then on.
    aborted: bool,
}

/// An in-process group of `world` ranks (one thread each) whose all-reduce sums on the host.
pub struct LocalGroup {
    world: usize,
    shared: Mutex<Shared>,
    turn: Condvar,
}

/// One rank's handle on a [`LocalGroup`].
pub struct LocalRank {
    group: Arc<LocalGroup>,
    rank: usize,
}

const ABORTED: &str = "all-reduce: another rank of the group failed";

fn aborted() -> BackendError {
    BackendError::Device(ABORTED.into())
}

/// Whether `e` is the error a rank gets when another rank aborted the group (not a cause).
pub(super) fn is_abort(e: &crate::model::ModelError) -> bool {
    matches!(e, crate::model::ModelError::Backend(BackendError::Device(m)) if m == ABORTED)
}

impl LocalGroup {
    /// A group of `world` ranks.
    pub fn new(world: usize) -> Self {
        LocalGroup {
            world,
            shared: Mutex::new(Shared {
                slots: vec![Vec::new(); world],
                arrived: 0,
                generation: 0,
                aborted: false,
            }),
            turn: Condvar::new(),
        }
    }

    /// The handle of rank `rank` (`< world`) on `group`.
    pub fn rank(group: &Arc<Self>, rank: usize) -> Option<LocalRank> {
        (rank < group.world).then(|| LocalRank {
            group: Arc::clone(group),
            rank,
        })
    }

    /// Fails every current and future wait of the group (a rank's step failed).
    pub fn abort(&self) {
        if let Ok(mut s) = self.shared.lock() {
            s.aborted = true;
        }
        self.turn.notify_all();
    }

    /// Clears an abort once no rank is inside the group (between steps), so the next step runs.
    pub fn reset(&self) {
        if let Ok(mut s) = self.shared.lock() {
            s.aborted = false;
            s.arrived = 0;
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Shared>, BackendError> {
        self.shared.lock().map_err(|_| aborted())
    }

    /// Waits until every rank has arrived (or the group is aborted), holding the lock on return.
    fn barrier<'a>(
        &'a self,
        mut s: MutexGuard<'a, Shared>,
    ) -> Result<MutexGuard<'a, Shared>, BackendError> {
        if s.aborted {
            return Err(aborted());
        }
        s.arrived += 1;
        if s.arrived == self.world {
            s.arrived = 0;
            s.generation += 1;
            self.turn.notify_all();
            return Ok(s);
        }
        let generation = s.generation;
        while s.generation == generation && !s.aborted {
            s = self.turn.wait(s).map_err(|_| aborted())?;
        }
        if s.aborted {
            return Err(aborted());
        }
        Ok(s)
    }
}

impl<B: Backend> AllReduce<B> for LocalRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.group.world
    }

    fn all_reduce_sum(
        &self,
        backend: &B,
        buf: &mut B::Buffer,
        len: usize,
    ) -> Result<(), BackendError> {
        let mut mine = vec![0f32; len]; // [len]
        backend.download_f32(buf, &mut mine)?;
        let g = &*self.group;
        let mut s = g.lock()?;
        s.slots[self.rank] = mine;
        // First barrier: every slot is filled.
        let s = g.barrier(s)?;
        let mut sum = vec![0f32; len]; // [len]
        for slot in &s.slots {
            if slot.len() != len {
                g.abort();
                return Err(BackendError::Shape {
                    op: "all_reduce_sum",
                    detail: format!("ranks disagree on the length ({} vs {len})", slot.len()),
                });
            }
            for (acc, x) in sum.iter_mut().zip(slot) {
                *acc += x;
            }
        }
        // Second barrier: nobody refills a slot before every rank has read them all.
        drop(g.barrier(s)?);
        let bytes: Vec<u8> = sum.iter().flat_map(|x| x.to_le_bytes()).collect(); // [len * 4]
        backend.write_bytes(buf, 0, &bytes)
    }
}
