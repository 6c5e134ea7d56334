//! Tensor parallelism (Megatron-LM's layout, Shoeybi et al. 2019): one Llama model split across
//! `world` ranks that each hold a slice of every layer and run the same step together.
//!
//! Design: a rank is an ordinary [`LlamaModel`](super::LlamaModel) built from a sharded
//! configuration ([`shard::shard_config`]: `H/N` query heads, `KVH/N` key/value heads, `F/N` MLP
//! width) and sharded weights ([`shard::shard_weights`]: q/k/v and gate/up split by output rows
//! (column-parallel), o and down split by input columns (row-parallel), embeddings, norms and the
//! head replicated). Each rank's o and down products give a partial sum of the full product; the
//! model sums them over the ranks with an [`collective::AllReduce`] before adding them to the
//! residual stream, so every rank keeps the same full residual stream and its own slice of the KV
//! cache (its own key/value heads). [`TensorParallel`] drives the ranks of one process, one thread
//! each, and returns rank 0's logits.
//!
//! The collective is a trait: [`collective::LocalGroup`] is the in-process stand-in (the ranks'
//! buffers summed on the host in rank order) with which the sharded model runs and is tested on
//! the CPU; on GPUs the same trait is meant to be backed by NCCL's all-reduce (one communicator per
//! GPU, `ncclCommInitRank` with a unique id that rank 0 creates and, across hosts, hands to the
//! others out of band), never by a hand-written transport.

pub mod collective;
pub mod driver;
pub mod shard;

pub use collective::{AllReduce, LocalGroup, LocalRank};
pub use driver::TensorParallel;
pub use shard::{Shard, shard_config, shard_weights};

#[cfg(test)]
mod tests;
