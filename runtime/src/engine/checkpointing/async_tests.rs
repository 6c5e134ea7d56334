//! Asynchronous `Blocks`-mode checkpoints against the synchronous driver (the store's
//! `Checkpointer::checkpoint`, which reads every block with `read_block`): on a tiny random Llama
//! on the CPU, at several points of a run, both write the same sequences, block hashes and partial
//! tails; a resume from the asynchronous store finishes every request exactly as an uninterrupted
//! run; periodic checkpoints are deferred while one is in flight, and the one that follows
//! stages every block the deferred ones would have (none lost; resume exact).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::async_blocks::{AsyncBlocks, block_bytes_of};
use super::core_io::{checkpoint_core, restore_core};
use super::resume_tests::{llama_kv, requests, rig, tiny_llama};
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo, StagedBlocks};
use crate::checkpoint::fixture::{MODEL, SPEC, key};
use crate::checkpoint::snapshot::{KvLayout, Snapshot};
use crate::checkpoint::{CheckpointStore, KvMode};
use crate::engine::forward::ForwardModel;
use crate::model::batch::SeqChunk;
use crate::runner::LlamaRunner;
use crate::scheduler::Machine;
use crate::scheduler::seed::Scheduler;

fn store(dir: &std::path::Path) -> Checkpointer {
    Checkpointer::new(
        CheckpointStore::open(dir, key(), SPEC, MODEL).unwrap(),
        KvMode::Blocks,
    )
}

fn newest(dir: &std::path::Path) -> Snapshot {
    let s = CheckpointStore::open(dir, key(), SPEC, MODEL).unwrap();
    s.latest_valid().unwrap().expect("a checkpoint").snapshot
}

#[test]
fn async_checkpoints_equal_synchronous_ones_and_resume_exactly() {
    let vocab = tiny_llama().vocab_size();
    let reqs = requests(vocab);
    let mut reference = rig(tiny_llama());
    for (i, r) in reqs.iter().enumerate() {
        reference.submit(i as u64 + 1, r.clone(), None);
    }
    let want = reference.finish();

    let (sync_dir, async_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sync_cp = store(sync_dir.path());
    let async_cp = Arc::new(Mutex::new(store(async_dir.path())));
    let mut writer = AsyncBlocks::start(async_cp.clone()).unwrap();
    let mut run = rig(tiny_llama());
    for (i, r) in reqs.iter().enumerate() {
        run.submit(i as u64 + 1, r.clone(), Some(&mut sync_cp));
    }
    let mut heights = Vec::new();
    for (n, cut) in [3usize, 12, 20, 31].into_iter().enumerate() {
        while (run.core.decode_steps() as usize) < cut && !run.core.is_idle() {
            run.step();
        }
        checkpoint_core(
            &mut sync_cp,
            &mut run.core,
            Scheduler::NAME,
            run.machine.state_name(),
            llama_kv,
            &|_| Vec::new(),
        )
        .unwrap();
        heights.push(writer.checkpoint(&mut run.core, &|_| Vec::new()).unwrap());
        // Two checkpoints in flight at once before the writer is asked for them.
        if n % 2 == 1 {
            let w = writer.poll(true).unwrap().expect("written");
            assert_eq!(w.receipt.height, heights[n]);
            let (a, b) = (newest(sync_dir.path()), newest(async_dir.path()));
            assert_eq!(a.sequences, b.sequences, "checkpoint {n} at step {cut}");
            assert_eq!(a.step, b.step);
            assert!(
                a.sequences
                    .iter()
                    .any(|s| !s.blocks.is_empty() && s.tail_tokens > 0)
            );
        }
    }
    assert_eq!(heights, vec![1, 2, 3, 4]);
    assert_eq!(writer.in_flight(), 0);
    assert!(writer.totals().bytes_written > 0);
    drop(writer);
    drop(run);

    // A resume from the asynchronous store's newest checkpoint finishes exactly.
    let restored = CheckpointStore::open(async_dir.path(), key(), SPEC, MODEL)
        .unwrap()
        .latest_valid()
        .unwrap()
        .expect("a checkpoint");
    let mut second = rig(tiny_llama());
    let mut rxs = BTreeMap::new();
    restore_core(&mut second.core, &restored, llama_kv, &mut |id| {
        let (tx, rx) = mpsc::channel();
        rxs.insert(id, rx);
        tx
    })
    .unwrap();
    second.rx = rxs;
    second.machine.set_state_by_name("prefill").unwrap();
    for (id, tokens) in second.finish() {
        assert_eq!(
            Some(&tokens),
            want.get(&id),
            "request {id} after an async checkpoint"
        );
    }
}

/// The tiny Llama with its staged reads counted (alive now) and their copies held back until
/// `gate` opens (a writer that cannot keep up).
struct Gated {
    inner: LlamaRunner<CpuBackend>,
    alive: Arc<AtomicUsize>,
    gate: Arc<AtomicBool>,
}

struct GatedRead {
    bytes: Box<dyn StagedBlocks>,
    alive: Arc<AtomicUsize>,
    gate: Arc<AtomicBool>,
}

impl StagedBlocks for GatedRead {
    fn wait(&mut self) -> Result<&[u8], String> {
        while !self.gate.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1)); // a slow disk
        }
        self.bytes.wait()
    }
}

impl Drop for GatedRead {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

impl KvBlockIo for Gated {
    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }
    fn read_block(&mut self, block: u32, tokens: usize) -> Result<Vec<u8>, String> {
        self.inner.read_block(block, tokens)
    }
    fn write_block(&mut self, block: u32, tokens: usize, bytes: &[u8]) -> Result<(), String> {
        self.inner.write_block(block, tokens, bytes)
    }
    fn read_blocks(&mut self, blocks: &[u32]) -> Result<Box<dyn StagedBlocks>, String> {
        self.alive.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(GatedRead {
            bytes: self.inner.read_blocks(blocks)?,
            alive: self.alive.clone(),
            gate: self.gate.clone(),
        }))
    }
}

impl ForwardModel for Gated {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        self.inner.forward(chunks)
    }
    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        Some(self)
    }
}

fn gated_kv(m: &mut Gated) -> Option<&mut dyn KvBlockIo> {
    Some(m)
}

/// Full blocks named by a snapshot, over all its sequences.
fn full_blocks(s: &Snapshot) -> usize {
    s.sequences.iter().map(|q| q.blocks.len()).sum()
}

#[test]
fn deferred_checkpoints_lose_no_block_and_resume_exactly() {
    let vocab = tiny_llama().vocab_size();
    let reqs = requests(vocab);
    let mut reference = rig(tiny_llama());
    for (i, r) in reqs.iter().enumerate() {
        reference.submit(i as u64 + 1, r.clone(), None);
    }
    let want = reference.finish();

    let alive = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(AtomicBool::new(false));
    let model = Gated {
        inner: tiny_llama(),
        alive: alive.clone(),
        gate: gate.clone(),
    };
    let (sync_dir, async_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sync_cp = store(sync_dir.path());
    let mut writer = AsyncBlocks::start(Arc::new(Mutex::new(store(async_dir.path())))).unwrap();
    let mut run = rig(model);
    for (i, r) in reqs.iter().enumerate() {
        run.submit(i as u64 + 1, r.clone(), Some(&mut sync_cp));
    }
    let to = |run: &mut super::resume_tests::Rig<Gated>, cut: u64| {
        while run.core.decode_steps() < cut && !run.core.is_idle() {
            run.step();
        }
    };
    let mut sync_now = |run: &mut super::resume_tests::Rig<Gated>| {
        checkpoint_core(
            &mut sync_cp,
            &mut run.core,
            Scheduler::NAME,
            run.machine.state_name(),
            gated_kv,
            &|_| Vec::new(),
        )
        .unwrap();
    };
    to(&mut run, 4);
    assert_eq!(
        writer
            .try_checkpoint(&mut run.core, &|_| Vec::new())
            .unwrap(),
        Some(1)
    );
    sync_now(&mut run);
    // The writer cannot finish (its copies are held back): the next two are deferred, and
    // nothing more is staged meanwhile.
    for cut in [9, 14] {
        to(&mut run, cut);
        assert_eq!(
            writer
                .try_checkpoint(&mut run.core, &|_| Vec::new())
                .unwrap(),
            None
        );
    }
    assert_eq!(writer.totals().deferred, 2);
    assert_eq!(writer.in_flight(), 1);
    gate.store(true, Ordering::SeqCst);
    assert_eq!(
        writer.poll(true).unwrap().expect("written").receipt.height,
        1
    );
    let first = newest(async_dir.path());
    assert_eq!(first.sequences, newest(sync_dir.path()).sequences);
    // The next checkpoint stages the blocks filled while the other two were deferred.
    to(&mut run, 20);
    assert_eq!(
        writer
            .try_checkpoint(&mut run.core, &|_| Vec::new())
            .unwrap(),
        Some(2)
    );
    sync_now(&mut run);
    assert_eq!(
        writer.poll(true).unwrap().expect("written").receipt.height,
        2
    );
    let second = newest(async_dir.path());
    assert_eq!(second.sequences, newest(sync_dir.path()).sequences);
    assert_eq!(second.step, 20);
    assert!(
        full_blocks(&second) > full_blocks(&first),
        "no block filled between steps 4 and 20 ({} vs {})",
        full_blocks(&second),
        full_blocks(&first)
    );
    assert_eq!(writer.totals().checkpoints, 2);
    drop(writer);
    drop(run);
    assert_eq!(alive.load(Ordering::SeqCst), 0);

    // A resume from the newest checkpoint (after the deferrals) finishes exactly.
    let restored = CheckpointStore::open(async_dir.path(), key(), SPEC, MODEL)
        .unwrap()
        .latest_valid()
        .unwrap()
        .expect("a checkpoint");
    let mut second = rig(tiny_llama());
    let mut rxs = BTreeMap::new();
    restore_core(&mut second.core, &restored, llama_kv, &mut |id| {
        let (tx, rx) = mpsc::channel();
        rxs.insert(id, rx);
        tx
    })
    .unwrap();
    second.rx = rxs;
    second.machine.set_state_by_name("prefill").unwrap();
    for (id, tokens) in second.finish() {
        assert_eq!(
            Some(&tokens),
            want.get(&id),
            "request {id} after deferred checkpoints"
        );
    }
}

#[test]
fn block_bytes_count_e4m3_rows_with_their_scales() {
    let layout = |dtype: &str| KvLayout {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        block_size: 16,
        dtype: dtype.into(),
    };
    assert_eq!(block_bytes_of(&layout("bf16")).unwrap(), 32 * 2 * 16 * 2048);
    // 1024 codes and 8 f32 scales a row (`--kv-dtype fp8`).
    assert_eq!(
        block_bytes_of(&layout("f8e4m3g16")).unwrap(),
        32 * 2 * 16 * 1056
    );
    assert_eq!(block_bytes_of(&layout("f32")).unwrap(), 32 * 2 * 16 * 4096);
    assert!(block_bytes_of(&layout("int4")).is_err());
}
