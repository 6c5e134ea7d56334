//! Swapping: under KV pressure the newest running sequence's blocks are copied to a bounded host
//! pool and freed; when blocks free up, the oldest swapped sequence is copied back into fresh
//! blocks and rejoins the batch (before any new admission). A full pool, a sequence that has not
//! finished its prefill, or a model without block access falls back to preemption by
//! recomputation.
//!
//! Design: the seed scheduler's SWAP state (`specs/scheduler.toml`): `swap_out`, `swap_in`,
//! `has_swapped`, `can_swap_in`. Block bytes move through the model's [`KvBlockIo`]
//! (`[layers, K/V, block_size, KVH, D]`, the checkpoint layout), so a swapped-in block holds
//! exactly the bytes it held: outputs are unchanged. All of a victim's blocks move in one staged
//! read ([`KvBlockIo::read_blocks`]: on a GPU one gather kernel on the compute stream and one
//! asynchronous copy to pinned memory on a side stream), so its blocks are freed and it leaves the
//! batch at once while the copy overlaps the next steps; the newest swap stays staged until the
//! next swap (then its bytes move to the pool's host memory, freeing the staging slot) or its swap
//! in, which writes all its blocks in one staged write ([`KvBlockIo::write_blocks`]). A checkpoint lists swapped sequences as
//! waiting without KV, so a resume recomputes them (see `engine/checkpointing/core_io.rs`).
//!
//! The pool has two tiers: host memory (`KvPolicy::swap_blocks`) and, when configured, a file in
//! the run directory (`KvPolicy::spill_blocks`, [`super::swap_spill`]). A victim goes whole to the
//! host tier when it fits there, else whole to the file (written at once, block by block, so its
//! bytes never wait in memory), else it is recomputed.
//!
//! [`KvBlockIo`]: crate::checkpoint::driver::KvBlockIo

use std::collections::VecDeque;

use super::core::EngineCore;
use super::error::EngineError;
use super::forward::ForwardModel;
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
    host_blocks: usize,
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
    fn push(&mut self, mut s: Swapped) -> usize {
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

    fn pop_front(&mut self) -> Option<Swapped> {
        let mut s = self.seqs.pop_front()?;
        self.used -= s.host_blocks;
        s.host_blocks = 0;
        Some(s)
    }

    /// Reads a popped sequence's spilled bytes back (freeing its file slots): `File` becomes
    /// `Host`, or `Lost` when the read fails.
    fn unspill(&mut self, kv: &mut SwapKv) {
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
    fn settle_all(&mut self) {
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

impl<F: ForwardModel> EngineCore<F> {
    /// Whether a sequence is swapped out (predicate `has_swapped`).
    pub fn has_swapped(&self) -> bool {
        !self.swap.is_empty()
    }

    /// The oldest swapped sequence fits: the batch has room and the free blocks hold its tokens
    /// plus one block per running sequence, itself included (predicate `can_swap_in`). The reserve
    /// means the next decode step cannot be short of blocks, so a sequence is never swapped back
    /// in only to be swapped out again before it decodes; an empty batch needs no reserve (a
    /// sequence as large as the whole cache still comes back).
    pub fn can_swap_in(&self) -> bool {
        let reserve = match self.running.len() {
            0 => 0,
            n => n + 1,
        };
        self.swap.front().is_some_and(|s| {
            self.running.len() < self.cfg.max_batch
                && self.blocks.blocks_for(s.tokens.len()) + reserve <= self.blocks.free_count()
        })
    }

    /// Action `swap_out`: moves the newest running sequence's KV to the swap pool (host memory,
    /// else the swap file), or preempts it by recomputation when it cannot be swapped (both tiers
    /// full, prefill unfinished, no KV access).
    pub fn swap_out(&mut self) -> Result<(), EngineError> {
        let Some(victim) = self.running.last() else {
            return Ok(());
        };
        let bs = self.cfg.block_size;
        let n = victim.computed.div_ceil(bs);
        if !self.swap.has_spill()
            && self.cfg.kv.spill_blocks > 0
            && let Some(path) = &self.cfg.kv.spill_path
        {
            self.swap
                .set_spill(SpillFile::new(path.clone(), self.cfg.kv.spill_blocks));
        }
        if !victim.prefilled || !self.swap.can_hold(n) || n > victim.block_table.len() {
            self.notes.push(if self.swap.can_hold(n) {
                "swap_out: prefill unfinished, preempt by recomputation"
            } else {
                "swap_out: swap pool full, preempt by recomputation"
            });
            self.preempt_newest();
            return Ok(());
        }
        let Some(io) = self.model.kv_io() else {
            self.notes
                .push("swap_out: no KV access, preempt by recomputation");
            self.preempt_newest();
            return Ok(());
        };
        // At most one swap stays staged: the one before this gives its staging slot back.
        self.swap.settle_all();
        let kv = match io.read_blocks(&victim.block_table[..n]) {
            Ok(b) => SwapKv::Staged(b),
            Err(e) => {
                tracing::warn!("swap_out: reading KV failed ({e}); preempting by recomputation");
                self.preempt_newest();
                return Ok(());
            }
        };
        let Some(mut seq) = self.running.pop() else {
            return Ok(());
        };
        self.blocks.release(&mut seq.block_table);
        seq.prefix.registered = 0;
        let id = seq.id;
        self.kv_counts.swapped_out += 1;
        self.kv_counts.blocks_swapped_out += n as u64;
        self.totals.preemptions += 1;
        let spilled = self.swap.push(Swapped {
            seq,
            n_blocks: n,
            kv,
            host_blocks: 0,
        });
        self.kv_counts.blocks_spilled += spilled as u64;
        tracing::debug!(
            "swap_out: sequence {id}, {n} blocks to the {}",
            if spilled > 0 {
                "swap file"
            } else {
                "host pool"
            }
        );
        Ok(())
    }

    /// Action `swap_in`: copies the oldest swapped sequence's KV into fresh blocks and returns it
    /// to the running batch (newest). Should the copy fail, it is queued for recomputation.
    pub fn swap_in(&mut self) -> Result<(), EngineError> {
        if !self.can_swap_in() {
            return Ok(());
        }
        let Some(Swapped {
            mut seq,
            n_blocks,
            mut kv,
            ..
        }) = self.swap.pop_front()
        else {
            return Ok(());
        };
        self.swap.unspill(&mut kv);
        let n = seq.tokens.len();
        if self.blocks.grow(&mut seq.block_table, n).is_err() {
            // can_swap_in checked the same numbers; recompute rather than lose the request.
            self.requeue_front_for_recompute(seq);
            return Ok(());
        }
        let bytes: Result<&[u8], String> = match &mut kv {
            SwapKv::Staged(h) => h.wait(),
            SwapKv::Host(v) => Ok(v.as_slice()),
            SwapKv::File(_) | SwapKv::Lost => Err("its KV copy failed".to_string()),
        };
        let written = match (self.model.kv_io(), bytes) {
            (Some(io), Ok(bytes)) => io.write_blocks(&seq.block_table[..n_blocks], bytes),
            (None, _) => Err("the model has no KV access".to_string()),
            (_, Err(e)) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!("swap_in: writing KV failed ({e}); recomputing the sequence");
            self.requeue_front_for_recompute(seq);
            return Ok(());
        }
        self.kv_counts.blocks_swapped_in += n_blocks as u64;
        tracing::debug!("swap_in: sequence {}, {n_blocks} blocks back", seq.id);
        self.running.push(seq);
        Ok(())
    }

    /// Drops `seq`'s KV and puts it at the front of the waiting queue (recomputed on admission).
    fn requeue_front_for_recompute(&mut self, mut seq: Sequence) {
        self.blocks.release(&mut seq.block_table);
        seq.computed = 0;
        seq.prefilled = false;
        seq.prefix.registered = 0;
        seq.preemptions += 1;
        self.kv_counts.recomputed += 1;
        self.waiting.push_front(seq);
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
