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
//! read ([`KvBlockIo::read_blocks`](crate::checkpoint::driver::KvBlockIo::read_blocks): on a GPU one gather kernel on the compute stream and one
//! asynchronous copy to pinned memory on a side stream), so its blocks are freed and it leaves the
//! batch at once while the copy overlaps the next steps; the newest swap stays staged until the
//! next swap (then its bytes move to the pool's host memory, freeing the staging slot) or its swap
//! in, which writes all its blocks in one staged write ([`KvBlockIo::write_blocks`](crate::checkpoint::driver::KvBlockIo::write_blocks)). A checkpoint lists swapped sequences as
//! waiting without KV, so a resume recomputes them (see `engine/checkpointing/core_io.rs`).
//!
//! The pool has two tiers: host memory (`KvPolicy::swap_blocks`) and, when configured, a file in
//! the run directory (`KvPolicy::spill_blocks`, [`super::swap_spill`]). A victim goes whole to the
//! host tier when it fits there, else whole to the file (written at once, block by block, so its
//! bytes never wait in memory), else it is recomputed. The pool itself is [`super::swap`]'s.
//!
//! [`KvBlockIo`]: crate::checkpoint::driver::KvBlockIo

use super::core::EngineCore;
use super::error::EngineError;
use super::forward::ForwardModel;
use super::sequence::Sequence;
use super::swap::{SwapKv, Swapped};
use super::swap_spill::SpillFile;

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
