//! KV memory under pressure and prefix caching, on a tiny random Llama on the CPU backend driven
//! step by step by the default machine: outputs must equal each request run alone (greedy and
//! seeded), with and without the prefix cache, whether a sequence was swapped to host memory,
//! recomputed, or read its prefix from blocks another request computed; spilled to the swap file
//! beyond the host pool, which is gone once nothing is swapped out.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::checkpointing::core_io::{checkpoint_core, request_record, restore_core};
use super::codec::ByteCodec;
use super::core::{CoreConfig, EngineCore};
use super::intake::{IntakeLimits, build_sequence};
use super::kv_policy::{KvCounters, KvPolicy};
use super::output::{FinishReason, Output};
use super::prefix_cache::CacheSalt;
use super::swap_spill::SPILL_FILE;
use super::{EngineError, Prompt, Request, SamplingParams};
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo};
use crate::checkpoint::fixture::{MODEL, SPEC, key};
use crate::checkpoint::{CheckpointStore, KvMode};
use crate::model::LlamaModel;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::runner::LlamaRunner;
use crate::scheduler::seed::Scheduler;
use crate::scheduler::{Machine, Slots};

const BS: usize = 16;

struct Rig {
    core: EngineCore<LlamaRunner<CpuBackend>>,
    machine: Scheduler,
    slots: Slots,
    limits: IntakeLimits,
    next_id: u64,
}

fn rig(num_blocks: usize, kv: KvPolicy) -> Rig {
    let config = tiny_config();
    let weights = random_weights(&config, 11, WeightDtype::F32);
    let model = LlamaModel::new(CpuBackend::new(), &config, &weights).unwrap();
    let runner = LlamaRunner::new(model, num_blocks, BS).unwrap();
    let context_len = 2048.min(num_blocks * BS);
    let cfg = CoreConfig {
        num_blocks,
        block_size: BS,
        max_batch: 64,
        max_prefill_tokens: 256,
        context_len,
        max_tokens_cap: 2048,
        eos_ids: vec![],
        kv,
    };
    let limits = IntakeLimits {
        context_len,
        vocab_size: config.vocab_size,
        num_blocks,
        block_size: BS,
        max_tokens_cap: 2048,
    };
    let slots = Slots::new();
    Rig {
        core: EngineCore::new(runner, Arc::new(ByteCodec), cfg, slots.clone()),
        machine: Scheduler::new(),
        slots,
        limits,
        next_id: 1,
    }
}

fn policy(prefix_cache: bool, swap_blocks: usize) -> KvPolicy {
    KvPolicy {
        prefix_cache,
        swap_blocks,
        spill_blocks: 0,
        spill_path: None,
        salt: CacheSalt::of(&[b"tiny random llama, seed 11"]),
    }
}

/// A host pool of `host` blocks and a swap file of `file` blocks in `dir`.
fn spill_policy(dir: &std::path::Path, host: usize, file: usize) -> KvPolicy {
    KvPolicy {
        spill_blocks: file,
        spill_path: Some(dir.join(SPILL_FILE)),
        ..policy(true, host)
    }
}

impl Rig {
    fn submit(&mut self, req: Request) -> Result<Receiver<Output>, EngineError> {
        self.submit_journaled(req, None)
    }

    /// Submits `req`, journaling it in `journal` first when given (as the engine's handle does).
    fn submit_journaled(
        &mut self,
        req: Request,
        journal: Option<&mut Checkpointer>,
    ) -> Result<Receiver<Output>, EngineError> {
        let (tx, rx) = mpsc::channel();
        let seq = build_sequence(self.next_id, req, &ByteCodec, &self.limits, tx)?;
        if let Some(j) = journal {
            j.accept(&request_record(&seq, Vec::new())).unwrap();
        }
        self.next_id += 1;
        self.core.enqueue(seq);
        Ok(rx)
    }

    fn step(&mut self) {
        self.core.publish();
        self.machine.step(&mut self.core, &self.slots).unwrap();
    }

    /// Steps until idle, checking after every step that the `kv_blocks_used` slot counts exactly
    /// the distinct blocks the running sequences hold.
    fn run(&mut self) {
        for _ in 0..100_000 {
            self.core.publish();
            self.machine.step(&mut self.core, &self.slots).unwrap();
            self.core.publish();
            let held: HashSet<u32> = self
                .core
                .running
                .iter()
                .flat_map(|s| s.block_table.iter().copied())
                .collect();
            assert_eq!(self.slots.kv_blocks_used() as usize, held.len());
            assert!(held.len() <= self.core.blocks.total());
            if self.core.is_idle() {
                assert_eq!(self.core.blocks.used(), 0, "every block free at the end");
                return;
            }
        }
        panic!("not idle after 100000 steps");
    }

    fn counters(&self) -> KvCounters {
        self.core.kv_counters()
    }
}

fn collect(rx: &Receiver<Output>) -> Vec<u32> {
    let mut tokens = Vec::new();
    loop {
        let out = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("stream ended without a final event");
        tokens.extend(&out.tokens);
        if let Some(f) = out.finished {
            assert_eq!(f.reason, FinishReason::Length);
            return tokens;
        }
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize, i: usize) -> Request {
    let mut r = Request::new(Prompt::Tokens(prompt), max_tokens);
    r.ignore_eos = true;
    r.sampling = if i.is_multiple_of(2) {
        SamplingParams::greedy()
    } else {
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(1000 + i as u64),
            ..SamplingParams::default()
        }
    };
    r
}

fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((seed * 7919 + j * 131 + j * j) % 509) as u32 + 1)
        .collect()
}

/// Each request alone on a roomy cache without the prefix cache.
fn solo(reqs: &[Request]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| {
            let mut rig = rig(256, policy(false, 0));
            let rx = rig.submit(r.clone()).unwrap();
            rig.run();
            collect(&rx)
        })
        .collect()
}

fn run_all(rig: &mut Rig, reqs: &[Request]) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| rig.submit(r.clone()).unwrap())
        .collect();
    rig.run();
    rxs.iter().map(collect).collect()
}

#[test]
fn shared_system_prompt_is_prefilled_once_and_outputs_do_not_change() {
    // 32 requests: a 512-token system prompt (32 blocks) and a user turn of 3..34 tokens; one
    // request is the system prompt alone (a whole number of blocks).
    let system = tokens(1, 512);
    let reqs: Vec<Request> = (0..32)
        .map(|i| {
            let mut p = system.clone();
            if i != 5 {
                p.extend(tokens(100 + i, 3 + i));
            }
            request(p, 6, i)
        })
        .collect();
    let mut off = rig(1200, policy(false, 0));
    let want = run_all(&mut off, &reqs);
    assert_eq!(off.counters().prefix_hit_tokens, 0);
    let mut on = rig(1200, policy(true, 0));
    let got = run_all(&mut on, &reqs);
    assert_eq!(got, want, "prefix cache changed outputs");
    let c = on.counters();
    // The first request prefills the system prompt; the 30 others with a user turn read all 32
    // of its blocks; the system prompt alone reads 31 (its last block holds its last token).
    assert_eq!(c.prefix_hit_tokens, 30 * 512 + 31 * 16);
    let queried: usize = reqs
        .iter()
        .map(|r| match &r.prompt {
            Prompt::Tokens(t) => t.len(),
            Prompt::Text(_) => 0,
        })
        .sum();
    assert_eq!(c.prefix_query_tokens, queried as u64);

    // Later requests: the very same prompts (fully cached but for their last block) and a
    // prompt of exactly 33 blocks, run after the cache is warm.
    let mut again: Vec<Request> = reqs[..4].to_vec();
    let mut exact = system.clone();
    exact.extend(tokens(7, 16));
    again.push(request(exact, 6, 1));
    let before = on.counters().prefix_hit_tokens;
    let got = run_all(&mut on, &again);
    assert_eq!(got[..4], want[..4]);
    let mut cold = rig(1200, policy(false, 0));
    assert_eq!(got, run_all(&mut cold, &again));
    assert!(on.counters().prefix_hit_tokens - before >= 4 * 512 + 512);
}

#[test]
fn eviction_under_pressure_keeps_outputs() {
    // A cache of 48 blocks: a handful of 8-block prompts in families sharing 4 blocks; cached
    // blocks must be evicted (never a shared block overwritten) as others arrive.
    let reqs: Vec<Request> = (0..16)
        .map(|i| {
            let mut p = tokens(i % 3, 64);
            p.extend(tokens(50 + i, 60));
            request(p, 20, i)
        })
        .collect();
    let want = solo(&reqs);
    let mut on = rig(48, policy(true, 0));
    assert_eq!(run_all(&mut on, &reqs), want);
    assert!(on.counters().prefix_hit_tokens > 0);
}

#[test]
fn dozens_of_long_requests_on_a_tiny_cache_swap_and_recompute_exactly() {
    // 24 requests of 60..130 prompt tokens and 48 new ones on a cache of 40 blocks (640 tokens:
    // about four such sequences), with a swap pool of 10 blocks (one sequence or so): both swapping and recomputation
    // must happen, and every output must equal the request run alone.
    let reqs: Vec<Request> = (0..24)
        .map(|i| request(tokens(200 + i, 60 + 3 * i), 48, i))
        .collect();
    let want = solo(&reqs);
    let mut r = rig(40, policy(true, 10));
    assert_eq!(run_all(&mut r, &reqs), want);
    let c = r.counters();
    assert!(c.swapped_out > 0 && c.blocks_swapped_out > 0, "{c:?}");
    assert_eq!(c.blocks_swapped_in, c.blocks_swapped_out, "{c:?}");
    assert!(c.recomputed > 0, "{c:?}");
    assert_eq!(
        r.core.totals().preemptions,
        c.swapped_out + c.recomputed,
        "{c:?}"
    );
}

#[test]
fn a_request_larger_than_the_whole_cache_is_refused_and_the_rest_complete() {
    let mut r = rig(8, policy(true, 8));
    let small: Vec<Request> = (0..3).map(|i| request(tokens(i, 20), 10, i)).collect();
    let rxs: Vec<_> = small.iter().map(|q| r.submit(q.clone()).unwrap()).collect();
    let err = r.submit(request(tokens(9, 8 * BS), 4, 0)).unwrap_err();
    assert_eq!(
        err,
        EngineError::PromptExceedsCache {
            needed: 9,
            total: 8
        }
    );
    assert_eq!(
        err.to_string(),
        "the prompt needs 9 KV blocks (with its first new token) but the whole KV cache has only 8"
    );
    r.run();
    let got: Vec<Vec<u32>> = rxs.iter().map(collect).collect();
    assert_eq!(got, solo(&small));
}

fn llama_kv(r: &mut LlamaRunner<CpuBackend>) -> Option<&mut dyn KvBlockIo> {
    Some(r)
}

/// The output tokens of a stream's final event, if it came.
fn finished_tokens(rx: &Receiver<Output>) -> Option<Vec<u32>> {
    rx.try_iter()
        .find_map(|o| o.finished)
        .map(|f| f.output_tokens)
}

#[test]
fn a_checkpoint_taken_while_sequences_are_swapped_out_resumes_exactly() {
    // Swapped sequences are stored as waiting without KV and recomputed after the restore;
    // the running ones get their KV blocks back.
    let reqs: Vec<Request> = (0..12)
        .map(|i| request(tokens(300 + i, 70 + 5 * i), 40, i))
        .collect();
    let want = solo(&reqs);
    let dir = tempfile::tempdir().unwrap();
    let mut cp = Checkpointer::new(
        CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap(),
        KvMode::Blocks,
    );
    let mut first = rig(40, policy(true, 10));
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| first.submit_journaled(r.clone(), Some(&mut cp)).unwrap())
        .collect();
    let mut steps = 0;
    while !first.core.has_swapped() {
        first.step();
        steps += 1;
        assert!(steps < 10_000, "nothing was swapped out");
    }
    checkpoint_core(
        &mut cp,
        &mut first.core,
        Scheduler::NAME,
        first.machine.state_name(),
        llama_kv,
        &|_| Vec::new(),
    )
    .unwrap();
    // Work after the checkpoint that a crash loses.
    for _ in 0..9 {
        first.step();
    }
    let delivered: Vec<Option<Vec<u32>>> = rxs.iter().map(finished_tokens).collect();
    drop(first);
    drop(cp);

    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    let restored = store.latest_valid().unwrap().expect("a checkpoint");
    let mut second = rig(40, policy(true, 10));
    let mut resumed = std::collections::BTreeMap::new();
    restore_core(&mut second.core, &restored, llama_kv, &mut |id| {
        let (tx, rx) = mpsc::channel();
        resumed.insert(id, rx);
        tx
    })
    .unwrap();
    second.machine.set_state_by_name("prefill").unwrap();
    second.run();
    let mut seen = 0;
    for (id, rx) in &resumed {
        let got = finished_tokens(rx).unwrap_or_else(|| panic!("request {id} lost"));
        assert_eq!(got, want[*id as usize - 1], "request {id} after the resume");
        seen += 1;
    }
    for (i, d) in delivered.iter().enumerate() {
        if !resumed.contains_key(&(i as u64 + 1)) {
            assert_eq!(
                d.as_ref(),
                Some(&want[i]),
                "request {} delivered before",
                i + 1
            );
            seen += 1;
        }
    }
    assert_eq!(seen, reqs.len(), "a request was lost");
}

/// Steps `rig` until `done` holds of its counters, checking the swap file meanwhile: it exists
/// exactly while blocks are spilled, and holds at most `file_blocks` blocks.
fn step_until(
    rig: &mut Rig,
    path: &std::path::Path,
    file_blocks: usize,
    done: fn(&KvCounters) -> bool,
) {
    let block_bytes = (BS * 512) as u64; // tiny: 2 layers x K/V x 2 heads x 16 dims x f32 = 512 B/token
    for _ in 0..100_000 {
        rig.step();
        let spilled = rig.core.swap.spilled();
        assert_eq!(
            path.exists(),
            spilled > 0,
            "the file exists exactly while blocks are spilled"
        );
        if spilled > 0 {
            assert!(std::fs::metadata(path).unwrap().len() <= file_blocks as u64 * block_bytes);
        }
        if done(&rig.counters()) {
            return;
        }
    }
    panic!("never reached: {:?}", rig.counters());
}

#[test]
fn blocks_beyond_the_host_pool_spill_to_a_file_and_outputs_do_not_change() {
    // The workload of the swap test above with a host pool of 6 blocks and a roomy file of 64:
    // swaps go to both tiers; outputs equal each request alone; the file is gone at the end.
    let reqs: Vec<Request> = (0..24)
        .map(|i| request(tokens(200 + i, 60 + 3 * i), 48, i))
        .collect();
    let want = solo(&reqs);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(SPILL_FILE);
    let mut r = rig(40, spill_policy(dir.path(), 6, 64));
    let rxs: Vec<_> = reqs.iter().map(|q| r.submit(q.clone()).unwrap()).collect();
    step_until(&mut r, &path, 64, |c| c.blocks_spilled > 0);
    r.run();
    let got: Vec<Vec<u32>> = rxs.iter().map(collect).collect();
    assert_eq!(got, want);
    let c = r.counters();
    assert!(
        c.blocks_spilled > 0 && c.blocks_swapped_out > c.blocks_spilled,
        "{c:?}"
    );
    assert_eq!(c.blocks_swapped_in, c.blocks_swapped_out, "{c:?}");
    assert!(!path.exists(), "the swap file is gone at the end");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left on disk"
    );
}

#[test]
fn a_full_swap_file_falls_back_to_recompute_exactly() {
    // No host pool, a file of 10 blocks (about one sequence): some swaps spill, the rest are
    // recomputed; outputs equal each request alone.
    let reqs: Vec<Request> = (0..24)
        .map(|i| request(tokens(200 + i, 60 + 3 * i), 48, i))
        .collect();
    let want = solo(&reqs);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(SPILL_FILE);
    let mut r = rig(40, spill_policy(dir.path(), 0, 10));
    let rxs: Vec<_> = reqs.iter().map(|q| r.submit(q.clone()).unwrap()).collect();
    step_until(&mut r, &path, 10, |c| {
        c.blocks_spilled > 0 && c.recomputed > 0
    });
    r.run();
    let got: Vec<Vec<u32>> = rxs.iter().map(collect).collect();
    assert_eq!(got, want);
    let c = r.counters();
    assert_eq!(
        c.blocks_spilled, c.blocks_swapped_out,
        "no host pool: {c:?}"
    );
    assert!(c.blocks_spilled > 0 && c.recomputed > 0, "{c:?}");
    assert_eq!(
        r.core.totals().preemptions,
        c.swapped_out + c.recomputed,
        "{c:?}"
    );
    assert!(!path.exists(), "the swap file is gone at the end");
}
