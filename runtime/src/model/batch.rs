//! The batch description one forward pass runs on.
//!
//! Contract between the engine (which owns the block manager and decides what runs) and the model
//! (which reads and writes the paged KV cache through the block tables it is given). Plain host data.

/// New tokens of one sequence for this step: a prompt chunk (prefill) or one token (decode).
#[derive(Debug, Clone)]
pub struct SeqChunk<'a> {
    /// Token ids to run, `[n_new]`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence (= number of tokens already in the KV cache).
    pub start_pos: usize,
    /// Physical KV block ids of the sequence, in order, `[ceil((start_pos + n_new) / block_size)]`.
    /// The engine has allocated every block these tokens land in before the call.
    pub block_table: &'a [u32],
}

/// One forward pass: several sequences, each with its own new tokens.
/// The model returns logits of the last new token of each chunk: `[chunks.len(), vocab]`, f32.
pub type ForwardBatch<'a> = [SeqChunk<'a>];
