//! The snapshot: the engine's plain-data state at a checkpoint, serialized with rkyv 0.8.
//!
//! Design: the engine converts its live state into [`Snapshot`] (no engine types leak in here), the
//! store serializes it with `rkyv::to_bytes`, and loading always goes through `rkyv::from_bytes`,
//! which validates the archive with bytecheck before anything is read — disk bytes are never
//! accessed unchecked. A leading magic + format version guards against feeding another file.

use rkyv::{Archive, Deserialize, Serialize, rancor};

use super::digest::Digest;
use super::error::{CheckpointError, Result};

/// Format version of the snapshot encoding (bumped on any layout change).
pub const SNAPSHOT_FORMAT: u32 = 1;
/// Magic prefix of a snapshot file (8 bytes).
const MAGIC: &[u8; 8] = b"SOVSNAP\0";
/// File header: magic, u64 format, the three u64 [`StoreCommit`] fields, 8 zero bytes (all
/// little-endian); 48 bytes keeps the rkyv body 16-byte aligned in the file.
const HEADER_LEN: usize = 48;

/// How KV state is carried by a checkpoint.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvMode {
    /// Full blocks go to the content-addressed store, partial tails into the snapshot; restore copies
    /// them back. Pays when KV is cheap to write compared with re-running prefill (long contexts,
    /// slow compute, e.g. CPU).
    Blocks,
    /// Tokens only; restore rebuilds KV by prefilling prompt + output. Pays when storage or I/O
    /// bandwidth is scarce and compute is fast (GPU, short sequences).
    Recompute,
}

/// Shape of the KV bytes the blocks hold, so a restore refuses an incompatible model/backend.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Element type name as the engine spells it, e.g. "f32", "bf16".
    pub dtype: String,
}

/// Sampling and stopping parameters of one request (the engine's `SamplingParams` plus the
/// request's limits), everything a restored request needs to continue identically.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0.0 means greedy.
    pub temperature: f32,
    /// 0 means disabled.
    pub top_k: u32,
    /// 1.0 means disabled.
    pub top_p: f32,
    /// 0.0 means disabled.
    pub min_p: f32,
    /// 1.0 means disabled.
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output so far (0.0: disabled).
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every token already in the output (0.0 means disabled).
    pub presence_penalty: f32,
    /// The seed actually used (drawn at submit when the request gave none).
    pub seed: u64,
    /// Top-n logprobs requested (None: no logprobs).
    pub logprobs: Option<u32>,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Added to the logits of these tokens before sampling (OpenAI's `logit_bias`).
    pub logit_bias: Vec<LogitBias>,
    /// End-of-sequence tokens are suppressed until this many tokens were generated.
    pub min_tokens: u32,
    /// The grammar the output must match, in the engine's record form (None: unconstrained); a
    /// restored request rebuilds its matcher from it by replaying its output.
    pub grammar: Option<String>,
}

/// One entry of a request's logit bias.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct LogitBias {
    /// The token id.
    pub token: u32,
    /// Added to its logit.
    pub bias: f32,
}

impl SamplingParams {
    /// Greedy decoding with `max_tokens`, everything else disabled.
    pub fn greedy(max_tokens: u32) -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logprobs: None,
            max_tokens,
            stop: Vec::new(),
            ignore_eos: false,
            logit_bias: Vec::new(),
            min_tokens: 0,
            grammar: None,
        }
    }
}

/// Where a sequence stands.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum FinishState {
    /// Accepted, not yet prefilled.
    Waiting,
    /// Generating (possibly preempted / swapped out).
    Running,
    /// Stopped on a stop token.
    Stopped,
    /// Hit its max_tokens or the context limit.
    Length,
    /// Cancelled by the client.
    Cancelled,
}

/// One sequence (request) at the checkpoint.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SequenceSnapshot {
    /// Engine request id.
    pub request_id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Tokens generated so far.
    pub output: Vec<u32>,
    /// How the request samples and when it stops.
    pub sampling: SamplingParams,
    /// The sampler RNG state exactly as the engine exports it (opaque to the store).
    pub rng_state: Vec<u64>,
    /// Where the sequence stands.
    pub finish: FinishState,
    /// Content addresses of the sequence's full KV blocks, in order (empty in `Recompute` mode).
    pub blocks: Vec<Digest>,
    /// Bytes of the partially filled tail block (empty in `Recompute` mode or when none).
    pub tail: Vec<u8>,
    /// Tokens held by `tail`.
    pub tail_tokens: u32,
}

/// Where the append-only files stood when the snapshot was taken; written by the store into the
/// snapshot file's header (so the snapshot digest covers it), checked by verification so truncating
/// committed data is detected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCommit {
    /// Index entries (blocks) committed.
    pub index_entries: u64,
    /// Bytes of the block segment committed.
    pub segment_len: u64,
    /// Bytes of the request journal at capture; records after it are requests to re-admit.
    pub journal_len: u64,
}

/// The engine's complete state at a checkpoint.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Name of the state machine (spec) running.
    pub machine: String,
    /// Name of the scheduler state at the checkpoint.
    pub state: String,
    /// The 32 raw control slots.
    pub slots: [u32; 32],
    /// Engine decode-step counter (monotonic).
    pub step: u64,
    /// Whether the KV blocks or only tokens are stored.
    pub kv_mode: KvMode,
    /// Shape of the stored KV bytes, checked on restore.
    pub kv_layout: KvLayout,
    /// Every unfinished sequence: running (admission order) then waiting (queue order).
    pub sequences: Vec<SequenceSnapshot>,
    /// Extra engine state the store does not interpret (e.g. next request id); may be empty.
    pub engine_extra: Vec<u8>,
}

impl Snapshot {
    /// Every block hash the snapshot references, per sequence (the KV-root input).
    pub fn block_lists(&self) -> impl Iterator<Item = &[Digest]> {
        self.sequences.iter().map(|s| s.blocks.as_slice())
    }
}

/// Serialize a snapshot and the store's commit point to snapshot file bytes (header + rkyv archive).
pub fn encode(snapshot: &Snapshot, commit: &StoreCommit) -> Result<Vec<u8>> {
    let body = rkyv::to_bytes::<rancor::Error>(snapshot)
        .map_err(|e| CheckpointError::Usage(format!("snapshot serialization failed: {e}")))?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    for word in [
        u64::from(SNAPSHOT_FORMAT),
        commit.index_entries,
        commit.segment_len,
        commit.journal_len,
        0,
    ] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&body);
    Ok(out)
}

fn header_word(bytes: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
    u64::from_le_bytes(w)
}

/// Decode snapshot file bytes, validating header and archive (bytecheck). Never panics.
pub fn decode(bytes: &[u8]) -> Result<(Snapshot, StoreCommit)> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Err(CheckpointError::Decode(
            "not a sov snapshot (bad magic or short)".into(),
        ));
    }
    let version = header_word(bytes, 0);
    if version != u64::from(SNAPSHOT_FORMAT) {
        return Err(CheckpointError::Decode(format!(
            "unsupported snapshot format {version}"
        )));
    }
    if header_word(bytes, 4) != 0 {
        return Err(CheckpointError::Decode(
            "snapshot header padding is not zero".into(),
        ));
    }
    let commit = StoreCommit {
        index_entries: header_word(bytes, 1),
        segment_len: header_word(bytes, 2),
        journal_len: header_word(bytes, 3),
    };
    // Copy into 16-byte-aligned memory: rkyv's validator requires the archive's alignment.
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len() - HEADER_LEN);
    aligned.extend_from_slice(&bytes[HEADER_LEN..]);
    let snapshot = rkyv::from_bytes::<Snapshot, rancor::Error>(&aligned)
        .map_err(|e| CheckpointError::Decode(format!("invalid snapshot archive: {e}")))?;
    Ok((snapshot, commit))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fixture::sample;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let s = sample(vec![[7u8; 32]]);
        let commit = StoreCommit {
            index_entries: 3,
            segment_len: 99,
            journal_len: 12,
        };
        let bytes = encode(&s, &commit).unwrap();
        assert_eq!(decode(&bytes).unwrap(), (s, commit));
    }

    #[test]
    fn rejects_wrong_magic_version_and_truncation() {
        let bytes = encode(&sample(vec![]), &StoreCommit::default()).unwrap();
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(decode(&bad).is_err());
        let mut bad = bytes.clone();
        bad[8] = 2;
        assert!(decode(&bad).is_err());
        for cut in [0, 5, 16, 47, 48, 49, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                decode(&bytes[..cut]).is_err(),
                "truncated to {cut} accepted"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&1u64.to_le_bytes());
            bytes.extend_from_slice(&[0u8; 32]);
            bytes.extend_from_slice(&body);
            let _ = decode(&bytes);
            let _ = decode(&body);
        }

        #[test]
        fn decoder_never_panics_on_mutated_snapshots(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
            let mut bytes = encode(&sample(vec![[1u8; 32], [2u8; 32]]), &StoreCommit::default()).unwrap();
            for (i, v) in flips {
                let at = i.index(bytes.len());
                bytes[at] ^= v;
            }
            let _ = decode(&bytes);
        }
    }
}
