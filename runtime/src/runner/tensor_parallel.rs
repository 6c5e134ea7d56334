//! [`TensorParallelRunner`]: a [`TensorParallel`] model and one paged KV cache per rank, as the
//! engine's [`ForwardModel`]. The engine, scheduler, checkpoints and receipts stay one per model:
//! every step runs on every rank, and a checkpoint's KV block is gathered from the ranks into the
//! unsharded layout (`[layers, 2 (K, V), block_size, KVH * D]`, each rank's heads in rank order),
//! so a checkpoint taken with N ranks restores into any other number of ranks, one included.

use crate::backend::Backend;
use crate::checkpoint::driver::KvBlockIo;
use crate::checkpoint::snapshot::KvLayout;
use crate::engine::checkpointing::kv_tail::{merge_tail_rows, tail_rows};
use crate::engine::forward::ForwardModel;
use crate::model::batch::SeqChunk;
use crate::model::tensor_parallel::TensorParallel;
use crate::model::{KvCache, ModelError};

/// A tensor-parallel model and its ranks' KV caches: what the engine thread owns.
pub struct TensorParallelRunner<B: Backend> {
    tp: TensorParallel<B>,
    /// `[world]`: rank r's cache holds its `KVH / world` key/value heads of every block.
    kvs: Vec<KvCache<B>>,
}

impl<B: Backend> TensorParallelRunner<B> {
    /// Allocates `num_blocks` blocks of `block_size` tokens on every rank of `tp`.
    pub fn new(
        tp: TensorParallel<B>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        let kvs = tp.new_kv_caches(num_blocks, block_size)?;
        Ok(Self { tp, kvs })
    }

    /// The ranks' model.
    pub fn model(&self) -> &TensorParallel<B> {
        &self.tp
    }

    /// One block's whole bytes in the unsharded layout, gathered from every rank.
    fn gather(&self, block: u32) -> Result<Vec<u8>, String> {
        let parts = 2 * self.kvs.first().map_or(0, KvCache::num_layers);
        let mut ranks = Vec::with_capacity(self.kvs.len()); // [world][block bytes / world]
        for (r, kv) in self.kvs.iter().enumerate() {
            let model = self.tp.rank(r).ok_or("rank out of range")?;
            ranks.push(
                kv.read_block(model.backend(), block)
                    .map_err(|e| e.to_string())?,
            );
        }
        let bs = self.kvs.first().map_or(1, KvCache::block_size);
        let row = ranks.first().map_or(0, |b| b.len() / (parts * bs).max(1)); // one rank's token row
        let mut full = Vec::with_capacity(row * parts * bs * ranks.len()); // [parts, bs, KVH * D]
        for p in 0..parts {
            for t in 0..bs {
                let at = (p * bs + t) * row;
                for bytes in &ranks {
                    full.extend_from_slice(&bytes[at..at + row]);
                }
            }
        }
        Ok(full)
    }

    /// Writes a whole block in the unsharded layout back into every rank's slice of it.
    fn scatter(&mut self, block: u32, full: &[u8]) -> Result<(), String> {
        let world = self.kvs.len();
        let parts = 2 * self.kvs.first().map_or(0, KvCache::num_layers);
        let bs = self.kvs.first().map_or(1, KvCache::block_size);
        let expected: usize = self.kvs.iter().map(KvCache::block_bytes).sum();
        if full.len() != expected {
            return Err(format!(
                "KV block data is {} bytes, the ranks' blocks are {expected}",
                full.len()
            ));
        }
        let row = full.len() / (parts * bs * world).max(1);
        for (r, kv) in self.kvs.iter_mut().enumerate() {
            let mut mine = Vec::with_capacity(full.len() / world); // [parts, bs, KVH / world * D]
            for p in 0..parts {
                for t in 0..bs {
                    let at = ((p * bs + t) * world + r) * row;
                    mine.extend_from_slice(&full[at..at + row]);
                }
            }
            let model = self.tp.rank(r).ok_or("rank out of range")?;
            kv.write_block(model.backend(), block, &mine)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl<B: Backend> ForwardModel for TensorParallelRunner<B> {
    fn vocab_size(&self) -> usize {
        self.tp.rank(0).map_or(0, |m| m.config().vocab_size)
    }

    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.tp
            .forward(&mut self.kvs, chunks)
            .map_err(|e| e.to_string())
    }

    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        Some(self)
    }
}

impl<B: Backend> KvBlockIo for TensorParallelRunner<B> {
    fn kv_layout(&self) -> KvLayout {
        let (layers, block_size, dtype) = self.kvs.first().map_or((0, 0, "f32"), |kv| {
            (
                kv.num_layers(),
                kv.block_size(),
                super::kv_io::dtype_name(kv.dtype()),
            )
        });
        let c = self.tp.rank(0).map(|m| m.config());
        KvLayout {
            layers: layers as u32,
            kv_heads: c.map_or(0, |c| c.num_key_value_heads * self.tp.world()) as u32,
            head_dim: c.map_or(0, |c| c.head_dim) as u32,
            block_size: block_size as u32,
            dtype: dtype.into(),
        }
    }

    fn read_block(&mut self, block: u32, tokens: usize) -> Result<Vec<u8>, String> {
        let full = self.gather(block)?;
        if tokens >= self.kvs.first().map_or(1, KvCache::block_size) {
            return Ok(full);
        }
        Ok(tail_rows(&self.kv_layout(), &full, tokens))
    }

    fn write_block(&mut self, block: u32, tokens: usize, bytes: &[u8]) -> Result<(), String> {
        let bs = self.kvs.first().map_or(1, KvCache::block_size);
        if tokens >= bs {
            return self.scatter(block, bytes);
        }
        let mut full = self.gather(block)?;
        merge_tail_rows(&self.kv_layout(), &mut full, bytes, tokens)?;
        self.scatter(block, &full)
    }
}

#[cfg(test)]
#[path = "tensor_parallel_tests.rs"]
mod tests;
