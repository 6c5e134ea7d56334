//! Prefix caching: the content address of a full KV block and each sequence's chain of them.
//!
//! Design: vLLM's automatic prefix caching. A full block of `block_size` tokens is named by
//! BLAKE3 over (the cache salt, the parent block's hash, the block's token ids): the salt names the
//! model, its KV layout and the machine's block size, so equal hashes mean equal KV bytes on one
//! engine. The block manager ([`super::blocks`]) maps hashes to physical blocks; this file only
//! computes names. A sequence's KV is read from cached blocks for whole blocks only, and never for
//! the block holding its last prompt token (that token must run to give logits), so a shared block
//! is never written.

/// The content address of one full KV block.
pub type BlockHash = [u8; 32];

/// What is mixed into every block hash: the model, the KV layout, the block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheSalt(pub [u8; 32]);

impl CacheSalt {
    /// A salt naming `parts` (e.g. the model's name and shape, the machine, the block size).
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"sov prefix cache v1");
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Self(*h.finalize().as_bytes())
    }
}

/// The hash of a full block holding `tokens`, after the block named `parent` (None: the first).
pub fn block_hash(salt: &CacheSalt, parent: Option<&BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(&salt.0);
    h.update(parent.unwrap_or(&[0u8; 32]));
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// One sequence's prefix-cache state: the hashes of its full blocks computed so far and how many
/// leading blocks of its current block table are registered with the block manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixState {
    /// Hash chain of the sequence's full blocks, in order (independent of physical blocks).
    pub hashes: Vec<BlockHash>,
    /// Leading blocks of the block table already offered to the cache (reset when the KV is dropped).
    pub registered: usize,
}

impl PrefixState {
    /// Extends the chain to cover the first `blocks` full blocks of `tokens` (as many as exist).
    pub fn extend(&mut self, salt: &CacheSalt, tokens: &[u32], block_size: usize, blocks: usize) {
        let blocks = blocks.min(tokens.len() / block_size.max(1));
        while self.hashes.len() < blocks {
            let i = self.hashes.len();
            let h = block_hash(
                salt,
                self.hashes.last(),
                &tokens[i * block_size..(i + 1) * block_size],
            );
            self.hashes.push(h);
        }
    }
}

/// Full blocks of a `len`-token sequence whose KV may come from the cache: all whole blocks
/// before the one holding its last token (which must run to give the next token's logits).
pub fn cacheable_blocks(len: usize, block_size: usize) -> usize {
    len.saturating_sub(1) / block_size.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_name_content_and_position() {
        let salt = CacheSalt::of(&[b"model-a", &16u64.to_le_bytes()]);
        let a: Vec<u32> = (0..48).collect();
        let mut b = a.clone();
        b[20] = 999; // second block differs
        let (mut pa, mut pb) = (PrefixState::default(), PrefixState::default());
        pa.extend(&salt, &a, 16, 10);
        pb.extend(&salt, &b, 16, 10);
        assert_eq!((pa.hashes.len(), pb.hashes.len()), (3, 3));
        assert_eq!(pa.hashes[0], pb.hashes[0]);
        assert_ne!(pa.hashes[1], pb.hashes[1]);
        // The third blocks hold equal tokens but follow different parents.
        assert_ne!(pa.hashes[2], pb.hashes[2]);
        // Another model (salt) never shares.
        let other = CacheSalt::of(&[b"model-b", &16u64.to_le_bytes()]);
        assert_ne!(block_hash(&other, None, &a[..16]), pa.hashes[0]);
        // Extending is incremental and stable.
        let mut p = PrefixState::default();
        p.extend(&salt, &a, 16, 1);
        p.extend(&salt, &a, 16, 3);
        assert_eq!(p.hashes, pa.hashes);
    }

    #[test]
    fn the_block_of_the_last_token_is_never_cacheable() {
        assert_eq!(cacheable_blocks(0, 16), 0);
        assert_eq!(cacheable_blocks(16, 16), 0);
        assert_eq!(cacheable_blocks(17, 16), 1);
        assert_eq!(cacheable_blocks(32, 16), 1);
        assert_eq!(cacheable_blocks(33, 16), 2);
    }
}
