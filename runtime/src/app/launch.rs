//! The last steps of a start, shared by a whole model and a tensor-parallel one: [`prepare`] sizes
//! the KV cache from a byte budget, takes the run directory's lock and opens the checkpoint
//! store while the weights are still on the host; [`Prepared::settle_blocks`] sizes a budget
//! given as a share of free device memory once the weights and scratch are on the device;
//! [`launch`] starts the engine thread on the model runner with the slot file, the KV policy and
//! the checkpoint hooks.
//!
//! Design: the backend-specific part of a start (`start`, `tensor_parallel`) builds the runner
//! between the two calls; nothing here knows which backend it runs on.

use std::sync::Arc;

use super::checkpoints::open_worm;
use super::options::{
    CheckpointInfo, EngineOptions, KV_AUTO_RESERVE_BYTES, KvBudget, ModelParts, Started,
    kv_bytes_per_token,
};
use super::run_dir::{RunLock, slot_path};
use super::slot_file::create_slots;
use crate::engine::EngineError;
use crate::engine::checkpointing::Worm;
use crate::engine::forward::ForwardModel;
use crate::engine::handle::{Durability, Engine, EngineConfig};
use crate::engine::hook::{CheckpointHook, RequestJournal};
use crate::engine::kv_policy::KvPolicy;
use crate::engine::prefix_cache::CacheSalt;
use crate::scheduler::Machine;

/// What a start settles before the weights move to a backend.
pub(crate) struct Prepared {
    /// Tokens per KV block (the machine's `block_size`).
    pub block_size: usize,
    /// KV bytes of one token in every layer.
    pub per_token: usize,
    /// KV blocks the budget holds: None until the device's free memory settles it
    /// ([`KvBudget::FreeDeviceMemory`], [`Prepared::settle_blocks`]).
    pub num_blocks: Option<usize>,
    /// The context cap: the option, the model's, whichever is smaller.
    pub context_len: usize,
    run_lock: Option<RunLock>,
    worm: Option<(Worm, CheckpointInfo)>,
}

impl Prepared {
    /// Rows, sequences and context [`crate::model::LlamaModel::reserve_scratch`] is sized for.
    pub fn scratch(&self, opts: &EngineOptions) -> (usize, usize, usize) {
        (
            opts.max_prefill_tokens.max(1) + opts.max_batch,
            opts.max_batch,
            match self.num_blocks {
                Some(n) => self.context_len.min(n * self.block_size),
                None => self.context_len,
            },
        )
    }

    /// Settles a [`KvBudget::FreeDeviceMemory`] budget from `free_bytes`, the device's free
    /// memory now that the weights and the scratch are in place (None: the device does not say);
    /// a byte budget was settled by [`prepare`]. Returns the block count.
    pub fn settle_blocks(
        &mut self,
        budget: KvBudget,
        free_bytes: Option<usize>,
    ) -> Result<usize, EngineError> {
        if let Some(n) = self.num_blocks {
            return Ok(n);
        }
        let KvBudget::FreeDeviceMemory(fraction) = budget else {
            return Err(EngineError::Scheduler(
                "a byte KV budget must be settled by prepare".into(),
            ));
        };
        let n = auto_kv_blocks(free_bytes, fraction, self.per_token * self.block_size)?;
        self.num_blocks = Some(n);
        Ok(n)
    }
}

/// Blocks of `block_bytes` in `fraction` of `free_bytes` less [`KV_AUTO_RESERVE_BYTES`].
fn auto_kv_blocks(
    free_bytes: Option<usize>,
    fraction: f64,
    block_bytes: usize,
) -> Result<usize, EngineError> {
    let auto_err = EngineError::KvBudget;
    let free = free_bytes.ok_or_else(|| {
        auto_err(
            "this device does not report its free memory (automatic sizing is for GPUs)".into(),
        )
    })?;
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(auto_err(format!(
            "the share of free memory must be in (0, 1] (got {fraction})"
        )));
    }
    let budget = ((free as f64 * fraction) as usize).saturating_sub(KV_AUTO_RESERVE_BYTES);
    let blocks = budget / block_bytes.max(1);
    if blocks == 0 {
        return Err(auto_err(format!(
            "{} MiB free on the device leaves no room for one block of {} KiB after the {} MiB \
             kept for decode graphs and workspaces",
            free >> 20,
            block_bytes >> 10,
            KV_AUTO_RESERVE_BYTES >> 20
        )));
    }
    Ok(blocks)
}

/// The KV budget in blocks (a token's K, or V, row in one layer takes `kv_row_bytes`), the run
/// lock and the checkpoint store, settled while `parts` still holds the weights (receipts hash
/// them).
pub(crate) fn prepare<M: Machine>(
    kv_row_bytes: usize,
    parts: &ModelParts,
    opts: &EngineOptions,
) -> Result<Prepared, EngineError> {
    let block_size = M::constant("block_size").unwrap_or(16).max(1) as usize;
    let per_token = kv_bytes_per_token(&parts.config, kv_row_bytes).max(1);
    let num_blocks = match opts.kv_budget {
        KvBudget::Bytes(bytes) => Some((bytes / (per_token * block_size)).max(1)),
        KvBudget::FreeDeviceMemory(_) => None,
    };
    // Held as long as the engine runs: no second process resumes or prunes this run meanwhile.
    let run_lock = opts.run_dir.as_deref().map(RunLock::acquire).transpose()?;
    // Hashed before the weights move to the backend: receipts name the exact model.
    let worm = match &opts.checkpoints {
        Some(c) => Some(open_worm::<M>(c, opts, parts)?),
        None => None,
    };
    let context_len = opts
        .max_context
        .unwrap_or(usize::MAX)
        .min(parts.config.max_position_embeddings);
    Ok(Prepared {
        block_size,
        per_token,
        num_blocks,
        context_len,
        run_lock,
        worm,
    })
}

/// Starts the engine thread of machine `M` on `runner` (whose weights came from `parts`).
pub(crate) fn launch<M: Machine + 'static, F: ForwardModel + 'static>(
    runner: F,
    prep: Prepared,
    parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let Prepared {
        block_size,
        per_token,
        num_blocks,
        context_len,
        run_lock,
        worm,
    } = prep;
    let num_blocks = num_blocks.ok_or_else(|| {
        EngineError::Scheduler("the KV budget was not settled before the engine started".into())
    })?;
    let (durability, checkpoints) = match worm {
        Some((worm, info)) => (
            Some(Durability {
                hook: Box::new(worm.hook) as Box<dyn CheckpointHook<_>>,
                journal: Some(worm.acceptor as Arc<dyn RequestJournal>),
                resume: opts.checkpoints.as_ref().is_some_and(|c| c.resume),
            }),
            Some(info),
        ),
        None => (None, None),
    };
    // A killed run's swap file holds nothing a checkpoint refers to (swapped sequences resume by
    // recomputation); a fresh spill would truncate it anyway.
    if let Some(dir) = opts.run_dir.as_deref() {
        match crate::engine::swap_spill::remove_leftover(dir) {
            Ok(true) => tracing::info!(
                "removed the swap file a killed run left in {}",
                dir.display()
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("removing a leftover swap file in {}: {e}", dir.display()),
        }
    }
    if opts.swap_file_bytes > 0 && opts.run_dir.is_none() {
        tracing::warn!("a swap file needs a run directory; swapping to host memory only");
    }
    let slot_path = opts.run_dir.as_deref().map(slot_path);
    let slots = match &slot_path {
        Some(path) => Some(create_slots(path)?),
        None => None,
    };
    let engine = Engine::start_durable::<M, _>(
        runner,
        parts.codec,
        EngineConfig {
            num_blocks,
            max_batch: opts.max_batch,
            max_prefill_tokens: opts.max_prefill_tokens,
            mixed_prefill: opts.mixed_prefill,
            overlap_host: opts.overlap_host,
            decode_ahead: opts.decode_ahead,
            prefill_ahead: opts.prefill_ahead,
            context_len,
            eos_ids: parts.eos_ids,
            trace: opts.trace,
            slots,
            grammar: parts.grammar,
            shutdown: opts.shutdown.clone(),
            kv: KvPolicy {
                prefix_cache: opts.prefix_cache,
                swap_blocks: opts.swap_memory_bytes / (per_token * block_size),
                spill_blocks: opts.swap_file_bytes / (per_token * block_size),
                spill_path: opts
                    .run_dir
                    .as_deref()
                    .map(|d| d.join(crate::engine::swap_spill::SPILL_FILE)),
                // Blocks are shared only between requests to the same model in the same KV dtype.
                salt: CacheSalt::of(&[
                    parts.name.as_bytes(),
                    format!("{:?}", parts.config).as_bytes(),
                    &(per_token as u64).to_le_bytes(),
                ]),
            },
        },
        durability,
    )?;
    if let Some(w) = checkpoints.as_ref().and_then(|c| c.witnesses.as_ref()) {
        w.publish_to(engine.slots().clone());
    }
    if let Some(n) = opts.speculative_draft_len {
        // After a resume's restore, which loads the interrupted run's slots.
        engine.slots().set_speculative_draft_len(n);
    }
    Ok(Started {
        engine,
        chat_template: parts.chat_template,
        model_name: parts.name,
        config: parts.config,
        kv_cache_bytes: num_blocks * block_size * per_token,
        checkpoints,
        battery: None,
        slot_path,
        run_lock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(num_blocks: Option<usize>) -> Prepared {
        Prepared {
            block_size: 16,
            per_token: 128 << 10, // Llama-3-8B in bf16: 32 layers x K, V x 8 heads x 128 x 2 bytes
            num_blocks,
            context_len: 8192,
            run_lock: None,
            worm: None,
        }
    }

    #[test]
    fn a_share_of_free_memory_becomes_blocks_after_the_reserve() {
        let block = 16 * (128 << 10); // 2 MiB
        let free: usize = 70 << 30;
        let want = ((free as f64 * 0.9) as usize - KV_AUTO_RESERVE_BYTES) / block;
        let mut p = prepared(None);
        assert_eq!(p.scratch(&EngineOptions::default()).2, 8192); // context, not the blocks
        let got = p
            .settle_blocks(KvBudget::FreeDeviceMemory(0.9), Some(free))
            .unwrap();
        assert_eq!(got, want);
        assert_eq!(p.num_blocks, Some(want));
        // Settled once: a later call keeps the count.
        assert_eq!(
            p.settle_blocks(KvBudget::FreeDeviceMemory(0.5), Some(1 << 40)),
            Ok(want)
        );
    }

    #[test]
    fn a_byte_budget_is_settled_by_prepare_and_kept() {
        let mut p = prepared(Some(64));
        assert_eq!(p.settle_blocks(KvBudget::Bytes(1 << 30), None), Ok(64));
        assert_eq!(p.scratch(&EngineOptions::default()).2, 64 * 16);
    }

    #[test]
    fn automatic_sizing_refuses_what_it_cannot_size() {
        let block = 2 << 20;
        // The CPU (and tensor-parallel ranks) report no free device memory.
        let e = auto_kv_blocks(None, 0.9, block).unwrap_err();
        assert!(e.to_string().contains("free memory"), "{e}");
        // Less free than the reserve: no block fits.
        let e = auto_kv_blocks(Some(2 << 30), 0.9, block).unwrap_err();
        assert!(e.to_string().contains("no room"), "{e}");
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            assert!(auto_kv_blocks(Some(80 << 30), bad, block).is_err(), "{bad}");
        }
        assert_eq!(auto_kv_blocks(Some(4 << 30), 1.0, block), Ok(512));
    }
}
