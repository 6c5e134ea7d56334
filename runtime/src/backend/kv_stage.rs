//! Moving many whole paged-KV blocks between a backend's caches and the host at once: the
//! [`KvStager`] a backend implements for checkpoints and swapping (`KvCache::stage_blocks` /
//! `write_blocks` call it).
//!
//! Design: a block's bytes are, for each layer, its K block then its V block, as
//! `KvCache::read_block` lays them out (the checkpoint format). The provided methods copy block by
//! block, synchronously, which is what the host's caches need; the CUDA backend gathers on the
//! device and copies asynchronously through pinned memory (`cuda/staging.rs`).

use super::cpu::CpuBackend;
use super::{Backend, BackendError};
use crate::checkpoint::driver::{ReadyBlocks, StagedBlocks};

/// How a backend moves many whole KV blocks between its caches and the host. Bytes of a block:
/// for each layer its K block then its V block (`block_elems` elements each), as
/// the model's `KvCache::read_block`. The provided methods copy block by block, synchronously.
pub trait KvStager: Backend {
    /// Starts copying `blocks` out of the per-layer caches `k` and `v`; the result holds the cache
    /// as it was when this was called, in stream order (later kernels may overwrite the blocks).
    fn stage_read(
        &self,
        k: &[Self::Buffer],
        v: &[Self::Buffer],
        block_elems: usize,
        blocks: &[u32],
    ) -> Result<Box<dyn StagedBlocks>, BackendError> {
        let mut out = Vec::new();
        for &b in blocks {
            let offset = b as usize * block_elems;
            for (kl, vl) in k.iter().zip(v) {
                out.extend(self.read_bytes(kl, offset, block_elems)?);
                out.extend(self.read_bytes(vl, offset, block_elems)?);
            }
        }
        Ok(Box::new(ReadyBlocks(out)))
    }

    /// Writes `bytes` (`blocks.len()` blocks in [`KvStager::stage_read`]'s layout) into `blocks`.
    fn stage_write(
        &self,
        k: &mut [Self::Buffer],
        v: &mut [Self::Buffer],
        block_elems: usize,
        blocks: &[u32],
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let part = bytes.len() / (blocks.len() * 2 * k.len()).max(1);
        let mut parts = bytes.chunks(part.max(1));
        for &b in blocks {
            let offset = b as usize * block_elems;
            for (kl, vl) in k.iter_mut().zip(v.iter_mut()) {
                for buf in [kl, vl] {
                    let chunk = parts.next().ok_or_else(|| BackendError::Shape {
                        op: "stage_write",
                        detail: "KV block bytes too short".into(),
                    })?;
                    self.write_bytes(buf, offset, chunk)?;
                }
            }
        }
        Ok(())
    }
}

/// The host's caches are host memory: block-by-block copies are as good as a gather.
impl KvStager for CpuBackend {}
