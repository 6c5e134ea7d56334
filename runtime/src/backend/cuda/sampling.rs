//! Next-token choice on the device (`sampling.cu`): only the token ids come back to the host. The
//! greedy choice follows the engine's host `argmax`, the sampled one its `draw`, bit for bit.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use sov_kernels::KernelId;

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use super::ops::to_i32;
use super::pdl::arg;
use crate::backend::{BackendError, DType, check_buffer};

/// One sampled row's draw: the engine's `DrawSpec` (`engine/draw.rs`, which specifies the
/// steps `draw_tokens` follows bit for bit), in the backend's own terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawRow {
    /// Divides the logits; > 0.
    pub temperature: f32,
    /// Keep the `top_k` first tokens of the sorted order; 0 keeps all.
    pub top_k: u32,
    /// Keep the shortest sorted prefix holding this share of the top-k weight; `>= 1` keeps all.
    pub top_p: f32,
    /// Drop tokens lighter than `min_p` times the heaviest; 0 keeps all.
    pub min_p: f32,
    /// 53 random bits: the request's uniform number for this token, times `2^53`.
    pub bits: u64,
}

impl DrawRow {
    /// The four u64 words `draw_tokens` reads for a draw from logits row `row`: (temperature |
    /// top_k << 32, top_p | min_p << 32, bits, row).
    fn words(&self, row: usize) -> [u64; 4] {
        [
            self.temperature.to_bits() as u64 | (self.top_k as u64) << 32,
            self.top_p.to_bits() as u64 | (self.min_p.to_bits() as u64) << 32,
            self.bits,
            row as u64,
        ]
    }
}

/// Vocabularies `draw_tokens` takes: its fixed-point weights sum within a u64 below `2^24` tokens.
pub const MAX_DRAW_VOCAB: usize = 1 << 23;

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

    /// The drawn token of each `(row, draw)` of `draws`: row `row` of `logits: [>= rows, vocab]`
    /// f32 sampled on the device as `draw` says, bit for bit the engine's host `draw`. Only the ids
    /// come back (the call waits for them).
    pub fn draw_rows(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        draws: &[(usize, DrawRow)],
    ) -> Result<Vec<u32>, BackendError> {
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = self.alloc_zeroed(DType::U32, draws.len())?; // [n] u32
        self.launch_draws(logits, vocab, draws, &mut out, false)?;
        let mut ids = vec![0u32; draws.len()]; // [n]
        self.download_raw(&out, 0, bytemuck::cast_slice_mut(&mut ids))?;
        Ok(ids)
    }

    /// Enqueues the draws of [`Self::draw_rows`] with each id written at its row of `out: [>=
    /// rows]` u32 (no other entry touched), so one download brings a step's greedy and drawn ids
    /// together. Nothing is downloaded.
    pub fn enqueue_draws_at_rows(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        draws: &[(usize, DrawRow)],
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let rows = draws.iter().map(|d| d.0).max().map_or(0, |r| r + 1);
        check_buffer("enqueue_draws_at_rows", "out", out, DType::U32, rows)?;
        self.launch_draws(logits, vocab, draws, out, true)
    }

    /// Launches `draw_tokens` over `draws`, writing `out` in draw order or (`by_row`) at rows.
    fn launch_draws(
        &self,
        logits: &CudaBuffer,
        vocab: usize,
        draws: &[(usize, DrawRow)],
        out: &mut CudaBuffer,
        by_row: bool,
    ) -> Result<(), BackendError> {
        const OP: &str = "draw_rows";
        if draws.is_empty() {
            return Ok(());
        }
        let rows = draws.iter().map(|d| d.0).max().unwrap_or(0) + 1;
        check_buffer(OP, "logits", logits, DType::F32, rows * vocab)?;
        if vocab == 0 || vocab > MAX_DRAW_VOCAB {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!("vocab {vocab} outside 1..={MAX_DRAW_VOCAB}"),
            });
        }
        let words: Vec<u64> = draws.iter().flat_map(|(r, d)| d.words(*r)).collect(); // [n, 4]
        // Eight u32 a draw, read by the kernel as four u64 (allocations are 256-byte aligned).
        let params = self.upload_bytes(DType::U32, bytemuck::cast_slice(&words))?;
        let f = self
            .modules
            .function(KernelId::Sampling, None, "draw_tokens")?;
        let v = to_i32(vocab, "vocab")?;
        let by_row = i32::from(by_row);
        let ptrs = [out.ptr(), logits.ptr(), params.ptr()];
        let cfg = LaunchConfig {
            grid_dim: (draws.len() as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ptrs[0])
            .arg(&ptrs[1])
            .arg(&v)
            .arg(&ptrs[2])
            .arg(&by_row);
        // SAFETY: logits holds `rows` rows of vocab f32 (checked above) and every draw's row is
        // below `rows`; params holds four u64 a draw; out holds one entry a draw (draw_rows
        // allocates it so) or, by row, `rows` entries (checked by enqueue_draws_at_rows).
        unsafe { b.launch(cfg) }.map_err(driver_err)?;
        Ok(())
    }
}
