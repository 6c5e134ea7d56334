//! Starting an engine on a loaded model: pick the backend, build the model on it, start the
//! engine thread with the machine chosen by the caller.
//!
//! Design: the one place where options become a running engine, shared by every front end. Typed
//! options in ([`EngineOptions`], [`ModelParts`], in `options`), a [`Started`] out. The steps
//! every start shares (the KV budget, the run lock, the checkpoint store, the engine thread) are
//! `launch`'s; a model split across ranks starts in `tensor_parallel`. The option types are
//! re-exported here, where the examples have always taken them from.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::engine::EngineError;
use crate::model::LlamaModel;
use crate::model::error::ModelError;
use crate::runner::{LlamaRunner, RunnerBackend};
use crate::scheduler::Machine;

use super::launch::{launch, prepare};
use super::tensor_parallel::start_tensor_parallel;

pub use super::checkpoints::{model_digest, platform_of};
pub use super::options::{
    CheckpointInfo, CheckpointOptions, Device, EngineOptions, KV_AUTO_FRACTION,
    KV_AUTO_RESERVE_BYTES, KvBudget, ModelParts, Started, default_kv_mode, kv_bytes_per_token,
    kv_row_bytes,
};

/// Builds the model on `opts.device` and starts an engine running machine `M`.
pub fn start_engine<M: Machine + 'static>(
    parts: impl Into<ModelParts>,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let parts = parts.into();
    if opts.tensor_parallel > 1 {
        return start_tensor_parallel::<M>(parts, opts);
    }
    match opts.device {
        Device::Cpu => start_on::<M, _>(CpuBackend::new(), parts, opts),
        Device::Cuda(n) => {
            let backend = CudaBackend::with_tuning(n, opts.cuda_tuning.clone())
                .map_err(|e| EngineError::Forward(format!("device cuda:{n}: {e}")))?
                .with_precise(opts.precise);
            start_on::<M, _>(backend, parts, opts)
        }
    }
}

/// Starts an engine for `parts` on `backend`.
pub fn start_on<M: Machine + 'static, B: RunnerBackend>(
    backend: B,
    mut parts: ModelParts,
    opts: &EngineOptions,
) -> Result<Started, EngineError> {
    let mut prep = prepare::<M>(kv_row_bytes(&backend, &parts.config), &parts, opts)?;
    // Weights move to the backend one tensor at a time: host memory never holds two copies.
    let tensors = std::mem::take(&mut parts.tensors);
    let model = LlamaModel::from_tensors(backend, &parts.config, tensors)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    // Scratch for the largest step the scheduler can form (a prefill budget plus one decode token
    // per sequence), allocated now rather than in the middle of serving.
    let (rows, seqs, context) = prep.scratch(opts);
    model
        .reserve_scratch(rows, seqs, context)
        .map_err(|e| EngineError::Forward(e.to_string()))?;
    // A share of free memory is measured only now, with the weights and scratch in place.
    let num_blocks = prep.settle_blocks(opts.kv_budget, model.backend().free_memory_bytes())?;
    let kv_mib = (num_blocks * prep.block_size * prep.per_token) >> 20;
    let runner = LlamaRunner::with_decode(
        model,
        num_blocks,
        prep.block_size,
        B::new_decode(&opts.runner),
    )
    .map_err(|e| match e {
        // The backend refused the allocation (out of device memory, most often).
        ModelError::Backend(b) => EngineError::KvCacheAlloc {
            mib: kv_mib,
            reason: b.to_string(),
        },
        other => EngineError::Forward(other.to_string()),
    })?;
    launch::<M, _>(runner, prep, parts, opts)
}
