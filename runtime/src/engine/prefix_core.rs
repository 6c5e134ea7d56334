//! The engine core's side of prefix caching: name a sequence's full blocks, find and share the
//! longest cached prefix at admission, offer newly computed full blocks to the cache after every
//! forward pass, and hold back an admission whose prefix is being prefilled right now.
//!
//! Design: vLLM's automatic prefix caching over [`super::blocks::BlockManager`]'s hash map (names
//! from [`super::prefix_cache`]). A shared block is only ever read: a sequence computes from the
//! first token after its cached prefix, and the block holding its last token is never taken from
//! the cache (see [`cacheable_blocks`]), so the partial tail is always its own.

use super::core::EngineCore;
use super::forward::ForwardModel;
use super::prefix_cache::cacheable_blocks;
use super::sequence::Sequence;

impl<F: ForwardModel> EngineCore<F> {
    /// Extends `seq`'s hash chain over its cacheable full blocks (no-op with the cache off).
    pub(crate) fn hash_prefix(&self, seq: &mut Sequence) {
        if !self.cfg.kv.prefix_cache {
            return;
        }
        let bs = self.cfg.block_size;
        let blocks = cacheable_blocks(seq.tokens.len(), bs);
        seq.prefix
            .extend(&self.cfg.kv.salt, &seq.tokens, bs, blocks);
    }

    /// Cached blocks holding the longest prefix of waiting `seq` (empty with the cache off, or when
    /// the sequence already has KV).
    pub(crate) fn prefix_hit(&self, seq: &Sequence) -> Vec<u32> {
        if !self.cfg.kv.prefix_cache || seq.computed > 0 || !seq.block_table.is_empty() {
            return Vec::new();
        }
        let limit = cacheable_blocks(seq.tokens.len(), self.cfg.block_size);
        let hashes = &seq.prefix.hashes[..limit.min(seq.prefix.hashes.len())];
        self.blocks.lookup(hashes)
    }

    /// Whether `seq`'s first block after its `hit` cached ones is about to be computed by a
    /// running sequence that has not finished its prefill (then `seq` waits for it and shares it).
    pub(crate) fn prefix_in_flight(&self, seq: &Sequence, hit: usize) -> bool {
        let limit = cacheable_blocks(seq.tokens.len(), self.cfg.block_size);
        let Some(next) = seq.prefix.hashes.get(hit).filter(|_| hit < limit) else {
            return false;
        };
        self.running.iter().filter(|s| !s.prefilled).any(|s| {
            s.prefix
                .hashes
                .get(s.prefix.registered..)
                .is_some_and(|h| h.contains(next))
        })
    }

    /// Starts waiting `seq`'s block table with its cached prefix: those tokens count as computed.
    pub(crate) fn take_prefix(&mut self, seq: &mut Sequence) {
        let n = seq.tokens.len() as u64;
        let hit = self.prefix_hit(seq);
        if self.cfg.kv.prefix_cache {
            self.kv_counts.prefix_query_tokens += n;
        }
        if hit.is_empty() {
            return;
        }
        seq.block_table = self.blocks.acquire(&hit);
        seq.computed = hit.len() * self.cfg.block_size;
        seq.prefix.registered = hit.len();
        self.kv_counts.prefix_hit_tokens += seq.computed as u64;
    }

    /// Offers every running sequence's newly completed full blocks to the prefix cache.
    pub(crate) fn offer_full_blocks(&mut self) {
        if !self.cfg.kv.prefix_cache {
            return;
        }
        let bs = self.cfg.block_size;
        let salt = self.cfg.kv.salt;
        for s in self.running.iter_mut() {
            let full = (s.computed / bs).min(s.block_table.len());
            if s.prefix.registered >= full {
                continue;
            }
            s.prefix.extend(&salt, &s.tokens, bs, full);
            for i in s.prefix.registered..full.min(s.prefix.hashes.len()) {
                self.blocks.register(s.block_table[i], s.prefix.hashes[i]);
            }
            s.prefix.registered = full;
        }
    }
}
