//! CUDA implementation of [`crate::backend::Backend`] through cudarc (driver, NVRTC, cuBLAS).
//!
//! Design: one context and one non-default stream per backend; every op only enqueues work on that
//! stream (so a decode step can be captured into a CUDA graph), and host copies synchronise.
//! Kernels are the `.cu` units of the `sov-kernels` crate, compiled with NVRTC on first use for the
//! device's architecture (attention units once per head configuration) and cached for the process
//! (`modules.rs`). Matrix products go through cuBLAS with bf16 operands and f32 accumulation
//! (`gemm.rs`). Weights and the paged KV cache are bf16; activations are f32 as the Backend contract
//! says. Decode attention is split-K with the merge done by the last CTA (`attention.rs`); the
//! next-token choice can run on the device so only token ids come back (`sampling.rs`); a decode
//! step can be captured once into a CUDA graph and replayed (`graph.rs`); the batch-1 GEMV starts
//! streaming its weights while the kernel before it finishes (`pdl.rs`); the allocation pool keeps
//! what a pass frees for the next one (`mem_pool.rs`).
//! Every performance choice that may be changed is a field of [`CudaTuning`] (`tuning.rs`), passed
//! to [`CudaBackend::with_tuning`]; no code of the backend reads the environment.
//! Besides the [`crate::backend::Backend`] ops, a model runner that keeps a step's buffers at
//! fixed addresses and replays graphs (the runner's `DecodeGraphs`) gets a small public
//! interface: [`CudaBackend::capture`] / [`CudaBackend::replay`], the scratch generation that says
//! when captured graphs are stale ([`CudaBackend::scratch_generation`]), batched and partial
//! copies ([`CudaBackend::upload_u32_many`], [`CudaBackend::download_f32_at`]) and the on-device
//! argmax ([`CudaBackend::argmax_rows`]). This module knows nothing of the model.
//! Under `--quantization fp8` the linear layers' weights are e4m3 with per-channel scales and
//! their inputs are quantized per token before each product (`fp8.rs`, `gemm_fp8.rs`), inside
//! the product at one row (`fp8_fused.rs`) and by the RMSNorm and SwiGLU kernels that produce
//! them at more rows (`fp8_inputs.rs`); under
//! `--kv-dtype fp8` the KV cache holds e4m3 codes with a scale per token and head (`kv_e4m3.rs`).
//! cudarc loads the CUDA libraries at run time, so sov builds and runs without CUDA installed:
//! [`CudaBackend::new`] then returns a clear error.

mod attention;
mod attention_rows;
mod backend_impl;
mod buffer;
mod decode_scratch;
mod det_gemv;
mod det_picks;
mod det_split;
mod device;
mod driver_error;
mod fp8;
mod fp8_fused;
mod fp8_inputs;
mod gemm;
mod gemm_fp8;
mod gemm_pinned;
mod graph;
mod kv_e4m3;
mod lt_problem;
mod mem_pool;
mod modules;
mod ops;
mod pdl;
mod product_dims;
mod sampling;
mod staging;
mod step_io;
mod tuning;
mod upload_ring;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod deterministic_tests;
#[cfg(test)]
mod fp8_delta_tests;
#[cfg(test)]
mod fp8_gate_up_tests;
#[cfg(test)]
mod fp8_inputs_tests;
#[cfg(test)]
mod fp8_tests;
#[cfg(test)]
mod fused_rope_tests;
#[cfg(test)]
mod kv_e4m3_tests;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upload_ring_tests;

pub use buffer::CudaBuffer;
pub use device::{CudaBackend, probe};
pub use fp8::Fp8Path;
pub use gemm_fp8::ScaleMode;
pub use graph::StepGraph;
pub use sampling::{DrawRow, MAX_DRAW_VOCAB};
pub use step_io::PinnedRows;
pub use tuning::{
    CudaTuning, DecodeCarveout, Fp8QuantizedInputs, KernelBuild, Quantization, RETIRED_VARS,
    TuningError, retired_vars_set,
};
