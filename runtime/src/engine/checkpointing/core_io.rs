//! Glue between the engine's own types and the checkpoint store's driver (the engine side of the
//! store's [`EngineSnapshot`] trait; the model runner implements its `KvBlockIo` in
//! `crate::runner`):
//! - [`checkpoint_core`]: snapshot an [`EngineCore`] (running then waiting sequences, slots, step
//!   counter) through a [`Checkpointer`] and publish the receipt in the slots;
//! - [`restore_core`]: rebuild the core's sequences from a [`Restored`] checkpoint (KV copied back
//!   in `Blocks` mode, a sequence's full blocks in one staged write, recomputed by prefill in
//!   `Recompute` mode), re-admit journaled requests,
//!   restore the slots with the chain head at the newest receipt;
//! - [`request_record`]: the journal record of a sequence the engine accepted.
//!
//! Stop strings live inside the engine's private text state, so callers pass them in (`stops`).

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::Instant;

use crate::checkpoint::driver::{
    Checkpointer, EngineSnapshot, KvBlockIo, LiveSequence, Published, restored_slots,
    write_sequence_kv,
};
use crate::checkpoint::journal::RequestRecord;
use crate::checkpoint::snapshot::{
    FinishState, KvLayout, KvMode, LogitBias, SamplingParams, SequenceSnapshot,
};
use crate::checkpoint::store::Restored;
use crate::checkpoint::{CheckpointError, Result};
use crate::engine::constraint::{Grammar, GrammarSupport};
use crate::engine::core::EngineCore;
use crate::engine::core_view::{CoreParts, NoRoom};
use crate::engine::forward::ForwardModel;
use crate::engine::output::Output;
use crate::engine::rng::SampleRng;
use crate::engine::sequence::Sequence;
use crate::engine::text::TextStream;
use crate::engine::{SamplingParams as EngineSampling, TextCodec};

/// A sequence's sampling and stopping parameters in snapshot form.
pub fn sampling_of(seq: &Sequence, stops: Vec<String>) -> SamplingParams {
    let s = &seq.sampling;
    SamplingParams {
        temperature: s.temperature,
        top_k: u32::try_from(s.top_k).unwrap_or(u32::MAX),
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        frequency_penalty: s.frequency_penalty,
        presence_penalty: s.presence_penalty,
        seed: seq.rng.seed,
        logprobs: s.logprobs.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        max_tokens: u32::try_from(seq.max_tokens).unwrap_or(u32::MAX),
        stop: stops,
        ignore_eos: seq.ignore_eos,
        logit_bias: s
            .logit_bias
            .iter()
            .map(|&(token, bias)| LogitBias { token, bias })
            .collect(),
        min_tokens: u32::try_from(s.min_tokens).unwrap_or(u32::MAX),
        grammar: seq.constraint.as_ref().map(|c| c.grammar.to_record()),
    }
}

/// The engine's sampling parameters back from snapshot form.
pub fn engine_sampling(p: &SamplingParams) -> EngineSampling {
    EngineSampling {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: p.top_p,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        seed: Some(p.seed),
        logprobs: p.logprobs.map(|n| n as usize),
        logit_bias: p.logit_bias.iter().map(|b| (b.token, b.bias)).collect(),
        min_tokens: p.min_tokens as usize,
    }
}

/// The journal record of an accepted sequence (call before it enters the waiting queue; the seed
/// recorded is the one actually drawn).
pub fn request_record(seq: &Sequence, stops: Vec<String>) -> RequestRecord {
    let accepted_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    RequestRecord {
        request_id: seq.id,
        prompt: seq.prompt().to_vec(),
        sampling: sampling_of(seq, stops),
        accepted_ms,
        extra: seq.tag.clone(),
    }
}

/// An [`EngineCore`]'s state as the driver reads it.
struct CoreView<'a> {
    machine: &'a str,
    state: &'a str,
    slots: [u32; 32],
    step: u64,
    sequences: Vec<LiveSequence<'a>>,
}

impl EngineSnapshot for CoreView<'_> {
    fn machine_name(&self) -> String {
        self.machine.to_string()
    }
    fn state_name(&self) -> String {
        self.state.to_string()
    }
    fn slots(&self) -> [u32; 32] {
        self.slots
    }
    fn step(&self) -> u64 {
        self.step
    }
    fn live_sequences(&self) -> Vec<LiveSequence<'_>> {
        self.sequences.clone()
    }
}

/// A sequence as the store's driver reads it (`kv_tokens` 0 unless running).
pub(super) fn live<'a>(
    seq: &'a Sequence,
    finish: FinishState,
    stops: Vec<String>,
) -> LiveSequence<'a> {
    LiveSequence {
        request_id: seq.id,
        tokens: &seq.tokens,
        prompt_len: seq.prompt_len,
        kv_tokens: if finish == FinishState::Running {
            seq.computed
        } else {
            0
        },
        block_table: &seq.block_table,
        generation: seq.preemptions,
        sampling: sampling_of(seq, stops),
        rng_state: vec![seq.rng.seed, seq.rng.counter],
        finish,
    }
}

/// Checkpoint `core` (the body of the `checkpoint` action) and publish the receipt: slots 8..31
/// get its digest and signature, slot 7 height - 1 (the machine's `bft_quorum_height += 1` that
/// follows the action lands on the chain height). `kv` gives the model's KV access (None: the
/// model has none; then only `Recompute` mode works); `stops` gives each sequence's stop strings.
pub fn checkpoint_core<F: ForwardModel>(
    cp: &mut Checkpointer,
    core: &mut EngineCore<F>,
    machine: &str,
    state: &str,
    kv: fn(&mut F) -> Option<&mut dyn KvBlockIo>,
    stops: &dyn Fn(&Sequence) -> Vec<String>,
) -> Result<Published> {
    let CoreParts {
        model,
        running,
        swapped,
        waiting,
        slots,
        decode_steps,
    } = core.parts();
    // Swapped-out sequences are stored as waiting, without KV: a resume recomputes them (their
    // KV is in the host pool, which a checkpoint does not copy), ahead of the waiting queue.
    let sequences: Vec<LiveSequence<'_>> = running
        .iter()
        .map(|s| live(s, FinishState::Running, stops(s)))
        .chain(
            swapped
                .into_iter()
                .chain(waiting.iter())
                .map(|s| live(s, FinishState::Waiting, stops(s))),
        )
        .collect();
    let view = CoreView {
        machine,
        state,
        slots: slots.raw(),
        step: decode_steps,
        sequences,
    };
    let published = match (cp.mode(), kv(model)) {
        (KvMode::Blocks, Some(io)) => cp.checkpoint(&view, io)?,
        (KvMode::Blocks, None) => {
            return Err(CheckpointError::Usage(
                "Blocks mode needs KV access to the model".into(),
            ));
        }
        (KvMode::Recompute, _) => cp.checkpoint(&view, &mut NoKv)?,
    };
    let mut raw = slots.raw();
    raw[7..32].copy_from_slice(&published.slot_words_before_bump);
    slots.load_raw(&raw);
    Ok(published)
}

/// KV access for `Recompute` mode, where no block is ever read.
struct NoKv;

impl KvBlockIo for NoKv {
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            layers: 0,
            kv_heads: 0,
            head_dim: 0,
            block_size: 1,
            dtype: String::new(),
        }
    }
    fn read_block(&mut self, _: u32, _: usize) -> std::result::Result<Vec<u8>, String> {
        Err("recompute mode reads no KV".into())
    }
    fn write_block(&mut self, _: u32, _: usize, _: &[u8]) -> std::result::Result<(), String> {
        Err("recompute mode writes no KV".into())
    }
}

/// A fresh sequence in the engine's form from snapshot data; the text stream is rebuilt by
/// replaying the output tokens (their deltas were delivered before the checkpoint).
fn rebuild_sequence(
    snap: &SequenceSnapshot,
    codec: &dyn TextCodec,
    grammar: Option<&GrammarSupport>,
    tx: Sender<Output>,
) -> Result<Sequence> {
    let constraint = match &snap.sampling.grammar {
        None => None,
        Some(record) => {
            let usage = |e: String| {
                CheckpointError::Usage(format!("request {}: grammar: {e}", snap.request_id))
            };
            let g = Grammar::from_record(record).map_err(|e| usage(e.to_string()))?;
            let support =
                grammar.ok_or_else(|| usage("this engine has no structured output".into()))?;
            Some(
                support
                    .rebind(g, &snap.output)
                    .map_err(|e| usage(e.to_string()))?,
            )
        }
    };
    let [seed, counter] = snap.rng_state[..] else {
        return Err(CheckpointError::Usage(format!(
            "request {}: RNG state is not [seed, counter]",
            snap.request_id
        )));
    };
    let mut text = TextStream::new(&snap.prompt, snap.sampling.stop.clone());
    for &t in &snap.output {
        text.push(codec, t).map_err(|e| {
            CheckpointError::Usage(format!("replaying request {} text: {e}", snap.request_id))
        })?;
    }
    let mut tokens = snap.prompt.clone();
    tokens.extend_from_slice(&snap.output);
    let now = Instant::now();
    Ok(Sequence {
        id: snap.request_id,
        prompt_len: snap.prompt.len(),
        tokens,
        computed: 0,
        prefilled: false,
        block_table: Vec::new(),
        max_tokens: snap.sampling.max_tokens as usize,
        sampling: engine_sampling(&snap.sampling),
        rng: SampleRng { seed, counter },
        ignore_eos: snap.sampling.ignore_eos,
        text,
        tx,
        arrival: now,
        first_token_at: None,
        last_token_at: None,
        inter_token: Vec::new(),
        preemptions: 0,
        draft: Vec::new(),
        // Already journaled with its request; a resume reads it from there.
        tag: Vec::new(),
        constraint,
        prefix: Default::default(),
    })
}

/// Replace `core`'s sequences with the checkpoint's (the body of the `restore` action, or of
/// `--resume` before the first step): running sequences get their KV back in `Blocks` mode (and
/// resume with one prefill pass over what is missing), everything else is queued for prefill;
/// requests journaled after the snapshot are queued after them. `tx` gives each request id its
/// output channel. Returns the highest request id seen (the engine's next id must exceed it).
pub fn restore_core<F: ForwardModel>(
    core: &mut EngineCore<F>,
    restored: &Restored,
    kv: fn(&mut F) -> Option<&mut dyn KvBlockIo>,
    tx: &mut dyn FnMut(u64) -> Sender<Output>,
) -> Result<u64> {
    core.take_sequences();
    let mut max_id = 0;
    let use_kv = restored.snapshot.kv_mode == KvMode::Blocks;
    if use_kv && kv(core.model_mut()).is_none() {
        return Err(CheckpointError::Usage(
            "Blocks-mode checkpoint needs KV access to the model".into(),
        ));
    }
    for snap in &restored.snapshot.sequences {
        max_id = max_id.max(snap.request_id);
        let seq = rebuild_sequence(snap, core.codec(), core.grammar(), tx(snap.request_id))?;
        // A sequence running at the checkpoint needs a block more than its KV when its next
        // token starts one; a cache that was full then cannot take them all back, so those that
        // do not fit are recomputed rather than failing the resume.
        let fits = core.blocks.blocks_for(seq.tokens.len()) <= core.blocks.free_count();
        if use_kv && snap.finish == FinishState::Running && fits {
            let written = core.admit_with_kv(seq, |model, table| match kv(model) {
                Some(io) => write_kv(restored, snap, table, io),
                None => Err(CheckpointError::Usage(
                    "the model lost its KV access".into(),
                )),
            });
            match written {
                Ok(result) => result?,
                Err(NoRoom) => {
                    return Err(CheckpointError::Usage(format!(
                        "request {}: KV cache too small to restore",
                        snap.request_id
                    )));
                }
            }
        } else {
            core.requeue_for_recompute(seq);
        }
    }
    let mut by_id: HashMap<u64, ()> = restored
        .snapshot
        .sequences
        .iter()
        .map(|s| (s.request_id, ()))
        .collect();
    for req in &restored.pending {
        if by_id.insert(req.request_id, ()).is_some() {
            continue;
        }
        max_id = max_id.max(req.request_id);
        let seq = fresh_sequence(req, core.codec(), core.grammar(), tx(req.request_id))?;
        core.requeue_for_recompute(seq);
    }
    core.set_decode_steps(restored.snapshot.step);
    core.slots().load_raw(&restored_slots(restored));
    Ok(max_id)
}

/// [`write_sequence_kv`] with the full blocks in one staged write ([`KvBlockIo::write_blocks`]:
/// on a GPU one host-to-device copy and one scatter kernel), the partial tail after them.
fn write_kv(
    r: &Restored,
    seq: &SequenceSnapshot,
    table: &[u32],
    io: &mut dyn KvBlockIo,
) -> Result<usize> {
    if r.snapshot.kv_mode == KvMode::Recompute
        || seq.blocks.is_empty()
        || table.len() < seq.blocks.len()
    {
        return write_sequence_kv(r, seq, table, io);
    }
    let mut bytes = Vec::new();
    for hash in &seq.blocks {
        match r.blocks.get(hash) {
            Some(b) => bytes.extend_from_slice(b),
            None => return write_sequence_kv(r, seq, table, io), // it names the missing block
        }
    }
    io.write_blocks(&table[..seq.blocks.len()], &bytes)
        .map_err(|e| CheckpointError::Usage(format!("writing restored KV: {e}")))?;
    let bs = r.snapshot.kv_layout.block_size as usize;
    if seq.tail_tokens > 0 {
        let at = *table.get(seq.blocks.len()).ok_or_else(|| {
            CheckpointError::Usage(format!(
                "request {}: no block for its KV tail",
                seq.request_id
            ))
        })?;
        io.write_block(at, seq.tail_tokens as usize, &seq.tail)
            .map_err(|e| CheckpointError::Usage(format!("writing restored KV: {e}")))?;
    }
    Ok(seq.blocks.len() * bs + seq.tail_tokens as usize)
}

/// A journaled request as a fresh sequence (nothing generated yet), ready to queue.
pub fn fresh_sequence(
    req: &RequestRecord,
    codec: &dyn TextCodec,
    grammar: Option<&GrammarSupport>,
    tx: Sender<Output>,
) -> Result<Sequence> {
    let snap = SequenceSnapshot {
        request_id: req.request_id,
        prompt: req.prompt.clone(),
        output: Vec::new(),
        sampling: req.sampling.clone(),
        rng_state: vec![req.sampling.seed, 0],
        finish: FinishState::Waiting,
        blocks: Vec::new(),
        tail: Vec::new(),
        tail_tokens: 0,
    };
    rebuild_sequence(&snap, codec, grammar, tx)
}

/// For models without KV access (`Recompute` mode only): pass as the `kv` argument.
pub fn no_kv_access<F>(_: &mut F) -> Option<&mut dyn KvBlockIo> {
    None
}
