//! Small host-to-device uploads that never wait for the stream: an eager pass's inputs (token
//! ids, positions, KV slots, query starts, context lengths, block tables) go up while the pass
//! before it still runs, so a pass can be enqueued ahead (`engine::prefill_ahead`).
//!
//! Design: a ring of page-locked staging slots, each with the event recorded after the copy that
//! last read it. An upload takes the next slot, waits for that slot's event (the copy `SLOTS`
//! uploads back: a pass makes seven, so that copy belongs to a pass several passes old), writes
//! the bytes into the slot, enqueues the copy from it and records the event. A copy straight from
//! pageable memory may make the driver synchronise with the stream to stage it (the CUDA "API
//! synchronization behavior" notes), i.e. wait for every pass already enqueued. Uploads larger
//! than [`STAGED_UPLOAD_MAX_BYTES`] (weights, at load) and uploads during a graph capture keep
//! the pageable copy. The same rule as [`super::step_io`]'s rows: a slot is written only after
//! its event completed, and replaced or freed only then.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice, result, sys};

use super::driver_error::driver_err;
use crate::backend::BackendError;

/// Largest upload staged through the ring (bytes); larger ones copy from pageable memory.
pub(super) const STAGED_UPLOAD_MAX_BYTES: usize = 1 << 20;

/// Staging slots in the ring.
const SLOTS: usize = 32;

/// Smallest slot (bytes): a pass's small inputs share one size class.
const MIN_SLOT_BYTES: usize = 4096;

/// One page-locked staging slot and the event of the last copy that read it.
struct Slot {
    /// `[capacity]` bytes, write-combined (the host only writes them).
    host: PinnedHostSlice<u8>,
    /// Recorded after the last copy enqueued from `host`.
    done: CudaEvent,
}

/// The staging slots of a backend's small uploads, used in turn.
#[derive(Default)]
pub(super) struct UploadRing {
    /// Made on first use, in order; at most `SLOTS`.
    slots: Vec<Slot>,
    /// The slot the next upload takes.
    next: usize,
}

impl Drop for UploadRing {
    fn drop(&mut self) {
        // A slot's memory may still be read by a copy in flight: wait for each before freeing.
        for slot in &self.slots {
            let _ = slot.done.synchronize();
        }
    }
}

impl UploadRing {
    /// Enqueues the copy of `bytes` to device address `dst` on `stream` through the next staging
    /// slot and returns without waiting for the stream (module doc). `dst` must hold
    /// `bytes.len()` bytes and stay allocated until the copy ran (stream order: any later free
    /// does).
    pub(super) fn stage(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        dst: u64,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let at = self.next;
        if self.slots.len() <= at {
            self.slots.push(Slot::new(ctx, bytes.len())?);
        }
        // Moved on only once slot `at` exists: a slot that failed to be made is tried again.
        self.next = (at + 1) % SLOTS;
        let slot = &mut self.slots[at];
        slot.done.synchronize().map_err(driver_err)?;
        if slot.host.len() < bytes.len() {
            *slot = Slot::new(ctx, bytes.len())?;
        }
        let host = slot.host.as_mut_slice().map_err(driver_err)?; // [capacity] bytes
        host[..bytes.len()].copy_from_slice(bytes);
        let src: &[u8] = &host[..bytes.len()];
        // SAFETY: `dst` holds `bytes.len()` bytes (the caller's contract); `src` is page-locked
        // memory owned by the ring, written again only after `done` (recorded below, after this
        // copy) completes, and freed only after it too (`UploadRing`'s drop, the growth above).
        unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }.map_err(driver_err)?;
        slot.done.record(stream).map_err(driver_err)
    }
}

impl Slot {
    /// A slot of at least `bytes` bytes (a power of two, at least `MIN_SLOT_BYTES`).
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, BackendError> {
        let len = bytes.next_power_of_two().max(MIN_SLOT_BYTES);
        // SAFETY: the slot's bytes are written by the host before any copy reads them (`stage`
        // copies only the bytes it just wrote).
        let host =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(len, sys::CU_MEMHOSTALLOC_WRITECOMBINED) }
                .map_err(driver_err)?;
        let done = ctx.new_event(None).map_err(driver_err)?;
        Ok(Self { host, done })
    }
}
