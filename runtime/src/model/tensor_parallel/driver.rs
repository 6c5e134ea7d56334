//! [`TensorParallel`]: the ranks of one tensor-parallel model in one process, one thread each,
//! running every step together (rank 0's logits are the model's).

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::Backend;
use crate::loader::tensor::HostTensor;
use crate::model::batch::SeqChunk;
use crate::model::config::LlamaConfig;
use crate::model::{KvCache, LlamaModel, ModelError};

use super::collective::{AllReduce, LocalGroup};
use super::shard::{Shard, shard_config, shard_weights};

/// A Llama model split across `backends.len()` ranks of an in-process [`LocalGroup`].
pub struct TensorParallel<B: Backend> {
    group: Arc<LocalGroup>,
    /// One model per rank, rank 0 first.
    ranks: Vec<LlamaModel<B>>,
}

impl<B: Backend> TensorParallel<B> {
    /// Shards `weights` (the full model's Hugging Face-named tensors, `config` its configuration)
    /// across one rank per backend and uploads each rank's slice to its backend.
    pub fn new(
        backends: Vec<B>,
        config: &LlamaConfig,
        weights: &HashMap<String, HostTensor>,
    ) -> Result<Self, ModelError> {
        let world = backends.len();
        let rank_config = shard_config(config, world)?;
        let group = Arc::new(LocalGroup::new(world));
        let ranks = backends
            .into_iter()
            .enumerate()
            .map(|(rank, backend)| {
                let part = shard_weights(weights, config, Shard { rank, world })?;
                let handle = LocalGroup::rank(&group, rank)
                    .ok_or_else(|| ModelError::InvalidConfig(format!("rank {rank} of {world}")))?;
                let handle: Arc<dyn AllReduce<B>> = Arc::new(handle);
                Ok(LlamaModel::from_tensors(backend, &rank_config, part)?.with_all_reduce(handle))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(TensorParallel { group, ranks })
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `rank`'s model (its configuration is the sharded one).
    pub fn rank(&self, rank: usize) -> Option<&LlamaModel<B>> {
        self.ranks.get(rank)
    }

    /// One KV cache per rank (each holds its rank's key/value heads), for `num_blocks` blocks of
    /// `block_size` tokens: every rank uses the same block ids.
    pub fn new_kv_caches(
        &self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Vec<KvCache<B>>, ModelError> {
        self.ranks
            .iter()
            .map(|m| m.new_kv_cache(num_blocks, block_size))
            .collect()
    }

    /// [`LlamaModel::forward`] over the group: every rank runs `chunks` on its cache in `kvs`
    /// (`[world]`, from [`Self::new_kv_caches`]); returns `[chunks.len(), vocab]` f32.
    pub fn forward(
        &self,
        kvs: &mut [KvCache<B>],
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<f32>, ModelError> {
        self.run(kvs, |m, kv| m.forward(kv, chunks))
    }

    /// [`LlamaModel::forward_all_logits`] over the group: `[total new tokens, vocab]` f32.
    pub fn forward_all_logits(
        &self,
        kvs: &mut [KvCache<B>],
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<f32>, ModelError> {
        self.run(kvs, |m, kv| m.forward_all_logits(kv, chunks))
    }

    /// Runs `step` on every rank, one thread each. A rank that fails aborts the group so the
    /// others leave their all-reduce with an error instead of waiting; the first failure that is
    /// not such an abort is returned, and the group is reset for the next step.
    fn run<F>(&self, kvs: &mut [KvCache<B>], step: F) -> Result<Vec<f32>, ModelError>
    where
        F: Fn(&LlamaModel<B>, &mut KvCache<B>) -> Result<Vec<f32>, ModelError> + Sync,
    {
        if kvs.len() != self.ranks.len() {
            return Err(ModelError::InvalidBatch(format!(
                "{} KV caches for {} tensor-parallel ranks",
                kvs.len(),
                self.ranks.len()
            )));
        }
        let group = &self.group;
        let step = &step;
        let results: Vec<Result<Vec<f32>, ModelError>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter()
                .zip(kvs.iter_mut())
                .map(|(model, kv)| {
                    s.spawn(move || {
                        let r = step(model, kv);
                        if r.is_err() {
                            group.abort();
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        group.abort();
                        Err(ModelError::InvalidBatch(
                            "a tensor-parallel rank panicked".into(),
                        ))
                    })
                })
                .collect()
        });
        let mut logits = Vec::new();
        let mut errors = Vec::new();
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(l) if rank == 0 => logits = l,
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            return Ok(logits);
        }
        group.reset();
        let cause = errors
            .iter()
            .position(|e| !super::collective::is_abort(e))
            .unwrap_or(0);
        Err(errors.swap_remove(cause))
    }
}
