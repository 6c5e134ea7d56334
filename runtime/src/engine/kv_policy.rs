//! Typed settings and counters of the engine's KV memory: the prefix cache, the host swap pool
//! and its file tier, and what each did (preemptions, swaps, recomputations, cache hits).
//!
//! Design: one settings struct carried from the command line (`EngineOptions`) through
//! [`super::EngineConfig`] into the core, and one plain counter struct the core keeps and the
//! engine reports in [`super::EngineStats`] (bench output, `--json`, the server's `/metrics`).

use std::path::PathBuf;

use super::prefix_cache::CacheSalt;

/// How the engine uses KV memory beyond its block pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPolicy {
    /// Reuse the KV of full blocks of a prompt prefix computed before (on by default).
    pub prefix_cache: bool,
    /// Blocks the host swap pool holds; 0: no swapping (KV pressure preempts by recomputation).
    pub swap_blocks: usize,
    /// Blocks the swap pool's file tier holds beyond the host pool (0: none; needs `spill_path`).
    pub spill_blocks: usize,
    /// The file tier's file, in the run directory (see [`super::swap_spill`]).
    pub spill_path: Option<PathBuf>,
    /// Mixed into every block hash: names the model and its KV layout (see [`CacheSalt`]).
    pub salt: CacheSalt,
}

impl Default for KvPolicy {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            swap_blocks: 0,
            spill_blocks: 0,
            spill_path: None,
            salt: CacheSalt::default(),
        }
    }
}

/// What the KV memory paths did since the engine started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvCounters {
    /// Sequences swapped out to the host pool.
    pub swapped_out: u64,
    /// KV blocks copied to the host pool.
    pub blocks_swapped_out: u64,
    /// KV blocks copied back from the host pool.
    pub blocks_swapped_in: u64,
    /// Of the blocks swapped out, those written to the swap file (the host pool was full).
    pub blocks_spilled: u64,
    /// Sequences whose KV was dropped to be recomputed by prefill (preemption by recomputation,
    /// including swap-outs that fell back to it).
    pub recomputed: u64,
    /// Prompt (or history) tokens looked up in the prefix cache at admission.
    pub prefix_query_tokens: u64,
    /// Of those, the tokens whose KV came from cached blocks (not prefilled).
    pub prefix_hit_tokens: u64,
}
