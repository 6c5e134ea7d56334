//! The device's stream-ordered memory pool keeps what a step frees, so the next step's buffers
//! come back without the driver mapping memory again.
//!
//! Design: cudarc allocates every buffer with `cuMemAllocAsync` from the device's current memory
//! pool, whose release threshold is 0 by default: at each synchronisation the pool hands every
//! freed byte back to the driver, and the next allocation of that size maps it again. A prefill
//! pass allocates its activations (about 480 MB at 2048 tokens of Llama-3-8B) and frees them when
//! it ends, so each pass paid the mapping (the GPU idled about 1.1 ms more before the pass's
//! first kernel on an H100, `kernels/docs/fp8.md`, FP8). The backend raises the threshold to "keep
//! everything", as PyTorch's caching allocator does. It hands the idle bytes back where memory
//! must be free outside the pool: before a graph capture (the driver's own memory for the graph)
//! and before retrying an allocation that ran out. The free-memory counts (the backend's and the
//! KV staging's, `staging.rs`) add them. Nothing here changes which buffers exist or their
//! contents.

use cudarc::driver::{CudaContext, result, sys};

use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::BackendError;

/// The pool `cuMemAllocAsync` takes `ctx`'s buffers from, or `None` where the device has no
/// stream-ordered allocator (cudarc then allocates synchronously).
fn current_pool(ctx: &CudaContext) -> Result<Option<sys::CUmemoryPool>, BackendError> {
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    ctx.bind_to_thread().map_err(driver_err)?;
    // SAFETY: cu_device is the device the context was created on.
    let pool = unsafe { result::device::get_mem_pool(ctx.cu_device()) };
    pool.map(Some).map_err(driver_err)
}

/// Bytes `ctx`'s pool holds that no buffer uses (memory freed and kept for reuse): free to the
/// next allocation though the driver counts them as used.
pub(super) fn idle_pool_bytes_of(ctx: &CudaContext) -> Result<usize, BackendError> {
    let Some(pool) = current_pool(ctx)? else {
        return Ok(0);
    };
    let read = |attr: sys::CUmemPool_attribute| -> Result<u64, BackendError> {
        let mut v: u64 = 0;
        // SAFETY: both attributes read here are cuuint64_t; `v` outlives the call.
        unsafe { result::mem_pool::get_attribute(pool, attr, (&mut v as *mut u64).cast()) }
            .map_err(driver_err)?;
        Ok(v)
    };
    let reserved = read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
    let used = read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    Ok(usize::try_from(reserved.saturating_sub(used)).unwrap_or(usize::MAX))
}

impl CudaBackend {
    fn current_pool(&self) -> Result<Option<sys::CUmemoryPool>, BackendError> {
        current_pool(&self.ctx)
    }

    /// Makes the pool keep freed memory instead of handing it back at each synchronisation.
    pub(super) fn keep_freed_memory(&self) -> Result<(), BackendError> {
        let Some(pool) = self.current_pool()? else {
            return Ok(());
        };
        let mut keep_all: u64 = u64::MAX;
        // SAFETY: the pool is the device's current one (above); the release threshold is a
        // cuuint64_t attribute and `keep_all` outlives the call.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep_all as *mut u64).cast(),
            )
        }
        .map_err(driver_err)
    }

    /// Bytes the pool holds that no buffer uses (memory freed and kept for reuse).
    pub(super) fn idle_pool_bytes(&self) -> Result<usize, BackendError> {
        idle_pool_bytes_of(&self.ctx)
    }

    /// Hands the pool's idle memory back to the driver, after the stream's pending frees.
    pub(super) fn release_idle_memory(&self) -> Result<(), BackendError> {
        let Some(pool) = self.current_pool()? else {
            return Ok(());
        };
        self.stream.synchronize().map_err(driver_err)?;
        // SAFETY: the pool is the device's current one; trimming only releases memory no live
        // allocation uses.
        unsafe { result::mem_pool::trim_to(pool, 0) }.map_err(driver_err)
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{Backend, DType};

    /// A freed buffer's memory stays in the pool, counts as free, and goes back to the driver when
    /// released; a buffer of the same size then comes from the pool again.
    #[test]
    fn freed_memory_is_kept_counted_free_and_released() {
        let Some(b) = super::super::tests::device() else {
            return;
        };
        if !b.ctx.has_async_alloc() {
            println!("skipping: the device has no stream-ordered allocator");
            return;
        }
        const BYTES: usize = 256 << 20;
        b.release_idle_memory().unwrap();
        let idle_before = b.idle_pool_bytes().unwrap();
        let free_before = b.free_memory_bytes().unwrap();
        let buf = b.alloc(DType::U32, BYTES / 4).unwrap(); // [BYTES / 4] u32
        let driver_free_held = b.free_device_bytes().unwrap();
        drop(buf);
        b.synchronize().unwrap();
        let idle = b.idle_pool_bytes().unwrap();
        assert!(
            idle >= BYTES,
            "the pool kept {idle} idle bytes after freeing {BYTES} (had {idle_before})"
        );
        // The driver still counts the kept bytes as used; the backend counts them free.
        let driver_free_after = b.free_device_bytes().unwrap();
        assert!(
            driver_free_after < driver_free_held + BYTES / 2,
            "the driver got the freed bytes back ({driver_free_held} -> {driver_free_after})"
        );
        let free_after = b.free_memory_bytes().unwrap();
        let drift = free_before.abs_diff(free_after);
        assert!(
            drift < 64 << 20,
            "free memory {free_before} before, {free_after} after (kept bytes not counted)"
        );
        b.release_idle_memory().unwrap();
        let left = b.idle_pool_bytes().unwrap();
        assert!(left < BYTES / 2, "release left {left} idle bytes");
        assert!(
            b.free_device_bytes().unwrap() >= driver_free_after + BYTES / 2,
            "releasing did not give the driver its bytes back"
        );
    }
}
