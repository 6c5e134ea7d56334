//! The checkpoint store's [`KvBlockIo`] for [`LlamaRunner`]: KV block bytes through
//! `KvCache::read_block` / `write_block`, partial tail blocks sliced per layer; many whole blocks
//! at once through the backend's `KvStager` (`KvCache::stage_blocks` / `write_blocks`: on a GPU
//! one gather kernel and one asynchronous copy to pinned memory, and the reverse).
//!
//! Design: the store knows bytes, not models; the runner, which owns the model and its paged KV
//! cache, says how a block's bytes are laid out (`[layers, 2 (K, V), block_size, KVH * D]`) and
//! copies them.

use super::{LlamaRunner, RunnerBackend};
use crate::backend::DType;
use crate::checkpoint::driver::{KvBlockIo, StagedBlocks};
use crate::checkpoint::snapshot::KvLayout;

pub(super) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U32 => "u32",
        DType::I32 => "i32",
        DType::F8E4M3 => "f8e4m3",
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
        Ok(tail_of(
            full,
            2 * self.kv.num_layers(),
            self.kv.block_size(),
            tokens,
        ))
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
        merge_tail(&mut full, bytes, 2 * self.kv.num_layers(), bs, tokens)?;
        self.kv
            .write_block(self.model.backend(), block, &full)
            .map_err(|e| e.to_string())
    }
}

/// The first `tokens` token rows of each of the `parts` parts (every layer's K, then V, each
/// `[block_size, KVH * D]`) of a whole block's bytes `full`: what a checkpoint stores of a
/// partial tail block.
pub(super) fn tail_of(full: Vec<u8>, parts: usize, block_size: usize, tokens: usize) -> Vec<u8> {
    if tokens >= block_size {
        return full;
    }
    let part = full.len() / parts.max(1);
    let keep = part / block_size * tokens;
    full.chunks(part)
        .flat_map(|p| &p[..keep])
        .copied()
        .collect()
}

/// Writes the tail bytes `bytes` of [`tail_of`] (`tokens` rows of each part) over the first rows
/// of each part of the whole block `full`.
pub(super) fn merge_tail(
    full: &mut [u8],
    bytes: &[u8],
    parts: usize,
    block_size: usize,
    tokens: usize,
) -> std::result::Result<(), String> {
    let part = full.len() / parts.max(1);
    let keep = part / block_size * tokens;
    if bytes.len() != keep * parts {
        return Err(format!(
            "tail of {tokens} tokens is {} bytes, expected {}",
            bytes.len(),
            keep * parts
        ));
    }
    for (dst, src) in full.chunks_mut(part).zip(bytes.chunks(keep.max(1))) {
        dst[..keep].copy_from_slice(src);
    }
    Ok(())
}
