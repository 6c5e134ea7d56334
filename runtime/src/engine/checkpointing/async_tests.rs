//! Asynchronous `Blocks`-mode checkpoints against the synchronous driver (the store's
//! `Checkpointer::checkpoint`, which reads every block with `read_block`): on a tiny random Llama
//! on the CPU, at several points of a run, both write the same sequences, block hashes and partial
//! tails; a resume from the asynchronous store finishes every request exactly as an uninterrupted
//! run; and the staged reads in flight stay bounded when a checkpoint needs many pieces.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::async_blocks::{AsyncBlocks, PIECES_QUEUED};
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

/// The tiny Llama with its staged reads counted (alive now, most alive at once).
struct Counted {
    inner: LlamaRunner<CpuBackend>,
    alive: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

struct CountedRead {
    bytes: Box<dyn StagedBlocks>,
    alive: Arc<AtomicUsize>,
}

impl StagedBlocks for CountedRead {
    fn wait(&mut self) -> Result<&[u8], String> {
        std::thread::sleep(std::time::Duration::from_millis(2)); // a slow device copy
        self.bytes.wait()
    }
}

impl Drop for CountedRead {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

impl KvBlockIo for Counted {
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
        let n = self.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        Ok(Box::new(CountedRead {
            bytes: self.inner.read_blocks(blocks)?,
            alive: self.alive.clone(),
        }))
    }
}

impl ForwardModel for Counted {
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

#[test]
fn staged_reads_in_flight_stay_bounded() {
    let alive = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let model = Counted {
        inner: tiny_llama(),
        alive: alive.clone(),
        most: most.clone(),
    };
    let block_bytes = {
        let l = model.inner.kv_layout();
        (l.layers * 2 * l.block_size * l.kv_heads * l.head_dim * 4) as usize
    };
    let vocab = model.vocab_size();
    let mut run = rig(model);
    for (i, r) in requests(vocab).into_iter().enumerate() {
        run.submit(i as u64 + 1, r, None);
    }
    while run.core.decode_steps() < 30 {
        run.step();
    }
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(Mutex::new(store(dir.path())));
    // One block per piece: a checkpoint of many pieces.
    let mut writer = AsyncBlocks::start(cp)
        .unwrap()
        .with_piece_bytes(block_bytes);
    for _ in 0..3 {
        writer.checkpoint(&mut run.core, &|_| Vec::new()).unwrap();
    }
    writer.poll(true).unwrap().expect("written");
    let pieces = writer.totals().bytes_read as usize / block_bytes;
    assert!(pieces > 3 * (PIECES_QUEUED + 2), "{pieces} pieces");
    // Queued, one the writer holds, one the action holds while it waits to queue it.
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PIECES_QUEUED + 2,
        "{most} staged reads alive at once"
    );
    assert_eq!(alive.load(Ordering::SeqCst), 0);
}
