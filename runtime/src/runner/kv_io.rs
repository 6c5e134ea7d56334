//! The checkpoint store's [`KvBlockIo`] for [`LlamaRunner`]: KV block bytes through
//! `KvCache::read_block` / `write_block`, partial tail blocks sliced per layer; many whole blocks
//! at once through the backend's `KvStager` (`KvCache::stage_blocks` / `write_blocks`: on a GPU
//! one gather kernel and one asynchronous copy to pinned memory, and the reverse).
//!
//! Design: the store knows bytes, not models; the runner, which owns the model and its paged KV
//! cache, says how a block's bytes are laid out (`[layers, 2 (K, V), block_size, KVH * D]`, an
//! e4m3 cache's slots grouped within each part) and copies them; a partial block's bytes are
//! `engine::checkpointing::kv_tail`'s.

use super::{LlamaRunner, RunnerBackend};
use crate::backend::DType;
use crate::checkpoint::driver::{KvBlockIo, StagedBlocks};
use crate::checkpoint::snapshot::KvLayout;
use crate::engine::checkpointing::kv_tail::{merge_tail_rows, tail_rows};

pub(super) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U32 => "u32",
        DType::I32 => "i32",
        DType::F8E4M3 => crate::engine::checkpointing::kv_tail::E4M3_GROUPED,
    }
}

impl<B: RunnerBackend> KvBlockIo for LlamaRunner<B> {
    fn kv_layout(&self) -> KvLayout {
        let c = self.model.config();
        KvLayout {
            layers: self.kv.num_layers() as u32,
            kv_heads: c.num_key_value_heads as u32,
            head_dim: c.head_dim as u32,
            block_size: self.kv.block_size() as u32,
            dtype: dtype_name(self.kv.dtype()).into(),
        }
    }

    fn read_block(&mut self, block: u32, tokens: usize) -> std::result::Result<Vec<u8>, String> {
        let full = self
            .kv
            .read_block(self.model.backend(), block)
            .map_err(|e| e.to_string())?;
        if tokens >= self.kv.block_size() {
            return Ok(full);
        }
        Ok(tail_rows(&self.kv_layout(), &full, tokens))
    }

    fn read_blocks(
        &mut self,
        blocks: &[u32],
    ) -> std::result::Result<Box<dyn StagedBlocks>, String> {
        self.kv
            .stage_blocks(self.model.backend(), blocks)
            .map_err(|e| e.to_string())
    }

    fn write_blocks(&mut self, blocks: &[u32], bytes: &[u8]) -> std::result::Result<(), String> {
        self.kv
            .write_blocks(self.model.backend(), blocks, bytes)
            .map_err(|e| e.to_string())
    }

    fn write_block(
        &mut self,
        block: u32,
        tokens: usize,
        bytes: &[u8],
    ) -> std::result::Result<(), String> {
        let bs = self.kv.block_size();
        if tokens >= bs {
            return self
                .kv
                .write_block(self.model.backend(), block, bytes)
                .map_err(|e| e.to_string());
        }
        let mut full = self
            .kv
            .read_block(self.model.backend(), block)
            .map_err(|e| e.to_string())?;
        merge_tail_rows(&self.kv_layout(), &mut full, bytes, tokens)?;
        self.kv
            .write_block(self.model.backend(), block, &full)
            .map_err(|e| e.to_string())
    }
}
