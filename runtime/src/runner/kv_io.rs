//! The checkpoint store's [`KvBlockIo`] for [`LlamaRunner`]: KV block bytes through
//! `KvCache::read_block` / `write_block`, partial tail blocks sliced per layer.
//!
//! Design: the store knows bytes, not models; the runner, which owns the model and its paged KV
//! cache, says how a block's bytes are laid out (`[layers, 2 (K, V), block_size, KVH * D]`) and
//! copies them.

use super::{LlamaRunner, RunnerBackend};
use crate::backend::DType;
use crate::checkpoint::driver::KvBlockIo;
use crate::checkpoint::snapshot::KvLayout;

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U32 => "u32",
        DType::I32 => "i32",
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
        let bs = self.kv.block_size();
        if tokens >= bs {
            return Ok(full);
        }
        // full: [layers, 2 (K, V), block_size, KVH * D] -> keep the first `tokens` rows of each part.
        let part = full.len() / (2 * self.kv.num_layers()).max(1);
        let keep = part / bs * tokens;
        Ok(full
            .chunks(part)
            .flat_map(|p| &p[..keep])
            .copied()
            .collect())
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
        let parts = 2 * self.kv.num_layers();
        let part = full.len() / parts.max(1);
        let keep = part / bs * tokens;
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
        self.kv
            .write_block(self.model.backend(), block, &full)
            .map_err(|e| e.to_string())
    }
}
