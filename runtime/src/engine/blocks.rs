//! Paged KV block manager: a fixed pool of `block_size`-token blocks, a free list, reference
//! counts (a block may be shared by sequences and returns to the pool when its last holder frees
//! it) and the prefix cache's map from block hashes to blocks.
//!
//! Design: vLLM's block manager with automatic prefix caching. A full block offered with its
//! content hash ([`BlockManager::register`]) stays named by it; when its last holder frees it, it
//! keeps its KV and waits in an LRU list, so a later request with the same prefix takes it back
//! ([`BlockManager::lookup`], [`BlockManager::acquire`]). Allocation takes truly free blocks first,
//! then evicts the least recently released cached block: cached blocks count as free, so they go
//! before any preemption. Every mutation checks that the whole request fits before it commits
//! anything, so a step never leaves a half-grown batch behind; the engine's `kv_blocks_used` slot
//! is [`BlockManager::used`] (blocks some sequence holds).

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

use super::prefix_cache::BlockHash;

/// Not enough free blocks for an allocation; nothing was allocated.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("KV cache out of blocks: need {needed}, {free} free")]
pub struct OutOfBlocks {
    /// Blocks the allocation needed.
    pub needed: usize,
    /// Blocks that were free.
    pub free: usize,
}

/// The pool of KV blocks.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    /// Holders of each block, `[num_blocks]`; 0 means free.
    ref_counts: Vec<u32>,
    /// Free block ids holding nothing cached; popped from the end (initially lowest ids first).
    free: Vec<u32>,
    /// Whether full blocks are kept by hash after their last holder frees them.
    caching: bool,
    /// The hash naming each cached block, `[num_blocks]` (None: not in the cache).
    hash_of: Vec<Option<BlockHash>>,
    /// Cached blocks by hash.
    by_hash: HashMap<BlockHash, u32>,
    /// Cached blocks nobody holds, by the tick they were released (oldest first): evictable.
    lru: BTreeMap<u64, u32>,
    /// The tick each block entered `lru`, `[num_blocks]`.
    lru_tick: Vec<u64>,
    tick: u64,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            caching: false,
            hash_of: vec![None; num_blocks],
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; num_blocks],
            tick: 0,
        }
    }

    /// The same pool with prefix caching on or off (see [`BlockManager::register`]).
    pub fn with_prefix_cache(mut self, on: bool) -> Self {
        self.caching = on;
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks an allocation may take: free ones plus cached ones nobody holds (evicted on demand).
    pub fn free_count(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.total() - self.free_count()
    }

    /// Blocks in the prefix cache (held or not).
    pub fn cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// New blocks a table of `table_len` blocks needs to hold `tokens` tokens.
    pub fn extra_blocks(&self, table_len: usize, tokens: usize) -> usize {
        self.blocks_for(tokens).saturating_sub(table_len)
    }

    /// Holders of `block` (0 when free or out of range).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_counts.get(block as usize).copied().unwrap_or(0)
    }

    /// Grows every `(table, tokens)` pair so its table holds `tokens` tokens. Checks the total first:
    /// either all tables grow or none does.
    pub fn grow_all(&mut self, tables: &mut [(&mut Vec<u32>, usize)]) -> Result<(), OutOfBlocks> {
        let needed: usize = tables
            .iter()
            .map(|(t, n)| self.extra_blocks(t.len(), *n))
            .sum();
        if needed > self.free_count() {
            return Err(OutOfBlocks {
                needed,
                free: self.free_count(),
            });
        }
        for (table, tokens) in tables.iter_mut() {
            for _ in 0..self.extra_blocks(table.len(), *tokens) {
                // Cannot fail: the total was checked above.
                if let Some(b) = self.take_block() {
                    table.push(b);
                }
            }
        }
        Ok(())
    }

    /// One block for a new holder: a free one, else the least recently released cached one
    /// (forgetting its hash).
    fn take_block(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// Names full block `block` by `hash` in the prefix cache (its KV holds exactly the tokens the
    /// hash names). No-op when caching is off, when the block is already named, or when another
    /// block already has this hash (this one stays private and is freed as usual).
    pub fn register(&mut self, block: u32, hash: BlockHash) {
        let Some(slot) = self.hash_of.get(block as usize) else {
            return;
        };
        if !self.caching || slot.is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.hash_of[block as usize] = Some(hash);
        self.by_hash.insert(hash, block);
    }

    /// The cached blocks of the longest prefix of `hashes` (a chain), in order.
    pub fn lookup(&self, hashes: &[BlockHash]) -> Vec<u32> {
        hashes
            .iter()
            .map_while(|h| self.by_hash.get(h).copied())
            .collect()
    }

    /// Of `blocks` (from [`BlockManager::lookup`]), how many nobody holds now: taking them uses up
    /// that much of [`BlockManager::free_count`].
    pub fn idle_among(&self, blocks: &[u32]) -> usize {
        blocks.iter().filter(|&&b| self.ref_count(b) == 0).count()
    }

    /// Another holder for each of `blocks` (cached blocks found by [`BlockManager::lookup`]);
    /// returns them as the start of a block table.
    pub fn acquire(&mut self, blocks: &[u32]) -> Vec<u32> {
        for &b in blocks {
            let rc = &mut self.ref_counts[b as usize];
            if *rc == 0 {
                self.lru.remove(&self.lru_tick[b as usize]);
            }
            *rc += 1;
        }
        blocks.to_vec()
    }

    /// Grows one table to hold `tokens` tokens (all or nothing).
    pub fn grow(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<(), OutOfBlocks> {
        self.grow_all(&mut [(table, tokens)])
    }

    /// Another holder for every block of `table` (a fork shares its parent's blocks).
    pub fn share(&mut self, table: &[u32]) -> Vec<u32> {
        for &b in table {
            self.ref_counts[b as usize] += 1;
        }
        table.to_vec()
    }

    /// Releases the blocks of `table` beyond those needed for `tokens` tokens (speculative positions
    /// that were not accepted).
    pub fn shrink(&mut self, table: &mut Vec<u32>, tokens: usize) {
        let keep = self.blocks_for(tokens);
        if table.len() > keep {
            let mut tail = table.split_off(keep);
            self.release(&mut tail);
        }
    }

    /// Drops this holder of every block in `table` and empties it; blocks nobody holds return to the pool.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..).rev() {
            let rc = &mut self.ref_counts[b as usize];
            if *rc > 0 {
                *rc -= 1;
                if *rc == 0 {
                    if self.hash_of[b as usize].is_some() {
                        self.tick += 1;
                        self.lru_tick[b as usize] = self.tick;
                        self.lru.insert(self.tick, b);
                    } else {
                        self.free.push(b);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grow_and_release() {
        let mut m = BlockManager::new(4, 16);
        let mut a = Vec::new();
        m.grow(&mut a, 17).unwrap();
        assert_eq!((a.len(), m.used()), (2, 2));
        m.grow(&mut a, 32).unwrap();
        assert_eq!(a.len(), 2, "32 tokens fit in 2 blocks");
        let mut b = Vec::new();
        assert_eq!(m.grow(&mut b, 49), Err(OutOfBlocks { needed: 4, free: 2 }));
        assert!(
            b.is_empty() && m.used() == 2,
            "a failed grow allocates nothing"
        );
        m.shrink(&mut a, 10);
        assert_eq!((a.len(), m.used()), (1, 1));
        m.release(&mut a);
        assert_eq!(m.used(), 0);
        m.grow(&mut b, 49).unwrap();
        assert_eq!(m.used(), 4);
    }

    #[test]
    fn grow_all_is_all_or_nothing() {
        let mut m = BlockManager::new(3, 4);
        let (mut a, mut b) = (vec![], vec![]);
        m.grow(&mut a, 4).unwrap();
        m.grow(&mut b, 4).unwrap();
        // Both need one more block; only one is free.
        let err = m.grow_all(&mut [(&mut a, 5), (&mut b, 5)]);
        assert_eq!(err, Err(OutOfBlocks { needed: 2, free: 1 }));
        assert_eq!((a.len(), b.len(), m.used()), (1, 1, 2));
    }

    #[test]
    fn shared_blocks_free_with_last_holder() {
        let mut m = BlockManager::new(4, 4);
        let mut a = vec![];
        m.grow(&mut a, 8).unwrap();
        let mut b = m.share(&a);
        assert_eq!(m.ref_count(a[0]), 2);
        m.release(&mut a);
        assert_eq!(m.used(), 2);
        m.release(&mut b);
        assert_eq!(m.used(), 0);
    }

    fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    #[test]
    fn cached_blocks_outlive_their_holders_until_evicted_oldest_first() {
        let mut m = BlockManager::new(4, 4).with_prefix_cache(true);
        let mut a = vec![];
        m.grow(&mut a, 12).unwrap();
        for (i, &b) in a.iter().enumerate() {
            m.register(b, h(i as u8));
        }
        let blocks = a.clone();
        m.release(&mut a);
        // Nobody holds them, yet they keep their names and count as free.
        assert_eq!((m.used(), m.free_count(), m.cached()), (0, 4, 3));
        assert_eq!(m.lookup(&[h(0), h(1), h(9)]), blocks[..2].to_vec());
        assert_eq!(m.idle_among(&blocks[..2]), 2);
        let mut b = m.acquire(&blocks[..2]);
        assert_eq!(
            (m.used(), m.free_count(), m.ref_count(blocks[0])),
            (2, 2, 1)
        );
        // Growing b by two blocks takes the free one, then evicts the only idle cached block.
        m.grow(&mut b, 16).unwrap();
        assert_eq!(m.used(), 4);
        assert_eq!(m.lookup(&[h(0), h(1), h(2)]), blocks[..2].to_vec());
        assert_eq!(m.cached(), 2, "block 2's name went with its eviction");
        // A duplicate hash leaves the second block private: freed outright.
        m.register(b[2], h(0));
        let mut tail = b.split_off(2);
        m.release(&mut tail);
        assert_eq!((m.free_count(), m.cached()), (2, 2));
        // With caching off nothing is ever named.
        let mut off = BlockManager::new(2, 4);
        let mut t = vec![];
        off.grow(&mut t, 4).unwrap();
        off.register(t[0], h(0));
        assert!(off.lookup(&[h(0)]).is_empty());
    }

    proptest! {
        /// Random grows and releases keep the pool consistent: every block is either free with count 0
        /// or held with a count equal to the number of tables listing it.
        #[test]
        fn pool_stays_consistent(ops in proptest::collection::vec((0usize..6, 0usize..40, any::<bool>()), 1..200), caching in any::<bool>()) {
            let mut m = BlockManager::new(12, 4).with_prefix_cache(caching);
            let mut tables: Vec<(Vec<u32>, usize)> = vec![(vec![], 0); 6];
            for (i, tokens, release) in ops {
                if release {
                    m.release(&mut tables[i].0);
                    tables[i].1 = 0;
                } else {
                    let want = tables[i].1 + tokens;
                    let before = m.used();
                    match m.grow(&mut tables[i].0, want) {
                        Ok(()) => tables[i].1 = want,
                        Err(_) => prop_assert_eq!(m.used(), before),
                    }
                    // Name the table's first block by its table (the same hash for equal tokens).
                    if let Some(&b) = tables[i].0.first() {
                        m.register(b, [i as u8; 32]);
                    }
                    // Another table may start from a cached block.
                    let j = (i + 1) % 6;
                    if tables[j].0.is_empty() {
                        let found = m.lookup(&[[i as u8; 32]]);
                        tables[j].0 = m.acquire(&found);
                        tables[j].1 = 4 * found.len();
                    }
                }
                let mut holders = [0u32; 12];
                for (t, n) in &tables {
                    prop_assert!(t.len() * 4 >= *n);
                    for &b in t { holders[b as usize] += 1; }
                }
                for b in 0..12u32 {
                    prop_assert_eq!(m.ref_count(b), holders[b as usize]);
                }
                prop_assert_eq!(m.used() + m.free_count(), 12);
            }
        }
    }
}
