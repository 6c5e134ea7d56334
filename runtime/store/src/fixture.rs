//! A small real checkpoint directory for the whole-directory tests: three checkpoints over two
//! sequences with shared and new blocks, journaled requests before and after the last checkpoint,
//! two finished requests with their receipts, and the signed heads over it all.

use std::path::Path;

use ed25519_dalek::SigningKey;

use crate::snapshot::{FinishState, KvLayout, KvMode, SequenceSnapshot};
use crate::{
    CheckpointStore, Digest, FinishedRecord, ReceiptInfo, RequestRecord, ResponseReceipt,
    SamplingParams, Snapshot, block_hash,
};

pub const SPEC: Digest = [0x51; 32];
pub const MODEL: Digest = [0x4d; 32];

pub fn key() -> SigningKey {
    SigningKey::from_bytes(&[0x11; 32])
}

pub fn other_key() -> SigningKey {
    SigningKey::from_bytes(&[0x22; 32])
}

/// Deterministic block bytes: [64] u8.
pub fn block(i: u8) -> Vec<u8> {
    (0..64u8)
        .map(|j| j.wrapping_mul(31).wrapping_add(i))
        .collect()
}

pub fn request(id: u64) -> RequestRecord {
    RequestRecord {
        request_id: id,
        prompt: vec![1, 2, 3, id as u32],
        sampling: SamplingParams {
            temperature: 0.8,
            seed: id,
            ..SamplingParams::greedy(32)
        },
        accepted_ms: 1000 + id,
        extra: vec![],
    }
}

/// Snapshot at checkpoint `k` (1-based): sequence 7 holds blocks 0..k, sequence 8 shares block 0.
pub fn snapshot_at(k: u8) -> Snapshot {
    let mut s = sample((0..k).map(|i| block_hash(&block(i))).collect());
    s.step = u64::from(k) * 64;
    s.slots[2] = u32::from(k);
    let mut second = s.sequences[0].clone();
    second.request_id = 8;
    second.blocks = vec![block_hash(&block(0))];
    second.output = vec![4; k as usize];
    s.sequences.push(second);
    s
}

/// Write checkpoint `k` to `store`, supplying all its blocks (the store dedups).
pub fn checkpoint(store: &mut CheckpointStore, k: u8) -> ReceiptInfo {
    let blocks: Vec<Vec<u8>> = (0..k).map(block).collect();
    let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    store.write(&snapshot_at(k), &refs).unwrap()
}

/// What request `id` delivered in the fixture.
pub fn finished(id: u64, text: &str) -> FinishedRecord {
    FinishedRecord {
        request_id: id,
        output: text.bytes().map(u32::from).collect(),
        text: text.into(),
        reason: "stop".into(),
        detail: "Eos".into(),
    }
}

/// The standard directory: a session; request 7, 8 accepted; 7 finished; checkpoints 1, 2;
/// 8 finished; checkpoint 3; request 9 accepted after (the unsigned tail).
pub fn build(dir: &Path) -> Vec<ReceiptInfo> {
    build_with_receipts(dir).0
}

/// [`build`], also returning the finished records with their receipts.
pub fn build_with_receipts(
    dir: &Path,
) -> (Vec<ReceiptInfo>, Vec<(FinishedRecord, ResponseReceipt)>) {
    build_texts(dir, ["seven", "eight"])
}

/// [`build_with_receipts`] with these texts for requests 7 and 8.
pub fn build_texts(
    dir: &Path,
    texts: [&str; 2],
) -> (Vec<ReceiptInfo>, Vec<(FinishedRecord, ResponseReceipt)>) {
    let mut store = CheckpointStore::open(dir, key(), SPEC, MODEL).unwrap();
    store.begin_session().unwrap();
    store.accept(&request(7)).unwrap();
    store.accept(&request(8)).unwrap();
    let mut done = Vec::new();
    let f7 = finished(7, texts[0]);
    done.push((f7.clone(), store.finish(&[f7]).unwrap().remove(0)));
    let mut infos = Vec::new();
    for k in 1..=2 {
        infos.push(checkpoint(&mut store, k));
    }
    let f8 = finished(8, texts[1]);
    done.push((f8.clone(), store.finish(&[f8]).unwrap().remove(0)));
    infos.push(checkpoint(&mut store, 3));
    store.accept(&request(9)).unwrap();
    (infos, done)
}

/// All regular files of a directory with their bytes, sorted by name.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Replace a directory's contents with `files`.
pub fn restore(dir: &Path, files: &[(String, Vec<u8>)]) {
    for e in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// A small, fully populated snapshot for tests across the checkpoint module.
pub fn sample(blocks: Vec<Digest>) -> Snapshot {
    Snapshot {
        machine: "scheduler".into(),
        state: "Generate".into(),
        slots: std::array::from_fn(|i| i as u32 * 3),
        step: 128,
        kv_mode: KvMode::Blocks,
        kv_layout: KvLayout {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            block_size: 16,
            dtype: "f32".into(),
        },
        sequences: vec![SequenceSnapshot {
            request_id: 7,
            prompt: vec![1, 2, 3],
            output: vec![9, 8],
            sampling: SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                seed: 42,
                logprobs: Some(2),
                stop: vec![
                    "

"
                    .into(),
                ],
                ..SamplingParams::greedy(64)
            },
            rng_state: vec![0xdead_beef, 17],
            finish: FinishState::Running,
            blocks,
            tail: vec![1, 2, 3, 4],
            tail_tokens: 1,
        }],
        engine_extra: vec![5, 6],
    }
}
