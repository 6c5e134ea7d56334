//! Next-token choice on the device (`sampling.cu`): only the token ids come back to the host.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use super::ops::to_i32;
use super::pdl::arg;
use crate::backend::{BackendError, DType, check_buffer};

/// Sampling settings of one row of logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingRow {
    /// `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: u32,
    /// Keep the smallest most-likely set with probability mass `>= top_p`; `>= 1` disables it.
    pub top_p: f32,
    /// Uniform draw in `[0, 1)` from the request's seeded RNG (ignored when greedy).
    pub uniform: f32,
}

impl SamplingRow {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            uniform: 0.0,
        }
    }
}

impl CudaBackend {
    /// Enqueues the greedy choice of each of the first `rows` rows of `logits: [>= rows, vocab]`
    /// f32 into `out: [>= rows]` u32: the largest logit, the lowest id among ties, NaN never chosen
    /// unless the whole row is NaN (then the last id), exactly as the engine's host `argmax`.
    /// Nothing is downloaded, so a captured decode step can end with it.
    pub fn argmax_rows(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        rows: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        const OP: &str = "argmax_rows";
        check_buffer(OP, "logits", logits, DType::F32, rows * vocab)?;
        check_buffer(OP, "out", out, DType::U32, rows)?;
        if rows == 0 {
            return Ok(());
        }
        if vocab == 0 {
            return Err(BackendError::Shape {
                op: OP,
                detail: "vocab is 0".into(),
            });
        }
        let f = self
            .modules
            .function(KernelId::Sampling, None, "argmax_rows")?;
        let v = to_i32(vocab, "vocab")?;
        let (o, l) = (out.ptr(), logits.ptr());
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params = [arg(&o), arg(&l), arg(&v)];
        // SAFETY: logits holds rows * vocab f32 and out holds rows u32, checked above.
        // The kernel waits for its prerequisites before touching them (super::pdl).
        unsafe { self.launch_overlapping(&f, cfg, &mut params) }?;
        Ok(())
    }

    /// One token id per row of `logits: [rows.len(), vocab]` f32, chosen on the device.
    pub fn sample(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        rows: &[SamplingRow],
    ) -> Result<Vec<u32>, BackendError> {
        const OP: &str = "sample";
        check_buffer(OP, "logits", logits, DType::F32, rows.len() * vocab)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if vocab == 0 {
            return Err(BackendError::Shape {
                op: OP,
                detail: "vocab is 0".into(),
            });
        }
        let temps: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let top_k: Vec<i32> = rows
            .iter()
            .map(|r| r.top_k.min(i32::MAX as u32) as i32)
            .collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let uniform: Vec<f32> = rows
            .iter()
            .map(|r| r.uniform.clamp(0.0, 1.0 - f32::EPSILON))
            .collect();
        let t = self.upload_bytes(DType::F32, bytemuck::cast_slice(&temps))?;
        let k = self.upload_bytes(DType::I32, bytemuck::cast_slice(&top_k))?;
        let p = self.upload_bytes(DType::F32, bytemuck::cast_slice(&top_p))?;
        let u = self.upload_bytes(DType::F32, bytemuck::cast_slice(&uniform))?;
        let out = self.alloc_zeroed(DType::U32, rows.len())?;
        let f = self
            .modules
            .function(KernelId::Sampling, None, "sample_tokens")?;
        let v = to_i32(vocab, "vocab")?;
        let ptrs = [out.ptr(), logits.ptr(), t.ptr(), k.ptr(), p.ptr(), u.ptr()];
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ptrs[0])
            .arg(&ptrs[1])
            .arg(&v)
            .arg(&ptrs[2])
            .arg(&ptrs[3])
            .arg(&ptrs[4])
            .arg(&ptrs[5]);
        // SAFETY: every buffer holds rows.len() entries (logits rows * vocab), checked above.
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        let mut ids = vec![0u32; rows.len()];
        self.download_raw(&out, 0, bytemuck::cast_slice_mut(&mut ids))?;
        Ok(ids)
    }
}
