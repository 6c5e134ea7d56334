//! Paged KV block manager: a fixed pool of `block_size`-token blocks, a free list and reference
//! counts (a block may be shared by forked sequences and returns to the pool when its last holder
//! frees it).
//!
//! Design: vLLM's block manager without prefix caching. Every mutation checks that the whole
//! request fits before it commits anything, so a step never leaves a half-grown batch behind; the
//! engine's `kv_blocks_used` slot is [`BlockManager::used`].

use thiserror::Error;

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
    /// Free block ids; popped from the end (initially lowest ids first).
    free: Vec<u32>,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks currently free.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.total() - self.free.len()
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
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        for (table, tokens) in tables.iter_mut() {
            for _ in 0..self.extra_blocks(table.len(), *tokens) {
                // Cannot fail: the total was checked above.
                if let Some(b) = self.free.pop() {
                    self.ref_counts[b as usize] = 1;
                    table.push(b);
                }
            }
        }
        Ok(())
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
                    self.free.push(b);
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

    proptest! {
        /// Random grows and releases keep the pool consistent: every block is either free with count 0
        /// or held with a count equal to the number of tables listing it.
        #[test]
        fn pool_stays_consistent(ops in proptest::collection::vec((0usize..6, 0usize..40, any::<bool>()), 1..200)) {
            let mut m = BlockManager::new(12, 4);
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
