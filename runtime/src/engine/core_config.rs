//! The limits an engine core runs under: KV blocks and their size, batch and prefill budgets,
//! context and output caps, end-of-sequence ids and the KV policy.
//!
//! Design: plain data, set once at start-up (`handle`) and read by the core and by the per-token
//! step (`advance`), which both import it.

use super::kv_policy::KvPolicy;

/// Limits the core runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreConfig {
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// Tokens per block (the machine's `block_size` constant).
    pub block_size: usize,
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most prompt tokens one prefill forward pass runs (longer prompts run in chunks).
    pub max_prefill_tokens: usize,
    /// Most tokens a sequence may hold (model context, capped by the KV cache size).
    pub context_len: usize,
    /// Cap on any request's max_tokens (the machine's `max_tokens` constant).
    pub max_tokens_cap: usize,
    /// End-of-sequence token ids.
    pub eos_ids: Vec<u32>,
    /// Prefix caching and the host swap pool.
    pub kv: KvPolicy,
}
