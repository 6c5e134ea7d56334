//! Staged KV block copies on the GPU, the [`KvStager`] of [`CudaBackend`]: whole blocks gathered on
//! the device into one contiguous staging buffer by one kernel (`kernels/cuda/kv_gather.cu`); the
//! device-to-host copy into pinned host memory runs on a side stream when the holder of the handle
//! asks for the bytes; writes are one host-to-device copy then the scatter kernel.
//!
//! Design (issue 17 item 3, issue 19's GPU swap): the gather runs on the backend's compute stream,
//! so it sees the cache exactly as the kernels enqueued before it left it, and the kernels enqueued
//! after it (the next decode step, a block handed to another sequence) may overwrite the blocks at
//! once. Nothing the caller (the engine thread) does waits for the host: it takes a device staging
//! buffer, enqueues the gather and returns. Whoever holds the handle (a checkpoint writer thread)
//! calls `wait`, which takes a pinned host buffer, orders the side stream's copy after the gather
//! by an event and waits for it; so pinned memory is allocated, and copies wait for a free pinned
//! buffer, on the writer's thread, not on the engine's. Memory is bounded: device staging buffers
//! are kept for reuse (each grown to the largest piece it held) and a new one is made only while
//! the device keeps [`DEVICE_HEADROOM`] bytes free after it (otherwise the read waits for one to
//! come back); at most [`HOST_SLOTS`] pinned buffers exist per device. Both pools are
//! process-wide, like the kernel cache; a handle gives its buffers back when dropped, once its
//! copy is done.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice,
    PushKernelArg, result, sys,
};
use cudarc::nvrtc::compile_ptx;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::BackendError;
use crate::backend::kv_stage::KvStager;
use crate::checkpoint::driver::{ReadyBlocks, StagedBlocks};

/// Pinned host buffers per device: one being copied into while the previous one is hashed.
pub const HOST_SLOTS: usize = 2;

/// Device memory a new device staging buffer must leave free (decode graphs and scratch).
pub const DEVICE_HEADROOM: usize = 4 << 30;

/// The gather/scatter kernel's source.
const SOURCE: &str = include_str!("../../../../kernels/cuda/kv_gather.cu");

/// One device staging buffer (`[bytes]`, the gathered blocks) and its kernel table
/// (`[2 * layers + blocks]` u64: layer bases, then block ids).
#[derive(Default)]
struct DevSlot {
    dev: Option<CudaSlice<u8>>,
    table: Option<CudaSlice<u64>>,
}

/// A device's side stream, kernel and free buffers.
struct Pool {
    ctx: Arc<CudaContext>,
    side: Arc<CudaStream>,
    func: CudaFunction,
    state: Mutex<Free>,
    returned: Condvar,
}

/// The buffers not lent out, and how many device buffers exist.
struct Free {
    dev: Vec<DevSlot>,
    dev_made: usize,
    /// Pinned host buffers (`[bytes]`), absent until first grown.
    host: Vec<Option<PinnedHostSlice<u8>>>,
}

/// Pools by device ordinal.
static POOLS: OnceLock<Mutex<HashMap<usize, Arc<Pool>>>> = OnceLock::new();

fn poisoned() -> BackendError {
    BackendError::Device("KV staging lock poisoned".into())
}

impl Pool {
    fn lock(&self) -> Result<MutexGuard<'_, Free>, BackendError> {
        self.state.lock().map_err(|_| poisoned())
    }

    /// A device buffer: a free one (the smallest that holds `bytes`, else the largest), a new one
    /// while the device keeps [`DEVICE_HEADROOM`] free, or else the next one given back.
    fn take_dev(self: &Arc<Self>, bytes: usize) -> Result<DevGuard, BackendError> {
        let t0 = std::time::Instant::now();
        let mut free = self.lock()?;
        loop {
            let fits = |s: &DevSlot| s.dev.as_ref().map_or(0, |d| d.len());
            let best = (0..free.dev.len())
                .filter(|&i| fits(&free.dev[i]) >= bytes)
                .min_by_key(|&i| fits(&free.dev[i]))
                .or_else(|| (0..free.dev.len()).max_by_key(|&i| fits(&free.dev[i])));
            if let Some(i) = best {
                let slot = free.dev.swap_remove(i);
                return Ok(DevGuard {
                    pool: self.clone(),
                    slot: Some(slot),
                });
            }
            // The allocation pool's idle bytes are free to a new buffer too (mem_pool.rs).
            let idle = super::mem_pool::idle_pool_bytes_of(&self.ctx).unwrap_or(0);
            let room = self.ctx.mem_get_info().map_or(0, |(f, _)| f) + idle;
            if free.dev_made == 0 || room >= bytes + DEVICE_HEADROOM {
                free.dev_made += 1;
                return Ok(DevGuard {
                    pool: self.clone(),
                    slot: Some(DevSlot::default()),
                });
            }
            free = self.returned.wait(free).map_err(|_| poisoned())?;
            tracing::info!(
                "KV staging: waited {:.1} ms for a device buffer ({} made, {} MB free on the device)",
                t0.elapsed().as_secs_f64() * 1e3,
                free.dev_made,
                room / 1_000_000
            );
        }
    }

    /// A pinned host buffer (waits while [`HOST_SLOTS`] are lent out).
    fn take_host(self: &Arc<Self>) -> Result<HostGuard, BackendError> {
        let mut free = self.lock()?;
        loop {
            if let Some(buf) = free.host.pop() {
                return Ok(HostGuard {
                    pool: self.clone(),
                    buf: Some(buf),
                });
            }
            free = self.returned.wait(free).map_err(|_| poisoned())?;
        }
    }
}

/// A device buffer taken from its pool; dropping it gives it back.
struct DevGuard {
    pool: Arc<Pool>,
    slot: Option<DevSlot>,
}

impl Drop for DevGuard {
    fn drop(&mut self) {
        if let (Some(slot), Ok(mut free)) = (self.slot.take(), self.pool.lock()) {
            free.dev.push(slot);
            self.pool.returned.notify_all();
        }
    }
}

/// A pinned host buffer taken from its pool; dropping it gives it back.
struct HostGuard {
    pool: Arc<Pool>,
    buf: Option<Option<PinnedHostSlice<u8>>>,
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        if let (Some(buf), Ok(mut free)) = (self.buf.take(), self.pool.lock()) {
            free.host.push(buf);
            self.pool.returned.notify_all();
        }
    }
}

/// Device address of a slice's first element.
fn addr<T>(s: &CudaSlice<T>) -> u64 {
    let (ptr, _sync) = s.device_ptr(s.stream());
    ptr
}

impl DevGuard {
    /// Grows the buffer to `bytes` of staging and `table` entries; returns (device staging
    /// address, table address).
    fn ensure(
        &mut self,
        be: &CudaBackend,
        bytes: usize,
        table: usize,
    ) -> Result<(u64, u64), BackendError> {
        let slot = self
            .slot
            .as_mut()
            .ok_or_else(|| BackendError::Device("KV staging slot missing".into()))?;
        if slot.dev.as_ref().is_none_or(|d| d.len() < bytes) {
            slot.dev = None;
            // SAFETY: the staging bytes are written (gather or host copy) before they are read.
            slot.dev = Some(unsafe { be.stream.alloc::<u8>(bytes) }.map_err(driver_err)?);
        }
        if slot.table.as_ref().is_none_or(|t| t.len() < table) {
            slot.table = None;
            // SAFETY: the table is uploaded before the kernel that reads it.
            slot.table = Some(unsafe { be.stream.alloc::<u64>(table) }.map_err(driver_err)?);
        }
        match (&slot.dev, &slot.table) {
            (Some(d), Some(t)) => Ok((addr(d), addr(t))),
            _ => Err(BackendError::Device(
                "KV staging slot missing memory".into(),
            )),
        }
    }
}

impl HostGuard {
    /// Grows the pinned buffer to `bytes`.
    fn ensure(
        &mut self,
        ctx: &Arc<CudaContext>,
        bytes: usize,
    ) -> Result<&mut PinnedHostSlice<u8>, BackendError> {
        let buf = self
            .buf
            .as_mut()
            .ok_or_else(|| BackendError::Device("KV staging host buffer missing".into()))?;
        if buf.as_ref().is_none_or(|h| h.len() < bytes) {
            *buf = None;
            let t0 = std::time::Instant::now();
            // SAFETY: flags 0 is ordinary (cached, readable) page-locked memory; it is only read
            // after the copy into it has completed (`CudaStaged::wait`).
            *buf =
                Some(unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(driver_err)?);
            tracing::info!(
                "KV staging: {} MB of pinned memory allocated in {:.1} ms",
                bytes / 1_000_000,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        buf.as_mut()
            .ok_or_else(|| BackendError::Device("KV staging host buffer missing".into()))
    }
}

impl CudaBackend {
    /// This device's staging pool, created on first use.
    fn staging_pool(&self) -> Result<Arc<Pool>, BackendError> {
        let mut pools = POOLS
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .map_err(|_| poisoned())?;
        if let Some(p) = pools.get(&self.ordinal) {
            return Ok(p.clone());
        }
        let ptx = compile_ptx(SOURCE)
            .map_err(|e| BackendError::Device(format!("NVRTC failed on kv_gather.cu: {e:?}")))?;
        let module = self.ctx.load_module(ptx).map_err(driver_err)?;
        let func = module.load_function("kv_stage_copy").map_err(driver_err)?;
        let pool = Arc::new(Pool {
            ctx: self.ctx.clone(),
            side: self.ctx.new_stream().map_err(driver_err)?,
            func,
            state: Mutex::new(Free {
                dev: Vec::new(),
                dev_made: 0,
                host: (0..HOST_SLOTS).map(|_| None).collect(),
            }),
            returned: Condvar::new(),
        });
        pools.insert(self.ordinal, pool.clone());
        Ok(pool)
    }

    /// Uploads the kernel's table (layer bases, then block ids) and launches the copy of `blocks`
    /// between the caches and the staging buffer at `stage`, on the compute stream.
    fn launch_stage_copy(
        &self,
        pool: &Pool,
        layers: &[u64],
        blocks: &[u32],
        part_bytes: usize,
        (stage, table): (u64, u64),
        scatter: bool,
    ) -> Result<(), BackendError> {
        let mut t: Vec<u64> = layers.to_vec();
        t.extend(blocks.iter().map(|&b| u64::from(b)));
        // SAFETY: the table slot holds at least t.len() entries (`ensure`); a copy from pageable
        // memory has read `t` when the call returns.
        unsafe { result::memcpy_htod_async(table, &t, self.stream.cu_stream()) }
            .map_err(driver_err)?;
        let n_layers = (layers.len() / 2) as u32;
        let part = part_bytes as u64;
        let flag = i32::from(scatter);
        let mut b = self.stream.launch_builder(&pool.func);
        b.arg(&table)
            .arg(&n_layers)
            .arg(&part)
            .arg(&stage)
            .arg(&flag);
        let cfg = LaunchConfig {
            grid_dim: ((blocks.len() * layers.len()) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every block id was checked against the cache (`KvCache::stage_blocks`), the
        // staging buffer holds blocks.len() * layers.len() parts of part_bytes (`ensure`).
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        Ok(())
    }
}

/// Layer bases `[K0, V0, K1, V1, ...]` and the bytes of one layer's block.
fn layer_table(k: &[CudaBuffer], v: &[CudaBuffer], block_elems: usize) -> (Vec<u64>, usize) {
    let layers = k
        .iter()
        .zip(v)
        .flat_map(|(a, b)| [a.ptr(), b.ptr()])
        .collect();
    let size = k.first().map_or(2, |b| b.dtype.size_bytes());
    (layers, block_elems * size)
}

/// A staged read: the gathered blocks are in `dev` once `gathered` fires; `wait` copies them into
/// a pinned buffer and returns them.
struct CudaStaged {
    /// Held until the copy out of it is done.
    _dev: DevGuard,
    gathered: cudarc::driver::CudaEvent,
    pool: Arc<Pool>,
    /// The pinned buffer and the event of the copy into it, once `wait` started it.
    host: Option<(HostGuard, cudarc::driver::CudaEvent)>,
    /// Device address of the gathered bytes.
    at: u64,
    len: usize,
}

impl CudaStaged {
    /// Starts the copy into a pinned buffer (once).
    fn start_copy(&mut self) -> Result<(), BackendError> {
        if self.host.is_some() {
            return Ok(());
        }
        // This runs on the handle holder's thread (a checkpoint writer): bind the device there.
        self.pool.ctx.bind_to_thread().map_err(driver_err)?;
        let mut host = self.pool.take_host()?;
        let dst = host
            .ensure(&self.pool.ctx, self.len)?
            .as_mut_slice()
            .map_err(driver_err)?;
        self.pool.side.wait(&self.gathered).map_err(driver_err)?;
        // SAFETY: the pinned buffer holds >= len bytes (`ensure`) and is not read before `done`
        // fires; the side stream waits for the gather that fills the device staging, which is
        // not given back before `done` (Drop).
        unsafe {
            result::memcpy_dtoh_async(&mut dst[..self.len], self.at, self.pool.side.cu_stream())
        }
        .map_err(driver_err)?;
        let done = self
            .pool
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver_err)?;
        done.record(&self.pool.side).map_err(driver_err)?;
        self.host = Some((host, done));
        Ok(())
    }
}

impl StagedBlocks for CudaStaged {
    fn wait(&mut self) -> Result<&[u8], String> {
        self.start_copy().map_err(|e| e.to_string())?;
        let (host, done) = self.host.as_ref().ok_or("KV staging copy not started")?;
        done.synchronize().map_err(|e| format!("{e:?}"))?;
        let all = host
            .buf
            .as_ref()
            .and_then(|b| b.as_ref())
            .ok_or("KV staging lost its host buffer")?
            .as_slice()
            .map_err(|e| format!("{e:?}"))?;
        all.get(..self.len)
            .ok_or_else(|| "KV staging buffer shorter than its copy".to_string())
    }
}

impl Drop for CudaStaged {
    fn drop(&mut self) {
        // The buffers go back to their pools only once nothing reads or writes them.
        match &self.host {
            Some((_, done)) => {
                let _ = done.synchronize();
            }
            None => {
                let _ = self.gathered.synchronize();
            }
        }
    }
}

impl KvStager for CudaBackend {
    fn stage_read(
        &self,
        k: &[CudaBuffer],
        v: &[CudaBuffer],
        block_elems: usize,
        blocks: &[u32],
    ) -> Result<Box<dyn StagedBlocks>, BackendError> {
        if blocks.is_empty() || k.is_empty() {
            return Ok(Box::new(ReadyBlocks(Vec::new())));
        }
        let (layers, part) = layer_table(k, v, block_elems);
        let bytes = blocks.len() * layers.len() * part;
        let pool = self.staging_pool()?;
        let mut dev = pool.take_dev(bytes)?;
        let at = dev.ensure(self, bytes, layers.len() + blocks.len())?;
        self.launch_stage_copy(&pool, &layers, blocks, part, at, false)?;
        let gathered = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver_err)?;
        gathered.record(&self.stream).map_err(driver_err)?;
        Ok(Box::new(CudaStaged {
            _dev: dev,
            gathered,
            pool,
            host: None,
            at: at.0,
            len: bytes,
        }))
    }

    fn stage_write(
        &self,
        k: &mut [CudaBuffer],
        v: &mut [CudaBuffer],
        block_elems: usize,
        blocks: &[u32],
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        if blocks.is_empty() || k.is_empty() {
            return Ok(());
        }
        let (layers, part) = layer_table(k, v, block_elems);
        if bytes.len() != blocks.len() * layers.len() * part {
            return Err(BackendError::Shape {
                op: "stage_write",
                detail: format!("{} bytes for {} blocks", bytes.len(), blocks.len()),
            });
        }
        let pool = self.staging_pool()?;
        let mut dev = pool.take_dev(bytes.len())?;
        let at = dev.ensure(self, bytes.len(), layers.len() + blocks.len())?;
        // SAFETY: the staging buffer holds bytes.len() (`ensure`); the stream is synchronised
        // below, before `bytes` or the slot can go.
        unsafe { result::memcpy_htod_async(at.0, bytes, self.stream.cu_stream()) }
            .map_err(driver_err)?;
        self.launch_stage_copy(&pool, &layers, blocks, part, at, true)?;
        self.stream.synchronize().map_err(driver_err)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::device;
    use super::HOST_SLOTS;
    use crate::model::KvCache;
    use crate::model::random::tiny_config;

    /// Bytes of block `b`, different in every block and byte (the cache's dtype is irrelevant).
    fn pattern(b: u32, len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9u32 ^ b.wrapping_mul(0x85EB_CA6B);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn staged_reads_see_the_cache_in_stream_order_and_writes_round_trip() {
        let Some(be) = device() else { return };
        let config = tiny_config();
        let mut kv = KvCache::new(&be, &config, 40, 16).unwrap();
        let bb = kv.block_bytes();
        for b in 0..40 {
            kv.write_block(&be, b, &pattern(b, bb)).unwrap();
        }
        let ids = [7u32, 3, 39, 0, 3, 21];
        let mut staged = kv.stage_blocks(&be, &ids).unwrap();
        // Work enqueued after the gather (here an overwrite of a staged block) does not show.
        kv.write_block(&be, 7, &vec![0u8; bb]).unwrap();
        let want: Vec<u8> = ids.iter().flat_map(|&b| pattern(b, bb)).collect();
        assert!(
            staged.wait().unwrap() == want.as_slice(),
            "gathered bytes differ"
        );
        // The gathered bytes equal the per-block reads (the checkpoint layout).
        assert_eq!(kv.read_block(&be, 3).unwrap(), pattern(3, bb));
        // Scatter: one staged write of several blocks, read back block by block.
        let dst = [1u32, 2, 5, 6, 8, 9];
        kv.write_blocks(&be, &dst, &want).unwrap();
        for (&d, &s) in dst.iter().zip(&ids) {
            assert_eq!(kv.read_block(&be, d).unwrap(), pattern(s, bb), "block {d}");
        }
        assert_eq!(
            kv.read_block(&be, 4).unwrap(),
            pattern(4, bb),
            "untouched block"
        );
        // Out-of-range ids and short writes are refused, not copied.
        assert!(kv.stage_blocks(&be, &[40]).is_err());
        assert!(kv.write_blocks(&be, &[1, 2], &want[..bb]).is_err());
        drop(staged);
        // Pinned buffers are bounded: with more reads waited on than there are pinned buffers,
        // the next one's copy waits until a handle goes; reads not waited on hold none.
        // (Blocks 30.. still hold their patterns; the scatter above overwrote 1..=9.)
        let mut held: Vec<_> = (0..HOST_SLOTS + 3)
            .map(|i| kv.stage_blocks(&be, &[30 + i as u32]).unwrap())
            .collect();
        for (i, h) in held.iter_mut().enumerate().take(HOST_SLOTS) {
            assert!(h.wait().unwrap() == pattern(30 + i as u32, bb).as_slice());
        }
        drop(held);
        let mut again = kv.stage_blocks(&be, &[39]).unwrap();
        assert!(again.wait().unwrap() == pattern(39, bb).as_slice());
    }
}
