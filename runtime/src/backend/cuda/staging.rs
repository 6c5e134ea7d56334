//! Staged KV block copies on the GPU, the [`KvStager`] of [`CudaBackend`]: whole blocks gathered on
//! the device into one contiguous staging buffer by one kernel (`kernels/cuda/kv_gather.cu`), then
//! one asynchronous device-to-host copy into pinned host memory on a side stream; writes are one
//! host-to-device copy then the scatter kernel.
//!
//! Design (issue 17 item 3, issue 19's GPU swap): the gather runs on the backend's compute stream,
//! so it sees the cache exactly as the kernels enqueued before it left it, and the kernels enqueued
//! after it (the next decode step, a block handed to another sequence) may overwrite the blocks at
//! once. An event orders the side stream's copy after the gather; the calling thread does not wait,
//! and whoever holds the handle (a checkpoint writer thread) waits on the copy's event. Memory is
//! bounded: [`STAGING_SLOTS`] slots per device (device staging + pinned host buffer + block table,
//! each grown to the largest request), process-wide like the kernel cache; a read waits for a free
//! slot (back-pressure), and a handle gives its slot back when dropped, once its copy is done.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg,
    result, sys,
};
use cudarc::nvrtc::compile_ptx;

use super::buffer::CudaBuffer;
use super::device::{CudaBackend, driver_err};
use crate::backend::BackendError;
use crate::backend::kv_stage::KvStager;
use crate::checkpoint::driver::{ReadyBlocks, StagedBlocks};

/// Staging slots per device: one being filled while the previous one is hashed and written.
pub const STAGING_SLOTS: usize = 2;

/// The gather/scatter kernel's source.
const SOURCE: &str = include_str!("../../../../kernels/cuda/kv_gather.cu");

/// One slot's memory (absent until first used, then grown as needed).
#[derive(Default)]
struct Slot {
    dev: Option<CudaSlice<u8>>,
    host: Option<PinnedHostSlice<u8>>,
    table: Option<CudaSlice<u64>>,
}

/// A device's side stream, kernel and free slots.
struct Pool {
    side: Arc<CudaStream>,
    func: CudaFunction,
    free: Mutex<Vec<Slot>>,
    returned: Condvar,
}

/// Pools by device ordinal.
static POOLS: OnceLock<Mutex<HashMap<usize, Arc<Pool>>>> = OnceLock::new();

fn poisoned() -> BackendError {
    BackendError::Device("KV staging lock poisoned".into())
}

impl Pool {
    /// Waits for a free slot.
    fn take(self: &Arc<Self>) -> Result<SlotGuard, BackendError> {
        let mut free = self.free.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(slot) = free.pop() {
                return Ok(SlotGuard {
                    pool: self.clone(),
                    slot: Some(slot),
                });
            }
            free = self.returned.wait(free).map_err(|_| poisoned())?;
        }
    }
}

/// A slot taken from its pool; dropping it gives it back.
struct SlotGuard {
    pool: Arc<Pool>,
    slot: Option<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let (Some(slot), Ok(mut free)) = (self.slot.take(), self.pool.free.lock()) {
            free.push(slot);
            self.pool.returned.notify_one();
        }
    }
}

/// Device address of a slice's first element.
fn addr<T>(s: &CudaSlice<T>) -> u64 {
    let (ptr, _sync) = s.device_ptr(s.stream());
    ptr
}

impl SlotGuard {
    /// Grows the slot to `bytes` of staging (pinned too when `pinned`) and `table` entries;
    /// returns (device staging address, table address).
    fn ensure(
        &mut self,
        be: &CudaBackend,
        bytes: usize,
        table: usize,
        pinned: bool,
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
        if pinned && slot.host.as_ref().is_none_or(|h| h.len() < bytes) {
            slot.host = None;
            // SAFETY: flags 0 is ordinary (cached, readable) page-locked memory; it is only read
            // after the copy into it has completed (`CudaStaged::wait`).
            slot.host = Some(
                unsafe { be.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(driver_err)?,
            );
        }
        match (&slot.dev, &slot.table) {
            (Some(d), Some(t)) => Ok((addr(d), addr(t))),
            _ => Err(BackendError::Device(
                "KV staging slot missing memory".into(),
            )),
        }
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
            side: self.ctx.new_stream().map_err(driver_err)?,
            func,
            free: Mutex::new((0..STAGING_SLOTS).map(|_| Slot::default()).collect()),
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

/// A staged read: bytes arrive in the slot's pinned buffer when `done` fires.
struct CudaStaged {
    guard: SlotGuard,
    done: cudarc::driver::CudaEvent,
    len: usize,
}

impl StagedBlocks for CudaStaged {
    fn wait(&mut self) -> Result<&[u8], String> {
        self.done.synchronize().map_err(|e| format!("{e:?}"))?;
        let host = self
            .guard
            .slot
            .as_ref()
            .and_then(|s| s.host.as_ref())
            .ok_or("KV staging slot lost its host buffer")?;
        let all = host.as_slice().map_err(|e| format!("{e:?}"))?;
        all.get(..self.len)
            .ok_or_else(|| "KV staging buffer shorter than its copy".to_string())
    }
}

impl Drop for CudaStaged {
    fn drop(&mut self) {
        // The slot goes back to the pool only once nothing copies into it.
        let _ = self.done.synchronize();
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
        let mut guard = pool.take()?;
        let at = guard.ensure(self, bytes, layers.len() + blocks.len(), true)?;
        self.launch_stage_copy(&pool, &layers, blocks, part, at, false)?;
        let gathered = self.ctx.new_event(None).map_err(driver_err)?;
        gathered.record(&self.stream).map_err(driver_err)?;
        pool.side.wait(&gathered).map_err(driver_err)?;
        let host = guard
            .slot
            .as_mut()
            .and_then(|s| s.host.as_mut())
            .ok_or_else(|| BackendError::Device("KV staging slot lost its host buffer".into()))?;
        let dst = host.as_mut_slice().map_err(driver_err)?;
        // SAFETY: the pinned buffer holds >= bytes (`ensure`) and is not read before `done`; the
        // side stream waits for the gather that fills the device staging.
        unsafe { result::memcpy_dtoh_async(&mut dst[..bytes], at.0, pool.side.cu_stream()) }
            .map_err(driver_err)?;
        let done = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver_err)?;
        done.record(&pool.side).map_err(driver_err)?;
        Ok(Box::new(CudaStaged {
            guard,
            done,
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
        let mut guard = pool.take()?;
        let at = guard.ensure(self, bytes.len(), layers.len() + blocks.len(), false)?;
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
    use super::STAGING_SLOTS;
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
        // The pool is bounded: with every slot held, the slots come back when the handles go.
        let held: Vec<_> = (0..STAGING_SLOTS)
            .map(|i| kv.stage_blocks(&be, &[i as u32]).unwrap())
            .collect();
        drop(held);
        let mut again = kv.stage_blocks(&be, &[39]).unwrap();
        assert!(again.wait().unwrap() == pattern(39, bb).as_slice());
    }
}
