//! The engine-facing driver: turns live engine state into a [`Snapshot`] plus new KV blocks, and a
//! [`Restored`] checkpoint back into per-sequence KV writes — without depending on engine types.
//!
//! Design: the engine implements two small traits — [`EngineSnapshot`] (its plain state: machine,
//! slots, sequences with block tables) and [`KvBlockIo`] (read/write the bytes of one physical KV
//! block) — and owns a [`Checkpointer`]. A full block of a live sequence never changes, so its
//! hash is cached per (request, KV generation, logical block) and its bytes are read from the KV
//! cache at most once; a checkpoint then reads only blocks filled since the previous one plus each
//! sequence's partial tail. `generation` must change whenever a sequence's KV is dropped and
//! recomputed (e.g. its preemption count), which invalidates its cached hashes.
//!
//! Slots: the machine's `do` list bumps `bft_quorum_height` after the `checkpoint` action, so
//! [`Checkpointer::checkpoint`] returns the words to publish with slot 7 = height - 1 (the bump then
//! lands on the store's height) and slots 8..31 = the receipt's digest and signature.

use std::collections::{HashMap, HashSet};

use super::attest::ResponseReceipt;
use super::digest::{Digest, block_hash};
use super::error::{CheckpointError, Result};
use super::journal::{FinishedRecord, RequestRecord};
use super::snapshot::{FinishState, KvLayout, KvMode, SamplingParams, SequenceSnapshot, Snapshot};
use super::store::{CheckpointStore, ReceiptInfo, Restored};

/// Raw access to the paged KV cache, by physical block.
pub trait KvBlockIo {
    /// Layout of a block's bytes (checked on restore).
    fn kv_layout(&self) -> KvLayout;
    /// Bytes of token slots `0..tokens` of physical block `block`, every layer's K and V, in a
    /// fixed layout of the implementor's choosing (the same one [`Self::write_block`] reads).
    fn read_block(&mut self, block: u32, tokens: usize) -> std::result::Result<Vec<u8>, String>;
    /// Write bytes produced by [`Self::read_block`] (for `tokens` slots) back into `block`.
    fn write_block(
        &mut self,
        block: u32,
        tokens: usize,
        bytes: &[u8],
    ) -> std::result::Result<(), String>;
    /// Start reading the whole blocks `blocks` (physical ids, in order): the handle's bytes are
    /// `blocks.len()` [`Self::read_block`] results of full blocks, concatenated, as the cache held
    /// them when this was called (later writes to the cache do not show). A device may gather
    /// them and copy them out asynchronously; this default reads them one by one, synchronously.
    fn read_blocks(
        &mut self,
        blocks: &[u32],
    ) -> std::result::Result<Box<dyn StagedBlocks>, String> {
        let bs = self.kv_layout().block_size as usize;
        let mut out = Vec::new();
        for &b in blocks {
            out.extend(self.read_block(b, bs)?);
        }
        Ok(Box::new(ReadyBlocks(out)))
    }
    /// Write whole blocks: `bytes` is `blocks.len()` full-block [`Self::read_block`] results,
    /// concatenated (what a [`Self::read_blocks`] handle gives). This default writes them one by one.
    fn write_blocks(&mut self, blocks: &[u32], bytes: &[u8]) -> std::result::Result<(), String> {
        if blocks.is_empty() {
            return Ok(());
        }
        if !bytes.len().is_multiple_of(blocks.len()) {
            return Err(format!(
                "{} bytes do not split into {} blocks",
                bytes.len(),
                blocks.len()
            ));
        }
        let bs = self.kv_layout().block_size as usize;
        for (&b, chunk) in blocks.iter().zip(bytes.chunks(bytes.len() / blocks.len())) {
            self.write_block(b, bs, chunk)?;
        }
        Ok(())
    }
}

/// Bytes of KV blocks on their way to the host ([`KvBlockIo::read_blocks`]). Dropping it gives its
/// staging memory back.
pub trait StagedBlocks: Send {
    /// Waits until the bytes are on the host and returns them.
    fn wait(&mut self) -> std::result::Result<&[u8], String>;
}

/// [`StagedBlocks`] already on the host.
pub struct ReadyBlocks(pub Vec<u8>);

impl StagedBlocks for ReadyBlocks {
    fn wait(&mut self) -> std::result::Result<&[u8], String> {
        Ok(&self.0)
    }
}

/// One live sequence as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSequence<'a> {
    /// Engine request id.
    pub request_id: u64,
    /// Prompt then output tokens `[prompt_len + generated]`.
    pub tokens: &'a [u32],
    /// Number of leading `tokens` that are the prompt.
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache (positions `0..kv_tokens`).
    pub kv_tokens: usize,
    /// Physical blocks, in order (covering at least `kv_tokens`).
    pub block_table: &'a [u32],
    /// Changes whenever this sequence's KV is dropped and recomputed.
    pub generation: u32,
    /// How the request samples and when it stops.
    pub sampling: SamplingParams,
    /// The sampler RNG state as the engine exports it (opaque to the store).
    pub rng_state: Vec<u64>,
    /// Where the sequence stands (waiting, running or finished).
    pub finish: FinishState,
}

/// What the engine exposes for a checkpoint.
pub trait EngineSnapshot {
    /// Name of the machine (spec) running.
    fn machine_name(&self) -> String;
    /// Name of the machine's current state.
    fn state_name(&self) -> String;
    /// The 32 raw slots.
    fn slots(&self) -> [u32; 32];
    /// Decode-step counter.
    fn step(&self) -> u64;
    /// Every unfinished sequence: running (admission order) then waiting (queue order).
    fn live_sequences(&self) -> Vec<LiveSequence<'_>>;
    /// Opaque extra state (e.g. the next request id); may be empty.
    fn engine_extra(&self) -> Vec<u8> {
        Vec::new()
    }
}

/// Owns the store and the per-block hash cache; the engine calls it from its actions.
pub struct Checkpointer {
    store: CheckpointStore,
    mode: KvMode,
    /// (request id, generation, logical block) -> content hash.
    hashes: HashMap<(u64, u32, usize), Digest>,
    /// Blocks read from the KV cache by the last checkpoint (for benchmarks and tests).
    last_blocks_read: usize,
}

/// What the engine publishes after a checkpoint.
#[derive(Debug, Clone)]
pub struct Published {
    /// The committed receipt.
    pub receipt: ReceiptInfo,
    /// Words for slots 7..=31 with slot 7 = height - 1 (the machine's `+= 1` follows).
    pub slot_words_before_bump: [u32; 25],
}

impl Checkpointer {
    /// A checkpointer writing to `store`, storing KV blocks or tokens only as `mode` says.
    pub fn new(store: CheckpointStore, mode: KvMode) -> Self {
        Self {
            store,
            mode,
            hashes: HashMap::new(),
            last_blocks_read: 0,
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &CheckpointStore {
        &self.store
    }

    /// Whether checkpoints store KV blocks or tokens only.
    pub fn mode(&self) -> KvMode {
        self.mode
    }

    /// Blocks (full or tail) read from the KV cache by the last checkpoint.
    pub fn last_blocks_read(&self) -> usize {
        self.last_blocks_read
    }

    /// Journal an accepted request (fsync) before the engine admits it.
    pub fn accept(&mut self, request: &RequestRecord) -> Result<()> {
        self.store.accept(request)
    }

    /// Journal several accepted requests with one fsync.
    pub fn accept_all(&mut self, requests: &[RequestRecord]) -> Result<()> {
        self.store.accept_all(requests)
    }

    /// Journal finished requests (one fsync) and sign a head over them before their final events
    /// are delivered.
    pub fn finished(&mut self, records: &[FinishedRecord]) -> Result<()> {
        self.store.finished(records)
    }

    /// [`Self::finished`], returning each request's receipt (see [`CheckpointStore::finish`]).
    pub fn finish(&mut self, records: &[FinishedRecord]) -> Result<Vec<ResponseReceipt>> {
        self.store.finish(records)
    }

    /// The underlying store, mutably (platform names, receipts).
    pub fn store_mut(&mut self) -> &mut CheckpointStore {
        &mut self.store
    }

    /// Take a checkpoint of `engine`, reading KV through `kv` in `Blocks` mode.
    pub fn checkpoint(
        &mut self,
        engine: &dyn EngineSnapshot,
        kv: &mut dyn KvBlockIo,
    ) -> Result<Published> {
        let layout = kv.kv_layout();
        let bs = layout.block_size as usize;
        if bs == 0 {
            return Err(CheckpointError::Usage("KV layout has block_size 0".into()));
        }
        let kv_err =
            |e: String| CheckpointError::Usage(format!("reading KV for a checkpoint: {e}"));
        let mut new_blocks: Vec<(Digest, Vec<u8>)> = Vec::new(); // each (hash, [block bytes])
        let mut sequences = Vec::new();
        let mut live_keys = HashSet::new();
        self.last_blocks_read = 0;
        for seq in engine.live_sequences() {
            let mut blocks = Vec::new();
            let mut tail = Vec::new();
            let mut tail_tokens = 0u32;
            if self.mode == KvMode::Blocks {
                let full = seq.kv_tokens / bs;
                let rest = seq.kv_tokens % bs;
                if seq.block_table.len() < full + usize::from(rest > 0) {
                    return Err(CheckpointError::Usage(format!(
                        "request {}: block table shorter than its {} KV tokens",
                        seq.request_id, seq.kv_tokens
                    )));
                }
                for (i, &physical) in seq.block_table[..full].iter().enumerate() {
                    let key = (seq.request_id, seq.generation, i);
                    live_keys.insert(key);
                    let hash = match self.hashes.get(&key) {
                        Some(h) => *h,
                        None => {
                            let bytes = kv.read_block(physical, bs).map_err(kv_err)?;
                            self.last_blocks_read += 1;
                            let h = block_hash(&bytes);
                            if !self.store.contains_block(&h) {
                                new_blocks.push((h, bytes));
                            }
                            self.hashes.insert(key, h);
                            h
                        }
                    };
                    blocks.push(hash);
                }
                if rest > 0 {
                    tail = kv.read_block(seq.block_table[full], rest).map_err(kv_err)?;
                    self.last_blocks_read += 1;
                    tail_tokens = rest as u32;
                }
            }
            sequences.push(SequenceSnapshot {
                request_id: seq.request_id,
                prompt: seq.tokens[..seq.prompt_len.min(seq.tokens.len())].to_vec(),
                output: seq.tokens[seq.prompt_len.min(seq.tokens.len())..].to_vec(),
                sampling: seq.sampling,
                rng_state: seq.rng_state,
                finish: seq.finish,
                blocks,
                tail,
                tail_tokens,
            });
        }
        self.hashes.retain(|k, _| live_keys.contains(k));
        let snapshot = Snapshot {
            machine: engine.machine_name(),
            state: engine.state_name(),
            slots: engine.slots(),
            step: engine.step(),
            kv_mode: self.mode,
            kv_layout: layout,
            sequences,
            engine_extra: engine.engine_extra(),
        };
        let refs: Vec<(Digest, &[u8])> =
            new_blocks.iter().map(|(h, b)| (*h, b.as_slice())).collect();
        let receipt = self.store.write_hashed(&snapshot, &refs)?;
        let mut words = receipt.slot_words();
        words[0] = u32::try_from(receipt.height.saturating_sub(1)).unwrap_or(u32::MAX);
        Ok(Published {
            receipt,
            slot_words_before_bump: words,
        })
    }

    /// The newest valid checkpoint plus requests journaled after it (see
    /// [`CheckpointStore::latest_valid`]); checks the KV layout matches `layout` in `Blocks` mode.
    pub fn latest(&self, layout: &KvLayout) -> Result<Option<Restored>> {
        let Some(r) = self.store.latest_valid()? else {
            return Ok(None);
        };
        if r.snapshot.kv_mode == KvMode::Blocks && r.snapshot.kv_layout != *layout {
            return Err(CheckpointError::Usage(format!(
                "checkpoint KV layout {:?} does not match this engine's {:?}",
                r.snapshot.kv_layout, layout
            )));
        }
        Ok(Some(r))
    }
}

/// The slot words to load after a restore: the snapshot's slots with 7..31 set to the newest
/// receipt (the chain head stays at the newest receipt).
pub fn restored_slots(r: &Restored) -> [u32; 32] {
    let mut slots = r.snapshot.slots;
    r.receipt.mirror_into(&mut slots);
    slots
}

/// Copy sequence `seq`'s stored KV into freshly allocated physical blocks `table`; returns the
/// number of tokens whose KV is now in the cache (0 in `Recompute` mode: prefill rebuilds it).
pub fn write_sequence_kv(
    r: &Restored,
    seq: &SequenceSnapshot,
    table: &[u32],
    kv: &mut dyn KvBlockIo,
) -> Result<usize> {
    if r.snapshot.kv_mode == KvMode::Recompute {
        return Ok(0);
    }
    let bs = r.snapshot.kv_layout.block_size as usize;
    let need = seq.blocks.len() + usize::from(seq.tail_tokens > 0);
    if table.len() < need {
        return Err(CheckpointError::Usage(format!(
            "request {}: {} blocks allocated, {need} needed to restore its KV",
            seq.request_id,
            table.len()
        )));
    }
    let kv_err = |e: String| CheckpointError::Usage(format!("writing restored KV: {e}"));
    for (hash, &physical) in seq.blocks.iter().zip(table) {
        let bytes = r.blocks.get(hash).ok_or_else(|| {
            CheckpointError::Usage(format!(
                "restored checkpoint lacks block {}",
                super::digest::to_hex(hash)
            ))
        })?;
        kv.write_block(physical, bs, bytes).map_err(kv_err)?;
    }
    if seq.tail_tokens > 0 {
        kv.write_block(table[seq.blocks.len()], seq.tail_tokens as usize, &seq.tail)
            .map_err(kv_err)?;
    }
    Ok(seq.blocks.len() * bs + seq.tail_tokens as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{MODEL, SPEC, key};

    const BS: usize = 4;
    const TOKEN_BYTES: usize = 8;

    /// A fake paged cache: [blocks, BS, TOKEN_BYTES] bytes, counting reads.
    struct FakeKv {
        data: Vec<u8>,
        reads: usize,
    }

    impl FakeKv {
        fn new(blocks: usize) -> Self {
            Self {
                data: vec![0; blocks * BS * TOKEN_BYTES],
                reads: 0,
            }
        }
        /// KV bytes of token `pos` of a sequence: a function of (request, pos) like a real model's.
        fn token_kv(req: u64, pos: usize) -> [u8; TOKEN_BYTES] {
            std::array::from_fn(|j| (req as usize * 131 + pos * 7 + j) as u8)
        }
        fn fill(&mut self, req: u64, table: &[u32], tokens: usize) {
            for pos in 0..tokens {
                let at = (table[pos / BS] as usize * BS + pos % BS) * TOKEN_BYTES;
                self.data[at..at + TOKEN_BYTES].copy_from_slice(&Self::token_kv(req, pos));
            }
        }
        fn token(&self, table: &[u32], pos: usize) -> &[u8] {
            let at = (table[pos / BS] as usize * BS + pos % BS) * TOKEN_BYTES;
            &self.data[at..at + TOKEN_BYTES]
        }
    }

    impl KvBlockIo for FakeKv {
        fn kv_layout(&self) -> KvLayout {
            KvLayout {
                layers: 1,
                kv_heads: 1,
                head_dim: 2,
                block_size: BS as u32,
                dtype: "f32".into(),
            }
        }
        fn read_block(
            &mut self,
            block: u32,
            tokens: usize,
        ) -> std::result::Result<Vec<u8>, String> {
            self.reads += 1;
            let at = block as usize * BS * TOKEN_BYTES;
            self.data
                .get(at..at + tokens * TOKEN_BYTES)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "out of range".into())
        }
        fn write_block(
            &mut self,
            block: u32,
            tokens: usize,
            bytes: &[u8],
        ) -> std::result::Result<(), String> {
            let at = block as usize * BS * TOKEN_BYTES;
            if bytes.len() != tokens * TOKEN_BYTES {
                return Err("wrong length".into());
            }
            self.data[at..at + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
    }

    struct FakeEngine {
        seqs: Vec<(u64, Vec<u32>, Vec<u32>)>, // (request, tokens, block table)
        step: u64,
    }

    impl EngineSnapshot for FakeEngine {
        fn machine_name(&self) -> String {
            "seed".into()
        }
        fn state_name(&self) -> String {
            "checkpoint".into()
        }
        fn slots(&self) -> [u32; 32] {
            [1; 32]
        }
        fn step(&self) -> u64 {
            self.step
        }
        fn live_sequences(&self) -> Vec<LiveSequence<'_>> {
            self.seqs
                .iter()
                .map(|(id, tokens, table)| LiveSequence {
                    request_id: *id,
                    tokens,
                    prompt_len: 3,
                    kv_tokens: tokens.len() - 1,
                    block_table: table,
                    generation: 0,
                    sampling: SamplingParams::greedy(100),
                    rng_state: vec![*id, tokens.len() as u64],
                    finish: FinishState::Running,
                })
                .collect()
        }
    }

    #[test]
    fn checkpoints_read_each_full_block_once_and_restore_bytes_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
        let mut cp = Checkpointer::new(store, KvMode::Blocks);
        let mut kv = FakeKv::new(16);
        // Two sequences: 10 and 6 tokens (9 and 5 in the cache).
        let mut eng = FakeEngine {
            seqs: vec![
                (1, (0..10).collect(), vec![3, 0, 7]),
                (2, (0..6).collect(), vec![5, 9]),
            ],
            step: 1,
        };
        for (id, tokens, table) in &eng.seqs {
            kv.fill(*id, table, tokens.len() - 1);
        }
        let p1 = cp.checkpoint(&eng, &mut kv).unwrap();
        // seq 1: 2 full + tail; seq 2: 1 full + tail.
        assert_eq!((kv.reads, p1.receipt.new_blocks), (5, 3));
        assert_eq!(p1.slot_words_before_bump[0], 0);
        // Both grow by 4 tokens: seq 1 fills block 7 and starts block 2; seq 2 fills block 9.
        eng.seqs[0].1.extend(10..14);
        eng.seqs[0].2.push(2);
        eng.seqs[1].1.extend(6..10);
        eng.seqs[1].2.push(11);
        for (id, tokens, table) in &eng.seqs {
            kv.fill(*id, table, tokens.len() - 1);
        }
        kv.reads = 0;
        let p2 = cp.checkpoint(&eng, &mut kv).unwrap();
        assert_eq!(
            kv.reads, 4,
            "only the two newly full blocks and two tails are read"
        );
        assert_eq!(p2.receipt.new_blocks, 2);
        assert_eq!(p2.slot_words_before_bump[0], 1);

        // Restore into a fresh cache with different physical blocks.
        let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
        let cp = Checkpointer::new(store, KvMode::Blocks);
        let mut fresh = FakeKv::new(16);
        let r = cp.latest(&fresh.kv_layout()).unwrap().unwrap();
        assert_eq!(restored_slots(&r)[7], 2);
        let tables = [vec![15u32, 14, 13, 12], vec![1u32, 4, 6]];
        for (seq, table) in r.snapshot.sequences.iter().zip(&tables) {
            let n = write_sequence_kv(&r, seq, table, &mut fresh).unwrap();
            let total = seq.prompt.len() + seq.output.len();
            assert_eq!(n, total - 1);
            for pos in 0..n {
                assert_eq!(
                    fresh.token(table, pos),
                    FakeKv::token_kv(seq.request_id, pos),
                    "req {} pos {pos}",
                    seq.request_id
                );
            }
        }
        // A mismatched layout is refused.
        let mut other = fresh.kv_layout();
        other.head_dim = 4;
        assert!(cp.latest(&other).is_err());
    }

    #[test]
    fn recompute_mode_stores_tokens_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
        let mut cp = Checkpointer::new(store, KvMode::Recompute);
        let mut kv = FakeKv::new(4);
        let eng = FakeEngine {
            seqs: vec![(1, (0..10).collect(), vec![3, 0, 2])],
            step: 1,
        };
        let p = cp.checkpoint(&eng, &mut kv).unwrap();
        assert_eq!((kv.reads, p.receipt.new_blocks), (0, 0));
        let r = cp.latest(&kv.kv_layout()).unwrap().unwrap();
        assert_eq!(
            r.snapshot.sequences[0].output,
            (3..10).collect::<Vec<u32>>()
        );
        assert_eq!(
            write_sequence_kv(&r, &r.snapshot.sequences[0], &[0, 1, 2], &mut kv).unwrap(),
            0
        );
    }
}
