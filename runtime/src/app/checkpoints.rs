//! Opening a run's checkpoint store at start-up: the run directory's `checkpoints/`, the signing
//! key (given, or sov's default one), the anchor a resume checks the chain against (the chain head
//! the interrupted run's slot file names), the platform the heads record, and the witnesses.
//!
//! Design: one function the start-up calls while the weights are still on the host (receipts
//! name the model by [`model_digest`]); it hands the engine's checkpoint hooks back to `launch`.

use std::sync::Arc;

use super::options::{
    CheckpointInfo, CheckpointOptions, Device, EngineOptions, ModelParts, default_kv_mode,
};
use super::run_dir::{checkpoint_dir, slot_path};
use super::witnesses::Witnesses;
use crate::backend::cuda::CudaTuning;
use crate::checkpoint::{Anchor, Platform, keys};
use crate::engine::EngineError;
use crate::engine::checkpointing::{self, Worm, WormConfig};
use crate::engine::draw::DRAW_RULE;
use crate::loader::tensor::HostData;
use crate::scheduler::Machine;

/// What the heads say the engine runs on: `cpu`/`cuda` (`-tpN` across N tensor-parallel ranks,
/// whose sums round differently) and `f32`/`bf16` (a GPU computes in bf16 unless `precise`),
/// `-deterministic` appended on a GPU in batch-invariant mode.
pub fn platform_of(
    device: Device,
    precise: bool,
    tuning: &CudaTuning,
    tensor_parallel: usize,
) -> Platform {
    let (backend, precision) = match device {
        Device::Cpu => ("cpu", "f32".to_string()),
        Device::Cuda(_) => ("cuda", tuning.precision_name(precise)),
    };
    let backend = match tensor_parallel {
        0 | 1 => backend.to_string(),
        n => format!("{backend}-tp{n}"),
    };
    Platform {
        backend: Some(backend),
        precision: Some(precision),
        sampler: Some(DRAW_RULE.into()),
    }
}

/// Opens the checkpoint store of `opts.run_dir` for machine `M` and model `parts`: the store's
/// directory, signing key, resume anchor and witnesses.
pub(crate) fn open_worm<M: Machine>(
    c: &CheckpointOptions,
    opts: &EngineOptions,
    parts: &ModelParts,
) -> Result<(Worm, CheckpointInfo), EngineError> {
    let device = opts.device;
    let run_dir = opts
        .run_dir
        .as_deref()
        .ok_or_else(|| EngineError::Checkpoint("checkpoints need a run directory".into()))?;
    let dir = checkpoint_dir(run_dir);
    let has_chain = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
    if c.resume && !has_chain {
        return Err(EngineError::Checkpoint(format!(
            "nothing to resume: {} holds no checkpoint directory with a journal",
            dir.display()
        )));
    }
    if !c.resume && has_chain {
        return Err(EngineError::Checkpoint(format!(
            "{} already holds a run; continue it with --resume {} or use another run directory",
            dir.display(),
            run_dir.display()
        )));
    }
    let ck = |e: crate::checkpoint::CheckpointError| EngineError::Checkpoint(e.to_string());
    let mode = c
        .mode
        .unwrap_or_else(|| default_kv_mode(M::constant("checkpoint_kv"), device));
    let (key, public_key, key_created) = match &c.key {
        Some(path) => (keys::load_private(path).map_err(ck)?, None, false),
        None => {
            let (key, public, created) = keys::load_or_create_in(&c.config_dir).map_err(ck)?;
            (key, Some(public), created)
        }
    };
    // The slots of the interrupted run remember the chain head: a rolled-back directory is refused.
    let anchor = if c.resume {
        std::fs::read(slot_path(run_dir))
            .ok()
            .and_then(|bytes| slots_from_bytes(&bytes))
            .and_then(|slots| Anchor::from_slots(&slots))
            .map(|a| a.locate(&dir))
    } else {
        None
    };
    let mut worm = checkpointing::open(WormConfig {
        dir: dir.clone(),
        key,
        spec_digest: M::SPEC_DIGEST,
        model_digest: model_digest(parts),
        anchor,
        mode,
        resume: c.resume,
        platform: platform_of(
            device,
            opts.precise,
            &opts.cuda_tuning,
            opts.tensor_parallel,
        ),
    })
    .map_err(ck)?;
    let witnesses = match &opts.witnesses {
        Some(cfg) => {
            let w = Witnesses::start(cfg.clone(), &dir).map_err(|e| {
                EngineError::Checkpoint(format!("starting the witness client: {e}"))
            })?;
            worm.set_head_sink(w.sink()).map_err(ck)?;
            worm.set_quorum_height(w.quorum_height());
            Some(Arc::new(w))
        }
        None => None,
    };
    let info = CheckpointInfo {
        dir,
        mode,
        public_key,
        key_created,
        recovered: worm.recovered.clone(),
        platform_change: worm.platform_change.clone(),
        book: worm.book.clone(),
        witnesses,
    };
    Ok((worm, info))
}

/// The 32 slot words of a slot file's bytes (little-endian u32s), if it has them.
fn slots_from_bytes(bytes: &[u8]) -> Option<[u32; 32]> {
    let mut slots = [0u32; 32];
    for (i, w) in bytes.get(..128)?.chunks_exact(4).enumerate() {
        slots[i] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    Some(slots)
}

/// BLAKE3 over the model's name, its configuration and every tensor (name, shape, dtype, bytes,
/// in name order): the `model` field of every receipt, so a resume with other weights is refused.
pub fn model_digest(parts: &ModelParts) -> crate::checkpoint::Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"sov model v1\0");
    h.update(format!("{:?}\0", parts.config).as_bytes());
    let mut names: Vec<&String> = parts.tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &parts.tensors[name];
        h.update(name.as_bytes());
        h.update(format!("\0{:?}\0", t.shape).as_bytes());
        let (dtype, bytes): (&[u8], &[u8]) = match &t.data {
            HostData::F32(v) => (b"f32", bytemuck::cast_slice(v)),
            HostData::F16(v) => (b"f16", bytemuck::cast_slice(v)),
            HostData::BF16(v) => (b"bf16", bytemuck::cast_slice(v)),
            HostData::Quant(q) => (q.ty.name().as_bytes(), &q.bytes),
            HostData::Fp8(q) => {
                h.update(b"f8e4m3 row scales");
                h.update(bytemuck::cast_slice(&q.scales));
                (b"f8e4m3", &q.codes)
            }
        };
        h.update(dtype);
        h.update_rayon(bytes);
    }
    *h.finalize().as_bytes()
}
