//! Starting an engine on a tensor-parallel model (`--tensor-parallel N`): the model split across N
//! ranks of one process (`crate::model::tensor_parallel`), one engine, scheduler, checkpoint store
//! and receipt chain for all of them, as for a whole model.
//!
//! On the CPU each rank is a [`CpuBackend`] with its share of the cores and the collective is the
//! in-process all-reduce. On CUDA the ranks would be one GPU each with NCCL's all-reduce behind
//! the same [`crate::model::tensor_parallel::AllReduce`] trait; this build has no NCCL binding, so
//! a CUDA start with more than one rank is refused with that reason.

use super::launch::{launch, prepare};
use super::options::{Device, EngineOptions, ModelParts, Started};
use crate::backend::DType;
use crate::backend::cpu::CpuBackend;
use crate::engine::EngineError;
use crate::model::tensor_parallel::TensorParallel;
use crate::runner::TensorParallelRunner;
use crate::scheduler::Machine;

/// Starts machine `M` on `parts` split across `opts.tensor_parallel` ranks.
pub fn start_tensor_parallel<M: Machine + 'static>(
    mut parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let world = opts.tensor_parallel.max(1);
    if let Device::Cuda(_) = opts.device {
        return Err(EngineError::Forward(format!(
            "--tensor-parallel {world} on CUDA needs NCCL, which this build does not bind yet \
             (the sharded model runs on the CPU: --device cpu)"
        )));
    }
    // Every rank's KV is f32 on the CPU; the budget counts the whole model's KV per token, so the
    // ranks together hold as many blocks as one whole model would.
    let c = &parts.config;
    let row_bytes = c.num_key_value_heads * c.head_dim * DType::F32.size_bytes();
    let mut prep = prepare::<M>(row_bytes, &parts, opts)?;
    // The ranks run on the CPU, which reports no free device memory: a byte budget only.
    let num_blocks = prep.settle_blocks(opts.kv_budget, None)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let backends = (0..world)
        .map(|_| CpuBackend::with_threads((cores / world).max(1)))
        .collect();
    let tensors = std::mem::take(&mut parts.tensors);
    let tp = TensorParallel::new(backends, &parts.config, &tensors)
        .map_err(|e| EngineError::Forward(format!("--tensor-parallel {world}: {e}")))?;
    drop(tensors);
    let (rows, seqs, context) = prep.scratch(opts);
    for rank in 0..world {
        if let Some(model) = tp.rank(rank) {
            model
                .reserve_scratch(rows, seqs, context)
                .map_err(|e| EngineError::Forward(e.to_string()))?;
        }
    }
    let runner = TensorParallelRunner::new(tp, num_blocks, prep.block_size)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    launch::<M, _>(runner, prep, parts, opts)
}
