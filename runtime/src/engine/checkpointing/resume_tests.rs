//! Exact resume at the engine-core level: run requests (greedy and seeded sampling) through the
//! seed machine, checkpoint at a point, keep going (work a crash would lose), then rebuild a fresh
//! core from the newest checkpoint plus the journal and finish. Every request's final tokens must
//! equal an uninterrupted run's, and none may be lost — in `Recompute` mode on the deterministic
//! fake model and in `Blocks` mode on a tiny random Llama on the CPU backend (KV bytes restored).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};

use super::core_io::{checkpoint_core, no_kv_access, request_record, restore_core};
use crate::backend::cpu::CpuBackend;
use crate::checkpoint::driver::{Checkpointer, KvBlockIo};
use crate::checkpoint::fixture::{MODEL, SPEC, key};
use crate::checkpoint::{CheckpointStore, KvMode};
use crate::engine::codec::ByteCodec;
use crate::engine::constraint::{Grammar, GrammarSupport, GrammarVocab, VocabToken};
use crate::engine::core::{CoreConfig, EngineCore};
use crate::engine::fake::FakeModel;
use crate::engine::forward::ForwardModel;
use crate::engine::intake::{IntakeLimits, bind_grammar, build_sequence};
use crate::engine::output::Output;
use crate::engine::{Prompt, Request, SamplingParams};
use crate::model::LlamaModel;
use crate::model::random::{WeightDtype, random_weights, tiny_config};
use crate::runner::LlamaRunner;
use crate::scheduler::seed::Scheduler;
use crate::scheduler::{Machine, Slots};

pub(super) const BS: usize = 16;
pub(super) const BLOCKS: usize = 64;

pub(super) struct Rig<F: ForwardModel> {
    pub(super) core: EngineCore<F>,
    pub(super) machine: Scheduler,
    pub(super) slots: Slots,
    limits: IntakeLimits,
    pub(super) rx: BTreeMap<u64, Receiver<Output>>,
}

pub(super) fn rig<F: ForwardModel>(model: F) -> Rig<F> {
    let slots = Slots::new();
    let vocab = model.vocab_size();
    let cfg = CoreConfig {
        num_blocks: BLOCKS,
        block_size: BS,
        max_batch: 8,
        max_prefill_tokens: 64,
        context_len: 512,
        max_tokens_cap: 2048,
        eos_ids: vec![],
        kv: Default::default(),
    };
    let limits = IntakeLimits {
        context_len: 512,
        vocab_size: vocab,
        num_blocks: BLOCKS,
        block_size: BS,
        max_tokens_cap: 2048,
    };
    let mut core = EngineCore::new(model, Arc::new(ByteCodec), cfg, slots.clone());
    core.set_grammar(Some(Arc::new(byte_grammar(vocab))));
    Rig {
        core,
        machine: Scheduler::new(),
        slots,
        limits,
        rx: BTreeMap::new(),
    }
}

/// Structured output over the byte codec: ids 0..256 are bytes, the last id of the vocabulary
/// ends a sequence, ids between have no text.
fn byte_grammar(vocab: usize) -> GrammarSupport {
    GrammarSupport::new(move || {
        let tokens = (0..vocab)
            .map(|id| VocabToken {
                bytes: if id < 256 { vec![id as u8] } else { Vec::new() },
                special: id == vocab - 1,
            })
            .collect();
        GrammarVocab::new(tokens, vec![vocab as u32 - 1])
    })
}

/// Four requests: greedy, seeded, greedy constrained to a JSON object, seeded.
pub(super) fn requests(vocab: usize) -> Vec<Request> {
    (0..4u64)
        .map(|i| {
            let prompt: Vec<u32> = (0..(5 + 9 * i as usize))
                .map(|j| ((i as usize * 37 + j * 11) % (vocab - 1)) as u32 + 1)
                .collect();
            let mut r = Request::new(Prompt::Tokens(prompt), 40 + 7 * i as usize);
            r.ignore_eos = true;
            r.sampling = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 0.9,
                    top_p: 0.95,
                    seed: Some(100 + i),
                    ..SamplingParams::default()
                }
            };
            if i == 2 {
                r.grammar = Some(Grammar::JsonObject);
            }
            r
        })
        .collect()
}

impl<F: ForwardModel> Rig<F> {
    pub(super) fn submit(&mut self, id: u64, req: Request, store: Option<&mut Checkpointer>) {
        let (tx, rx) = mpsc::channel();
        let mut req = req;
        let grammar = req.grammar.take();
        let mut seq = build_sequence(id, req, &ByteCodec, &self.limits, tx).unwrap();
        if let Some(g) = grammar {
            bind_grammar(&mut seq, g, self.core.grammar()).unwrap();
        }
        if let Some(cp) = store {
            cp.accept(&request_record(&seq, Vec::new())).unwrap();
        }
        self.core.enqueue(seq);
        self.rx.insert(id, rx);
    }

    pub(super) fn step(&mut self) {
        self.core.publish();
        self.machine.step(&mut self.core, &self.slots).unwrap();
    }

    pub(super) fn finish(&mut self) -> BTreeMap<u64, Vec<u32>> {
        for _ in 0..100_000 {
            if self.core.is_idle() {
                break;
            }
            self.step();
        }
        assert!(self.core.is_idle(), "did not finish");
        self.rx
            .iter()
            .map(|(id, rx)| {
                let fin = rx
                    .try_iter()
                    .find_map(|o| o.finished)
                    .unwrap_or_else(|| panic!("request {id} lost"));
                (*id, fin.output_tokens)
            })
            .collect()
    }
}

/// Uninterrupted reference, then checkpoint after `cut` steps, run on (lost work), restore, finish.
fn exact_resume<F: ForwardModel>(
    make: &dyn Fn() -> F,
    mode: KvMode,
    kv: fn(&mut F) -> Option<&mut dyn KvBlockIo>,
    cut: usize,
) {
    let vocab = make().vocab_size();
    let reqs = requests(vocab);
    let mut reference = rig(make());
    for (i, r) in reqs.iter().enumerate() {
        reference.submit(i as u64 + 1, r.clone(), None);
    }
    let want = reference.finish();
    // Request 3 followed its grammar: bytes of a JSON object (an EOS at most at the end).
    let json: Vec<u8> = want[&3]
        .iter()
        .take_while(|&&t| (t as usize) < 256)
        .map(|&t| t as u8)
        .collect();
    assert!(json.len() + 1 >= want[&3].len(), "{:?}", want[&3]);
    let text = String::from_utf8_lossy(&json);
    assert!(text.trim_start().starts_with('{'), "{text:?}");

    let dir = tempfile::tempdir().unwrap();
    let mut cp = Checkpointer::new(
        CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap(),
        mode,
    );
    let mut first = rig(make());
    for (i, r) in reqs.iter().take(3).enumerate() {
        first.submit(i as u64 + 1, r.clone(), Some(&mut cp));
    }
    for _ in 0..cut {
        first.step();
    }
    checkpoint_core(
        &mut cp,
        &mut first.core,
        Scheduler::NAME,
        first.machine.state_name(),
        kv,
        &|_| Vec::new(),
    )
    .unwrap();
    // Accepted after the checkpoint: only the journal has it.
    first.submit(4, reqs[3].clone(), Some(&mut cp));
    for _ in 0..7 {
        first.step();
    }
    // Requests that finished before the crash were delivered by the first process.
    let mut delivered: BTreeMap<u64, Vec<u32>> = first
        .rx
        .iter()
        .filter_map(|(id, rx)| {
            rx.try_iter()
                .find_map(|o| o.finished)
                .map(|f| (*id, f.output_tokens))
        })
        .collect();
    drop(first);
    drop(cp);

    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    let restored = store.latest_valid().unwrap().expect("a checkpoint");
    assert_eq!(restored.pending.len(), 1);
    let mut second = rig(make());
    let mut rxs = BTreeMap::new();
    restore_core(&mut second.core, &restored, kv, &mut |id| {
        let (tx, rx) = mpsc::channel();
        rxs.insert(id, rx);
        tx
    })
    .unwrap();
    second.rx = rxs;
    assert_eq!(second.slots.raw()[7], 1, "chain head restored into slot 7");
    second.machine.set_state_by_name("prefill").unwrap();
    let resumed = second.finish();
    // Unfinished at the checkpoint (or accepted after it): resumed, and exactly as uninterrupted.
    for (id, tokens) in &resumed {
        assert_eq!(
            Some(tokens),
            want.get(id),
            "{mode:?} request {id} after a cut at {cut} differs"
        );
    }
    // Finished before the checkpoint: delivered then, and not run again.
    delivered.retain(|id, _| !resumed.contains_key(id));
    for (id, tokens) in &delivered {
        assert_eq!(
            Some(tokens),
            want.get(id),
            "request {id} delivered before the crash differs"
        );
    }
    assert_eq!(
        resumed.len() + delivered.len(),
        want.len(),
        "a request was lost"
    );
}

#[test]
fn recompute_mode_resume_is_exact_on_the_fake_model() {
    for cut in [1, 3, 10, 25, 60] {
        exact_resume(
            &|| FakeModel::new(300, BLOCKS, BS),
            KvMode::Recompute,
            no_kv_access,
            cut,
        );
    }
}

pub(super) fn tiny_llama() -> LlamaRunner<CpuBackend> {
    let config = tiny_config();
    let weights = random_weights(&config, 7, WeightDtype::F32);
    let model = LlamaModel::new(CpuBackend::new(), &config, &weights).unwrap();
    LlamaRunner::new(model, BLOCKS, BS).unwrap()
}

pub(super) fn llama_kv(r: &mut LlamaRunner<CpuBackend>) -> Option<&mut dyn KvBlockIo> {
    Some(r)
}

#[test]
fn blocks_mode_resume_is_exact_on_a_tiny_llama() {
    for cut in [2, 9, 30] {
        exact_resume(&tiny_llama, KvMode::Blocks, llama_kv, cut);
    }
}
