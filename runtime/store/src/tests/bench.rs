//! Checkpoint micro-benchmark (ignored by default; run in release):
//! `cargo test -p sov --release --lib checkpoint::tests::bench -- --ignored --nocapture`.
//!
//! SmolLM2-135M-sized KV: 30 layers, 3 KV heads, head_dim 64, block_size 16, f32 — one block holds
//! K and V for 16 tokens over all layers, 30*2*3*64*16*4 = 737,280 bytes. Eight sequences with a
//! 128-token prompt decode 512 steps with a checkpoint every 64 steps; reported: bytes written per
//! checkpoint, write time (hashing, fsyncs, signing included), and restore time (open = full audit
//! re-hashing every stored block, then latest_valid reading back every referenced block). Write
//! time includes hashing the new blocks once (as the driver does), snapshot building excluded.

use std::time::Instant;

use crate::fixture::sample;
use crate::fixture::{MODEL, SPEC, key};
use crate::{CheckpointStore, KvLayout, KvMode, SequenceSnapshot, Snapshot, block_hash};

const LAYERS: usize = 30;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;
const BLOCK_BYTES: usize = LAYERS * 2 * KV_HEADS * HEAD_DIM * BLOCK * 4;
const SEQS: usize = 8;
const PROMPT: usize = 128;
const STEPS: usize = 512;
const EVERY: usize = 64;

/// Pseudo-random block bytes (distinct per sequence and block): [BLOCK_BYTES] u8.
fn block_bytes(seq: usize, block: usize, tokens: usize) -> Vec<u8> {
    let mut x = (seq as u64 * 1_000_003 + block as u64 * 7919 + tokens as u64) | 1;
    (0..BLOCK_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn snapshot(mode: KvMode, tokens: usize, hashes: &[Vec<[u8; 32]>]) -> Snapshot {
    let mut s = sample(vec![]);
    s.kv_mode = mode;
    s.kv_layout = KvLayout {
        layers: LAYERS as u32,
        kv_heads: KV_HEADS as u32,
        head_dim: HEAD_DIM as u32,
        block_size: BLOCK as u32,
        dtype: "f32".into(),
    };
    let template = s.sequences[0].clone();
    s.sequences = (0..SEQS)
        .map(|i| {
            let tail_tokens = tokens % BLOCK;
            SequenceSnapshot {
                request_id: i as u64,
                prompt: vec![1; PROMPT],
                output: vec![2; tokens - PROMPT],
                blocks: if mode == KvMode::Blocks {
                    hashes[i].clone()
                } else {
                    vec![]
                },
                tail: if mode == KvMode::Blocks && tail_tokens > 0 {
                    block_bytes(i, usize::MAX, tokens)[..tail_tokens * BLOCK_BYTES / BLOCK].to_vec()
                } else {
                    vec![]
                },
                tail_tokens: tail_tokens as u32,
                ..template.clone()
            }
        })
        .collect();
    s
}

fn run(mode: KvMode) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    let mut hashes: Vec<Vec<[u8; 32]>> = vec![Vec::new(); SEQS];
    let mut written = Vec::new();
    let mut times = Vec::new();
    for step in (EVERY..=STEPS).step_by(EVERY) {
        let tokens = PROMPT + step;
        // Blocks filled since the last checkpoint; like the driver, hash each once (timed).
        let mut new_blocks = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            for b in h.len()..tokens / BLOCK {
                new_blocks.push((i, block_bytes(i, b, 0)));
            }
        }
        let t = Instant::now();
        let mut refs: Vec<([u8; 32], &[u8])> = Vec::new();
        for (i, bytes) in &new_blocks {
            let hash = block_hash(bytes);
            hashes[*i].push(hash);
            if mode == KvMode::Blocks {
                refs.push((hash, bytes.as_slice()));
            }
        }
        let snap = snapshot(mode, tokens, &hashes);
        let info = store.write_hashed(&snap, &refs).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        written.push(info.bytes_written);
    }
    drop(store);
    let t = Instant::now();
    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let r = store.latest_valid().unwrap().unwrap();
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let total_kv = SEQS * (PROMPT + STEPS) * BLOCK_BYTES / BLOCK;
    let steady: Vec<u64> = written[1..].to_vec();
    println!(
        "{mode:?}: block {BLOCK_BYTES} B; {} checkpoints; first {:.2} MB, then mean {:.2} MB per checkpoint \
         (full KV at the end {:.1} MB); write ms mean {:.1} max {:.1}; restore: open+audit {open_ms:.1} ms, \
         latest_valid {load_ms:.1} ms ({} blocks, {:.1} MB)",
        written.len(),
        written[0] as f64 / 1e6,
        steady.iter().sum::<u64>() as f64 / steady.len() as f64 / 1e6,
        total_kv as f64 / 1e6,
        times.iter().sum::<f64>() / times.len() as f64,
        times.iter().cloned().fold(0.0, f64::max),
        r.blocks.len(),
        r.blocks.values().map(|b| b.len()).sum::<usize>() as f64 / 1e6,
    );
}

#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn checkpoint_cost_smollm2_135m_kv() {
    run(KvMode::Blocks);
    run(KvMode::Recompute);
}

/// The verifiable log's costs: one head signature, appending a leaf, a group commit end to end
/// (journal fsync + head fsync), rebuilding the tree at open, proof and receipt sizes.
/// `cargo test -p sov-store --release --lib log_costs -- --ignored --nocapture`
#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn log_costs() {
    use crate::head::{self, TreeHead, origin_for};
    use crate::merkle::{Tree, leaf_hash};

    let per = |t: Instant, n: usize| t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let head = TreeHead {
        origin: origin_for(&[1; 32]),
        size: 123_456,
        root: [2; 32],
        spec: SPEC,
        model: MODEL,
        checkpoint: None,
        backend: Some("cpu".into()),
        precision: Some("f32".into()),
        sampler: Some("draw-1".into()),
    };
    let k = key();
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(head::sign(&head, &k).unwrap());
    }
    let sign_us = per(t, n);
    let record = crate::journal::encode_body(&crate::journal::JournalRecord::Finished(
        crate::fixture::finished(1, &"token ".repeat(40)),
    ))
    .unwrap();
    let leaves = 1 << 20;
    let t = Instant::now();
    let mut tree = Tree::default();
    for i in 0..leaves {
        let mut r = record.clone();
        r[0] = i as u8;
        tree.push(leaf_hash(&r));
    }
    let append_us = per(t, leaves);
    let t = Instant::now();
    let rebuilt = Tree::from_leaves(tree.leaves().iter().copied());
    let rebuild_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let m = 1000;
    for i in 0..m {
        std::hint::black_box(rebuilt.inclusion_proof(i * 997, rebuilt.size()).unwrap());
    }
    let proof_us = per(t, m as usize);
    // One head as the store signs it: a leaf appended, the root at the new size, the Ed25519
    // signature over the note, the head record appended to heads.log and fsynced.
    let hdir = tempfile::tempdir().unwrap();
    let mut heads_log = crate::tlog::HeadsLog::new(hdir.path());
    let mut grow = Tree::from_leaves(tree.leaves()[..1 << 16].iter().copied());
    let heads = 300;
    let (mut root_ns, mut sign_ns, mut fsync_ns) = (0u128, 0u128, 0u128);
    let t_all = Instant::now();
    for i in 0..heads {
        let t = Instant::now();
        grow.push(leaf_hash(&(i as u64).to_le_bytes()));
        let root = grow.root(grow.size()).unwrap();
        root_ns += t.elapsed().as_nanos();
        let t = Instant::now();
        let note = head::sign(
            &TreeHead {
                size: grow.size(),
                root,
                ..head.clone()
            },
            &k,
        )
        .unwrap();
        sign_ns += t.elapsed().as_nanos();
        let t = Instant::now();
        heads_log
            .append(&crate::tlog::HeadRecord {
                note,
                leaves: grow.leaves()[grow.leaves().len() - 1..].to_vec(),
            })
            .unwrap();
        fsync_ns += t.elapsed().as_nanos();
    }
    let head_us = per(t_all, heads);
    let avg = |ns: u128| ns as f64 / 1e3 / heads as f64;
    println!(
        "one head at 2^16 leaves ({heads} heads): {head_us:.0} us = root update {:.1} us + Ed25519 sign {:.1} us + heads.log append+fsync {:.0} us",
        avg(root_ns),
        avg(sign_ns),
        avg(fsync_ns)
    );
    let dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    store.begin_session().unwrap();
    let commits = 200;
    let mut receipt = None;
    let t = Instant::now();
    for i in 0..commits {
        let f = crate::fixture::finished(i, "a short answer");
        store.accept(&crate::fixture::request(i)).unwrap();
        receipt = store.finish(&[f]).unwrap().pop();
    }
    let commit_us = per(t, commits as usize);
    let receipt_json = serde_json::to_string(&receipt.unwrap()).unwrap().len();
    drop(store);
    let t = Instant::now();
    CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let sizes: Vec<String> = [10u64, 1000, 1 << 20]
        .iter()
        .map(|&s| {
            let p = rebuilt.inclusion_proof(s / 2, s).unwrap().len();
            let c = rebuilt.consistency_proof(s / 3, s).unwrap().len();
            format!(
                "size {s}: inclusion {p} hashes ({} B base64), consistency {c}",
                p * 44
            )
        })
        .collect();
    println!(
        "head signature {sign_us:.1} us; leaf append (SHA-256 of a {} B record + tree) {append_us:.2} us; \
         rebuild of {leaves} leaves {rebuild_ms:.0} ms; inclusion proof at 2^20 {proof_us:.1} us; \
         group commit of 1 finished + accept (3 fsyncs, 1 signature) {commit_us:.0} us; \
         open+audit after {commits} commits ({} records) {open_ms:.1} ms; receipt JSON {receipt_json} B; {}",
        record.len(),
        1 + 2 * commits,
        sizes.join("; ")
    );
}
