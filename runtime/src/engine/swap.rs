//! The swap pool: sequences swapped out under KV pressure, with their blocks' bytes, in two
//! tiers -- host memory (`KvPolicy::swap_blocks`) and, when configured, a file in the run
//! directory (`KvPolicy::spill_blocks`, [`super::swap_spill`]). A victim goes whole to the host
//! tier when it fits there, else whole to the file (written at once, block by block, so its bytes
//! never wait in memory); first in, first out.
//!
//! Design: a bounded queue the core's swap actions (`swap_actions`) push to and pop from; the
//! newest swap's bytes may still be staged on the device (a [`StagedBlocks`] read in flight) until
//! the next swap or its swap-in settles them.

use std::collections::VecDeque;

use super::sequence::Sequence;
use super::swap_spill::SpillFile;
use crate::checkpoint::driver::StagedBlocks;

/// A sequence in the swap pool with its blocks' bytes, in block-table order.
pub struct Swapped {
    /// The sequence (block table empty; `computed` tokens of KV are in `kv`).
    pub seq: Sequence,
    /// Its first `computed.div_ceil(block_size)` blocks.
    pub n_blocks: usize,
    /// Their bytes, concatenated.
    pub kv: SwapKv,
    /// Blocks it takes of the host tier (`n_blocks`, or 0 when spilled or lost at swap-out).
    pub(super) host_blocks: usize,
}

/// Where a swapped sequence's block bytes are.
pub enum SwapKv {
    /// Still on their way to the host (a staged read).
    Staged(Box<dyn StagedBlocks>),
    /// In host memory.
    Host(Vec<u8>),
    /// In the swap file, at these slots (block-table order).
    File(Vec<u32>),
    /// Lost (a failed copy): the sequence is recomputed when it comes back.
    Lost,
}

impl std::fmt::Debug for Swapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Swapped({}, {} blocks)", self.seq.id, self.n_blocks)
    }
}

impl SwapKv {
    /// Moves staged bytes into host memory (waiting for their copy), giving the staging back.
    fn settle(&mut self) {
        if let SwapKv::Staged(h) = self {
            *self = match h.wait() {
                Ok(b) => SwapKv::Host(b.to_vec()),
                Err(e) => {
                    tracing::warn!("swap: copying KV to the host failed ({e}); will recompute");
                    SwapKv::Lost
                }
            };
        }
    }
}

/// The bounded pool of swapped-out sequences, oldest first: host memory, then the swap file.
#[derive(Debug, Default)]
pub struct SwapPool {
    /// Most blocks in host memory.
    capacity: usize,
    /// Blocks in host memory (or staged on their way there).
    used: usize,
    /// The file tier (None: not configured, or not opened yet; see [`SwapPool::set_spill`]).
    spill: Option<SpillFile>,
    seqs: VecDeque<Swapped>,
}

impl SwapPool {
    /// A pool holding at most `capacity` blocks in host memory.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            used: 0,
            spill: None,
            seqs: VecDeque::new(),
        }
    }

    /// Adds a file tier (no-op when the pool has one).
    pub fn set_spill(&mut self, spill: SpillFile) {
        if self.spill.is_none() {
            self.spill = Some(spill);
        }
    }

    /// Whether the pool has a file tier.
    pub fn has_spill(&self) -> bool {
        self.spill.is_some()
    }

    /// Blocks the pool holds now, both tiers.
    pub fn used(&self) -> usize {
        self.used + self.spilled()
    }

    /// Blocks in the swap file now.
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, SpillFile::used)
    }

    /// Whether `blocks` more blocks fit in host memory.
    fn host_fits(&self, blocks: usize) -> bool {
        self.used + blocks <= self.capacity
    }

    /// Whether `blocks` more blocks fit, in host memory or else in the file.
    pub fn can_hold(&self, blocks: usize) -> bool {
        self.host_fits(blocks)
            || self
                .spill
                .as_ref()
                .is_some_and(|f| blocks <= f.free_count())
    }

    /// Whether no sequence is swapped out.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Swapped sequences, oldest first.
    pub fn sequences(&self) -> impl Iterator<Item = &Sequence> {
        self.seqs.iter().map(|s| &s.seq)
    }

    /// The sequence that comes back first.
    pub fn front(&self) -> Option<&Sequence> {
        self.seqs.front().map(|s| &s.seq)
    }

    /// Adds `s`: to host memory when it fits, else to the file (its bytes written now). Returns
    /// the blocks written to the file (0: host memory); a failed write leaves it `Lost`.
    pub(super) fn push(&mut self, mut s: Swapped) -> usize {
        let mut spilled = 0;
        s.host_blocks = 0;
        if self.host_fits(s.n_blocks) {
            s.host_blocks = s.n_blocks;
            self.used += s.n_blocks;
        } else if let Some(f) = &mut self.spill {
            let n = s.n_blocks;
            s.kv = match s.kv {
                SwapKv::Staged(mut h) => {
                    match h
                        .wait()
                        .and_then(|b| f.write(b, n).map_err(|e| e.to_string()))
                    {
                        Ok(slots) => {
                            spilled = n;
                            SwapKv::File(slots)
                        }
                        Err(e) => {
                            tracing::warn!(
                                "swap: writing KV to the swap file failed ({e}); will recompute"
                            );
                            SwapKv::Lost
                        }
                    }
                }
                other => other,
            };
        } else {
            // Callers check can_hold; should they not, the sequence is recomputed on return.
            s.kv = SwapKv::Lost;
        }
        self.seqs.push_back(s);
        spilled
    }

    /// Gives back `s`'s place in the pool (its host blocks, its file slots).
    fn release(&mut self, s: &Swapped) {
        self.used -= s.host_blocks;
        if let (SwapKv::File(slots), Some(f)) = (&s.kv, &mut self.spill) {
            f.release(slots);
        }
    }

    pub(super) fn pop_front(&mut self) -> Option<Swapped> {
        let mut s = self.seqs.pop_front()?;
        self.used -= s.host_blocks;
        s.host_blocks = 0;
        Some(s)
    }

    /// Reads a popped sequence's spilled bytes back (freeing its file slots): `File` becomes
    /// `Host`, or `Lost` when the read fails.
    pub(super) fn unspill(&mut self, kv: &mut SwapKv) {
        let SwapKv::File(slots) = kv else {
            return;
        };
        let read = match &mut self.spill {
            Some(f) => {
                let r = f.read(slots).map_err(|e| e.to_string());
                f.release(slots);
                r
            }
            None => Err("the swap file is gone".to_string()),
        };
        *kv = match read {
            Ok(v) => SwapKv::Host(v),
            Err(e) => {
                tracing::warn!("swap_in: reading the swap file failed ({e}); will recompute");
                SwapKv::Lost
            }
        };
    }

    /// Moves every staged swap's bytes into host memory.
    pub(super) fn settle_all(&mut self) {
        for s in &mut self.seqs {
            s.kv.settle();
        }
    }

    /// Takes every swapped sequence out (oldest first), dropping their bytes.
    pub fn take_all(&mut self) -> Vec<Sequence> {
        let all: Vec<Swapped> = self.seqs.drain(..).collect();
        for s in &all {
            self.release(s);
        }
        all.into_iter().map(|s| s.seq).collect()
    }

    /// Removes swapped sequence `id`, if there.
    pub fn remove(&mut self, id: u64) -> Option<Sequence> {
        let i = self.seqs.iter().position(|s| s.seq.id == id)?;
        let s = self.seqs.remove(i)?;
        self.release(&s);
        Some(s.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::codec::ByteCodec;
    use crate::engine::intake::{IntakeLimits, build_sequence};
    use crate::engine::{Prompt, Request};

    fn swapped(id: u64, blocks: usize) -> Swapped {
        let limits = IntakeLimits {
            context_len: 64,
            vocab_size: 300,
            num_blocks: 8,
            block_size: 4,
            max_tokens_cap: 8,
        };
        let req = Request::new(Prompt::Tokens(vec![1, 2, 3]), 2);
        let (tx, _) = std::sync::mpsc::channel();
        Swapped {
            seq: build_sequence(id, req, &ByteCodec, &limits, tx).unwrap(),
            n_blocks: blocks,
            kv: SwapKv::Host(vec![0u8; 8 * blocks]),
            host_blocks: 0,
        }
    }

    #[test]
    fn the_pool_is_bounded_and_first_in_first_out() {
        let mut pool = SwapPool::new(3);
        assert!(pool.can_hold(3) && !pool.can_hold(4) && pool.is_empty());
        pool.push(swapped(1, 2));
        pool.push(swapped(2, 1));
        assert_eq!(pool.used(), 3);
        assert!(pool.can_hold(0) && !pool.can_hold(1));
        assert_eq!(pool.front().map(|s| s.id), Some(1));
        assert_eq!(pool.pop_front().map(|s| s.seq.id), Some(1));
        assert_eq!(pool.used(), 1);
        pool.push(swapped(3, 2));
        assert_eq!(pool.remove(2).map(|s| s.id), Some(2));
        assert!(pool.remove(2).is_none());
        assert_eq!(pool.used(), 2);
        let ids: Vec<u64> = pool.take_all().iter().map(|s| s.id).collect();
        assert_eq!((ids, pool.used(), pool.is_empty()), (vec![3], 0, true));
    }
}
