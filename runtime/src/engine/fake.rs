//! A deterministic stand-in model for tests of scheduling logic (not of outputs): it keeps a real
//! paged "KV cache" of token ids and derives each logits row from the whole context it reads back
//! through the block table. A block-manager bug (a block freed while in use, a wrong table, a
//! position off by one) therefore changes its outputs, which the tests compare with solo runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::forward::ForwardModel;
use crate::model::batch::SeqChunk;

/// Token ids stored per KV slot; logits are a hash of the context.
#[derive(Debug)]
pub struct FakeModel {
    vocab: usize,
    block_size: usize,
    /// `[num_blocks * block_size]` token id stored in each KV slot (u32::MAX: never written).
    kv: Vec<u32>,
    /// Forward calls so far, readable from outside.
    pub calls: Arc<AtomicUsize>,
    /// Chunks of every forward call (its batch width), readable from outside.
    pub widths: Arc<std::sync::Mutex<Vec<usize>>>,
    /// Token that becomes the argmax once a sequence is `eos_after` tokens long (None: never).
    pub eos: Option<(u32, usize)>,
    /// Makes the argmax the token `period` positions back, so output repeats with that period
    /// (gives the n-gram drafter something to find).
    pub echo_period: Option<usize>,
    /// Sleep per forward call (makes a run long enough to steer from outside).
    pub delay: std::time::Duration,
}

impl FakeModel {
    pub fn new(vocab: usize, num_blocks: usize, block_size: usize) -> Self {
        Self {
            vocab,
            block_size,
            kv: vec![u32::MAX; num_blocks * block_size],
            calls: Arc::default(),
            widths: Arc::default(),
            eos: None,
            echo_period: None,
            delay: std::time::Duration::ZERO,
        }
    }
}

fn mix(h: u64, x: u64) -> u64 {
    let z = (h ^ x)
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 29)
}

impl ForwardModel for FakeModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.delay);
        if let Ok(mut w) = self.widths.lock() {
            w.push(chunks.len());
        }
        let mut logits = vec![0.0f32; chunks.len() * self.vocab]; // [chunks, vocab]
        for (c, chunk) in chunks.iter().enumerate() {
            let end = chunk.start_pos + chunk.tokens.len();
            let slot = |pos: usize| -> Result<usize, String> {
                let block = chunk
                    .block_table
                    .get(pos / self.block_size)
                    .ok_or(format!("position {pos} has no block"))?;
                Ok(*block as usize * self.block_size + pos % self.block_size)
            };
            for (i, &t) in chunk.tokens.iter().enumerate() {
                let s = slot(chunk.start_pos + i)?;
                *self.kv.get_mut(s).ok_or("slot out of range")? = t;
            }
            let mut h = 0u64;
            for pos in 0..end {
                let t = self.kv[slot(pos)?];
                if t == u32::MAX {
                    return Err(format!("position {pos} read before it was written"));
                }
                h = mix(h, u64::from(t) ^ ((pos as u64) << 32));
            }
            let row = &mut logits[c * self.vocab..(c + 1) * self.vocab];
            for (v, l) in row.iter_mut().enumerate() {
                *l = (mix(h, v as u64) >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
            }
            if let Some(p) = self.echo_period
                && end >= p
            {
                let echoed = self.kv[slot(end - p)?] as usize;
                if let Some(l) = row.get_mut(echoed) {
                    *l += 50.0;
                }
            }
            if let Some((eos, after)) = self.eos
                && end >= after
            {
                row[eos as usize] = 100.0;
            }
        }
        Ok(logits)
    }
}
