//! The paged KV cache: per layer one K and one V buffer of `[num_blocks, block_size, KVH, D]`
//! in the backend's KV dtype (rows of [`Backend::kv_row_elems`] elements: an e4m3 cache keeps
//! its scales in each row).
//!
//! Physical blocks are handed out by the engine's block manager; the model writes and reads them
//! through block tables. A block's bytes (all layers) can be read out and written back, for
//! swapping to host memory and for checkpoints; many blocks at once through a backend's
//! [`KvStager`] (a device gathers them into one staging buffer and copies it out asynchronously;
//! the CPU copies them synchronously).

use crate::backend::kv_stage::KvStager;
use crate::backend::{Backend, DType};
use crate::checkpoint::driver::StagedBlocks;

use super::config::LlamaConfig;
use super::error::ModelError;

/// K and V caches of every layer.
pub struct KvCache<B: Backend> {
    /// Per layer, `[num_blocks, block_size, KVH, D]`.
    k: Vec<B::Buffer>,
    /// Per layer, `[num_blocks, block_size, KVH, D]`.
    v: Vec<B::Buffer>,
    num_blocks: usize,
    block_size: usize,
    /// Elements of one token in one layer's K (or V): [`Backend::kv_row_elems`].
    kv_width: usize,
    dtype: DType,
}

impl<B: Backend> KvCache<B> {
    /// Allocates a zeroed cache of `num_blocks` blocks of `block_size` tokens for `config`.
    pub fn new(
        backend: &B,
        config: &LlamaConfig,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        if block_size == 0 || num_blocks == 0 {
            return Err(ModelError::InvalidConfig(format!(
                "KV cache needs at least one block of at least one token (got {num_blocks} x {block_size})"
            )));
        }
        let multiple = backend.kv_block_multiple().max(1);
        if !block_size.is_multiple_of(multiple) {
            return Err(ModelError::InvalidConfig(format!(
                "this KV cache format needs a block size that is a multiple of {multiple} (got \
                 {block_size}; an FP8 cache, --kv-dtype fp8, keeps slots in groups of {multiple})"
            )));
        }
        if num_blocks > u32::MAX as usize / block_size {
            return Err(ModelError::InvalidConfig(format!(
                "{num_blocks} blocks of {block_size} exceed u32 slot ids"
            )));
        }
        let kv_width = backend.kv_row_elems(crate::backend::HeadShape {
            n_heads: config.num_attention_heads,
            n_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        });
        let dtype = backend.kv_dtype();
        let len = num_blocks * block_size * kv_width;
        let mut k = Vec::with_capacity(config.num_hidden_layers);
        let mut v = Vec::with_capacity(config.num_hidden_layers);
        for _ in 0..config.num_hidden_layers {
            k.push(backend.alloc(dtype, len)?);
            v.push(backend.alloc(dtype, len)?);
        }
        Ok(KvCache {
            k,
            v,
            num_blocks,
            block_size,
            kv_width,
            dtype,
        })
    }

    /// Number of physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Elements of one token's row in one layer's K (or V): `KVH * D`, plus the scales of an
    /// e4m3 cache ([`Backend::kv_row_elems`]).
    pub fn kv_width(&self) -> usize {
        self.kv_width
    }

    /// Element type of the cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements of one block in one layer's K (or V): `block_size * KVH * D`.
    fn block_elems(&self) -> usize {
        self.block_size * self.kv_width
    }

    /// Bytes [`KvCache::read_block`] returns: `num_layers * 2 * block_size * KVH * D * dtype size`.
    pub fn block_bytes(&self) -> usize {
        self.num_layers() * 2 * self.block_elems() * self.dtype.size_bytes()
    }

    fn check_block(&self, block: u32) -> Result<usize, ModelError> {
        if block as usize >= self.num_blocks {
            return Err(ModelError::InvalidBatch(format!(
                "block {block} out of range ({} blocks)",
                self.num_blocks
            )));
        }
        Ok(block as usize * self.block_elems())
    }

    /// The bytes of one block: for each layer, its K block then its V block, each
    /// `[block_size, KVH, D]` in [`KvCache::dtype`], little-endian.
    pub fn read_block(&self, backend: &B, block: u32) -> Result<Vec<u8>, ModelError> {
        let offset = self.check_block(block)?;
        let mut out = Vec::with_capacity(self.block_bytes());
        for (k, v) in self.k.iter().zip(&self.v) {
            out.extend(backend.read_bytes(k, offset, self.block_elems())?);
            out.extend(backend.read_bytes(v, offset, self.block_elems())?);
        }
        Ok(out)
    }

    /// Restores one block from bytes produced by [`KvCache::read_block`] on a cache of the same
    /// shape and dtype.
    pub fn write_block(&mut self, backend: &B, block: u32, bytes: &[u8]) -> Result<(), ModelError> {
        let offset = self.check_block(block)?;
        if bytes.len() != self.block_bytes() {
            return Err(ModelError::InvalidBatch(format!(
                "KV block data is {} bytes, this cache's blocks are {}",
                bytes.len(),
                self.block_bytes()
            )));
        }
        let part = self.block_elems() * self.dtype.size_bytes();
        let mut chunks = bytes.chunks(part);
        for (k, v) in self.k.iter_mut().zip(self.v.iter_mut()) {
            for buf in [k, v] {
                let chunk = chunks
                    .next()
                    .ok_or_else(|| ModelError::InvalidBatch("KV block data too short".into()))?;
                backend.write_bytes(buf, offset, chunk)?;
            }
        }
        Ok(())
    }

    /// Copies block `src` onto block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, backend: &B, src: u32, dst: u32) -> Result<(), ModelError> {
        let (s, d) = (self.check_block(src)?, self.check_block(dst)?);
        if s == d {
            return Ok(());
        }
        let n = self.block_elems();
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            backend.copy_within(buf, s, d, n)?;
        }
        Ok(())
    }

    /// Starts copying the whole blocks `blocks` to the host (see [`KvStager::stage_read`]): the
    /// handle's bytes are each block's [`KvCache::read_block`] bytes, concatenated.
    pub fn stage_blocks(
        &self,
        backend: &B,
        blocks: &[u32],
    ) -> Result<Box<dyn StagedBlocks>, ModelError>
    where
        B: KvStager,
    {
        for &b in blocks {
            self.check_block(b)?;
        }
        Ok(backend.stage_read(&self.k, &self.v, self.block_elems(), blocks)?)
    }

    /// Writes whole blocks from the bytes of [`KvCache::stage_blocks`] (`blocks.len()` blocks,
    /// concatenated) into `blocks`.
    pub fn write_blocks(
        &mut self,
        backend: &B,
        blocks: &[u32],
        bytes: &[u8],
    ) -> Result<(), ModelError>
    where
        B: KvStager,
    {
        for &b in blocks {
            self.check_block(b)?;
        }
        if bytes.len() != blocks.len() * self.block_bytes() {
            return Err(ModelError::InvalidBatch(format!(
                "{} bytes for {} KV blocks of {} bytes",
                bytes.len(),
                blocks.len(),
                self.block_bytes()
            )));
        }
        let elems = self.block_elems();
        Ok(backend.stage_write(&mut self.k, &mut self.v, elems, blocks, bytes)?)
    }

    /// K and V buffers of layer `l`.
    pub(crate) fn layer_mut(&mut self, l: usize) -> (&mut B::Buffer, &mut B::Buffer) {
        (&mut self.k[l], &mut self.v[l])
    }
}
