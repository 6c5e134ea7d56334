//! Turns the engine's [`SeqChunk`]s into the flat per-step metadata the backend ops read
//! (positions, KV slots, sequence offsets, context lengths, padded block tables), after checking
//! the batch against the model and the cache.

use super::batch::SeqChunk;
use super::error::ModelError;

/// Host-side metadata of one forward step; see `crate::backend::BatchMeta` for each field.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    /// `[n_tokens]`: every new token, sequence after sequence.
    pub tokens: Vec<u32>,
    /// `[n_tokens]`.
    pub positions: Vec<u32>,
    /// `[n_tokens]`.
    pub slot_mapping: Vec<u32>,
    /// `[n_seqs + 1]`.
    pub q_starts: Vec<u32>,
    /// `[n_seqs]`.
    pub ctx_lens: Vec<u32>,
    /// `[n_seqs, max_blocks_per_seq]`, padded with 0.
    pub block_tables: Vec<u32>,
    /// Row stride of `block_tables` (most blocks of one sequence in the step).
    pub max_blocks_per_seq: usize,
    /// Most new tokens of one sequence (1 for a pure decode step).
    pub max_q_len: usize,
    /// Longest context (cached + new tokens) of one sequence.
    pub max_ctx_len: usize,
    /// `[n_seqs]`: row of each sequence's last new token.
    pub last_rows: Vec<u32>,
}

/// Limits a batch must respect.
#[derive(Debug, Clone, Copy)]
pub struct PlanLimits {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Positions must be below this (the RoPE table's length).
    pub max_positions: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV cache; block table entries must be below this.
    pub num_blocks: usize,
}

/// Checks `chunks` and flattens them.
pub fn plan(chunks: &[SeqChunk<'_>], limits: PlanLimits) -> Result<StepPlan, ModelError> {
    let bad = |s: usize, msg: String| Err(ModelError::InvalidBatch(format!("sequence {s}: {msg}")));
    if chunks.is_empty() {
        return Err(ModelError::InvalidBatch("no sequences".into()));
    }
    let bs = limits.block_size;
    let max_blocks_per_seq = chunks
        .iter()
        .map(|c| (c.start_pos + c.tokens.len()).div_ceil(bs))
        .max()
        .unwrap_or(0);
    let mut p = StepPlan {
        tokens: Vec::new(),
        positions: Vec::new(),
        slot_mapping: Vec::new(),
        q_starts: vec![0],
        ctx_lens: Vec::new(),
        block_tables: Vec::new(),
        max_blocks_per_seq,
        max_q_len: 0,
        max_ctx_len: 0,
        last_rows: Vec::new(),
    };
    for (s, c) in chunks.iter().enumerate() {
        let n = c.tokens.len();
        if n == 0 {
            return bad(s, "no new tokens".into());
        }
        let ctx = c.start_pos + n;
        if ctx > limits.max_positions {
            return bad(
                s,
                format!(
                    "context {ctx} exceeds the model's {} positions",
                    limits.max_positions
                ),
            );
        }
        if let Some(t) = c.tokens.iter().find(|t| **t as usize >= limits.vocab_size) {
            return bad(
                s,
                format!("token id {t} >= vocabulary size {}", limits.vocab_size),
            );
        }
        let blocks = ctx.div_ceil(bs);
        if c.block_table.len() < blocks {
            return bad(
                s,
                format!(
                    "context {ctx} needs {blocks} blocks, block table has {}",
                    c.block_table.len()
                ),
            );
        }
        let table = &c.block_table[..blocks];
        if let Some(b) = table.iter().find(|b| **b as usize >= limits.num_blocks) {
            return bad(
                s,
                format!("block {b} out of range ({} blocks)", limits.num_blocks),
            );
        }
        p.tokens.extend_from_slice(c.tokens);
        for pos in c.start_pos..ctx {
            p.positions.push(pos as u32);
            p.slot_mapping
                .push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
        }
        p.block_tables.extend_from_slice(table);
        p.block_tables.resize((s + 1) * max_blocks_per_seq, 0);
        p.q_starts.push(p.tokens.len() as u32);
        p.last_rows.push(p.tokens.len() as u32 - 1);
        p.ctx_lens.push(ctx as u32);
        p.max_q_len = p.max_q_len.max(n);
        p.max_ctx_len = p.max_ctx_len.max(ctx);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: PlanLimits = PlanLimits {
        vocab_size: 100,
        max_positions: 64,
        block_size: 4,
        num_blocks: 10,
    };

    #[test]
    fn plan_flattens_a_prefill_chunk_and_a_decode_token() {
        let a = [5u32, 6, 7];
        let b = [9u32];
        let chunks = [
            SeqChunk {
                tokens: &a,
                start_pos: 2,
                block_table: &[3, 8],
            },
            SeqChunk {
                tokens: &b,
                start_pos: 4,
                block_table: &[1, 2],
            },
        ];
        let p = plan(&chunks, LIMITS).unwrap();
        assert_eq!(p.tokens, vec![5, 6, 7, 9]);
        assert_eq!(p.positions, vec![2, 3, 4, 4]);
        // pos 2,3 in block 3 (slots 14,15); pos 4 in block 8 (slot 32); decode pos 4 in block 2.
        assert_eq!(p.slot_mapping, vec![14, 15, 32, 8]);
        assert_eq!(p.q_starts, vec![0, 3, 4]);
        assert_eq!(p.ctx_lens, vec![5, 5]);
        assert_eq!(p.block_tables, vec![3, 8, 1, 2]);
        assert_eq!(p.last_rows, vec![2, 3]);
        assert_eq!(
            (p.max_q_len, p.max_ctx_len, p.max_blocks_per_seq),
            (3, 5, 2)
        );
    }

    #[test]
    fn plan_rejects_bad_batches() {
        let t = [1u32];
        let big = [100u32];
        let cases: [&[SeqChunk<'_>]; 5] = [
            &[],
            &[SeqChunk {
                tokens: &[],
                start_pos: 0,
                block_table: &[0],
            }],
            &[SeqChunk {
                tokens: &big,
                start_pos: 0,
                block_table: &[0],
            }],
            &[SeqChunk {
                tokens: &t,
                start_pos: 4,
                block_table: &[0],
            }],
            &[SeqChunk {
                tokens: &t,
                start_pos: 0,
                block_table: &[10],
            }],
        ];
        for c in cases {
            assert!(
                matches!(plan(c, LIMITS), Err(ModelError::InvalidBatch(_))),
                "{c:?}"
            );
        }
        let far = [SeqChunk {
            tokens: &t,
            start_pos: 64,
            block_table: &[0; 17],
        }];
        assert!(plan(&far, LIMITS).is_err(), "position beyond the model");
    }
}
