//! CUDA graphs: capture the ops of a decode step once per batch-size bucket, replay them per step,
//! so the per-kernel launch cost vanishes at small batch sizes.
//!
//! Replay runs the captured kernels with the captured arguments: the caller keeps every buffer
//! the step reads (token ids, positions, slots, context lengths, block tables) at fixed addresses
//! and rewrites their contents before each replay, and captures with `max_ctx_len` set to the
//! largest context the graph will serve (the decode split plan is fixed at capture). Capture must
//! follow one eager run of the same step, so that scratch buffers and library workspaces exist.

use cudarc::driver::{CudaGraph, sys};

use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::BackendError;

/// An instantiated graph of one captured step.
pub struct StepGraph {
    graph: CudaGraph,
    /// Device memory the capture and instantiation took, as the driver's free-memory count saw
    /// it (allocation granularity: 0 when the graph fit in pages already held).
    bytes: usize,
}

impl StepGraph {
    /// Device bytes this graph took when it was captured (see the field).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph are
// serialised (CUDA driver API, "Graph object thread safety"). A StepGraph is owned by one runner
// and only reached through it (it is Send, not Sync), so moving it to the engine thread cannot
// make two threads touch the graph at once; cudarc binds the context before every graph call.
unsafe impl Send for StepGraph {}

impl CudaBackend {
    /// Records everything `step` enqueues on this backend's stream into a graph (nothing runs).
    pub fn capture(
        &self,
        step: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<StepGraph, BackendError> {
        // The driver's memory for the graph comes from outside the allocation pool: give the
        // pool's idle bytes back first (mem_pool.rs).
        self.release_idle_memory()?;
        let free_before = self.free_device_bytes().unwrap_or(0);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err)?;
        let result = step();
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver_err);
        result?;
        let graph =
            graph?.ok_or_else(|| BackendError::Device("graph capture recorded nothing".into()))?;
        let free_after = self.free_device_bytes().unwrap_or(free_before);
        Ok(StepGraph {
            graph,
            bytes: free_before.saturating_sub(free_after),
        })
    }

    /// Free device memory in bytes, as the driver counts it.
    pub fn free_device_bytes(&self) -> Result<usize, BackendError> {
        self.ctx.bind_to_thread().map_err(driver_err)?;
        let (free, _total) = cudarc::driver::result::mem_get_info().map_err(driver_err)?;
        Ok(free)
    }

    /// Enqueues one replay of `graph` on this backend's stream.
    pub fn replay(&self, graph: &StepGraph) -> Result<(), BackendError> {
        graph.graph.launch().map_err(driver_err)
    }
}
