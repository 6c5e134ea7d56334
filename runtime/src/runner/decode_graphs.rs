//! Decode steps of a [`LlamaModel`] on the CUDA backend, replayed from CUDA graphs, with the
//! greedy token of every row chosen on the device so only token ids come back.
//!
//! Design: the model's own forward pass on buffers this runner keeps at fixed addresses
//! ([`LlamaModel::forward_into`]: the same kernels in the same order as [`LlamaModel::forward`]),
//! planned by the model's one planning function ([`LlamaModel::plan_step`], which also checks the
//! cache against the model), so a step can be captured once into a CUDA graph and replayed. A
//! step of `n` sequences runs padded to a batch bucket ([`batch_bucket`]) and is captured per
//! (batch bucket, context bucket): the context bucket ([`ctx_bucket`], a power of two >= the
//! longest context) fixes the decode split plan and the block-table stride the graph holds.
//! Padding rows have context length 0 (attention skips them) and KV slot `0xffffffff` (no KV
//! write); rows are independent in every op, so padding never changes a real row. The step's
//! inputs (token ids, positions, slots, context lengths, block tables) are copied into the fixed
//! buffers before each replay. A key runs eagerly the first time it is seen (sizing the backend's
//! scratch and the library workspaces), is captured the second time, and replayed from then on;
//! every graph is dropped when the backend reallocates scratch
//! ([`CudaBackend::scratch_generation`]) or these buffers grow.
//! The activations come in one set per product-input dtype ([`Backend::matmul_input_dtype`] of
//! the bucket: f32 rows for the few-row GEMV, bf16 above it), each sized to its largest bucket, so
//! a batch-1 step after a batch of 256 still feeds the GEMV f32 rows (with one set sized for 256
//! rows it took the bf16 GEMM path: 218 against 242 tok/s on an H200).
//! The step ends with [`CudaBackend::argmax_rows`] into a `[bucket]` u32 buffer; logits rows stay
//! on the device and are downloaded only for rows the engine samples on the host.
//! Batches up to any size take graphs (up to 1024 and beyond: 64 buckets of 16 between 32 and
//! 1024); the graphs' memory is measured at capture ([`StepGraph::bytes`]) and bounded: past
//! [`MAX_GRAPHS`] graphs or [`MAX_GRAPH_BYTES`] bytes, the least recently replayed graph is
//! dropped (it is captured again if its key comes back).
//! Steps are launched and waited for apart ([`DecodeGraphs::launch`], [`DecodeGraphs::wait`]):
//! the inputs go up and the picked ids come down through page-locked rows (`PinnedRows`, two
//! sets used in turn) with no stream wait, so step N + 1 can be enqueued while step N runs. A
//! step launched `fed` takes its token ids from the picks of the step launched before it, copied
//! on the device by a row map (the engine's decode-ahead, `engine::ahead`).
//! Only pure decode steps come here ([`DecodeGraphs::accepts`]: every chunk one token); a step
//! with a longer chunk (a prefill, a mixed step, a speculative verification) never replays a
//! graph: the runner sends it to [`LlamaModel::forward`].

use std::collections::{HashMap, HashSet, VecDeque};

use crate::backend::cuda::{CudaBackend, CudaBuffer, DrawRow, PinnedRows, StepGraph};
use crate::backend::{Backend, BackendError, BatchMeta, DType};
use crate::engine::forward::HostWork;
use crate::model::batch::SeqChunk;
use crate::model::{Activations, KvCache, LlamaModel, ModelError};

/// Padded batch size a step of `n` sequences runs at: powers of two up to 32, then multiples
/// of 16 (few graphs, at most 15% padding above 32).
pub fn batch_bucket(n: usize) -> usize {
    if n <= 32 {
        n.max(1).next_power_of_two()
    } else {
        n.div_ceil(16) * 16
    }
}

/// Most step graphs kept at once.
pub const MAX_GRAPHS: usize = 256;
/// Most device memory the kept graphs may hold, as measured at capture.
pub const MAX_GRAPH_BYTES: usize = 2 << 30;

/// Context length a graph is captured for: the next power of two, at least 256.
pub fn ctx_bucket(max_ctx: usize) -> usize {
    max_ctx.max(256).next_power_of_two()
}

/// Fixed-address buffers for steps of up to `rows` sequences.
struct StepBuffers {
    rows: usize,
    /// Elements `block_tables` holds (rows x the widest stride used so far).
    table_capacity: usize,
    /// `[rows]` u32.
    ids: CudaBuffer,
    /// positions, slots, q_starts (`[rows + 1]` = 0..=rows), ctx_lens, block tables.
    meta: BatchMeta<CudaBackend>,
    /// The forward pass's activations: one set per product-input dtype ([`ActSet`]).
    acts: Vec<ActSet>,
    /// `[rows, vocab]`.
    logits: CudaBuffer,
    /// `[rows]` u32: argmax of each logits row.
    picked: CudaBuffer,
}

/// Activations for the buckets whose product inputs are `dtype`, sized for `rows` token rows.
struct ActSet {
    dtype: DType,
    rows: usize,
    acts: Activations<CudaBackend>,
}

/// The graph-replaying decode runner of one model and KV cache.
pub struct DecodeGraphs {
    bufs: Option<StepBuffers>,
    /// Captured graphs with the step count of their last replay.
    graphs: HashMap<(usize, usize), (StepGraph, u64)>,
    /// Steps run (the clock of `graphs`' last use).
    steps: u64,
    /// Bytes the kept graphs took at capture.
    graph_bytes: usize,
    /// Keys that ran eagerly once (scratch is sized for them).
    warm: HashSet<(usize, usize)>,
    /// Backend scratch generation the graphs were captured under.
    generation: u64,
    use_graphs: bool,
    /// Whether plain sampled rows are drawn on the device ([`Self::device_draw`]).
    device_draw: bool,
    /// Rows of the last step (its logits rows are valid).
    last_rows: usize,
    vocab: usize,
    /// Page-locked rows for the steps' inputs and picked ids, two sets used in turn.
    io: Option<[StepIo; 2]>,
    /// Steps launched and not yet waited for, oldest first.
    in_flight: VecDeque<InFlight>,
    /// Steps launched so far (picks the set of `io`).
    launches: u64,
}

/// Page-locked rows of one step's transfers.
struct StepIo {
    /// The inputs, back to back (token ids, positions, slots, context lengths, block tables).
    up: PinnedRows,
    /// The picked ids.
    down: PinnedRows,
}

/// A step launched and not yet waited for.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// Its real rows (the picks that come back).
    rows: usize,
    /// Its set of `DecodeGraphs::io`.
    set: usize,
}

impl Default for DecodeGraphs {
    fn default() -> Self {
        Self::new()
    }
}

impl DecodeGraphs {
    /// A runner that replays graphs.
    pub fn new() -> Self {
        Self::with_graphs(true)
    }

    /// A runner that replays graphs when `use_graphs` is set, else runs every step eagerly on the
    /// same fixed buffers (what the graphs save is the difference).
    pub fn with_graphs(use_graphs: bool) -> Self {
        Self {
            bufs: None,
            graphs: HashMap::new(),
            steps: 0,
            graph_bytes: 0,
            warm: HashSet::new(),
            generation: 0,
            use_graphs,
            device_draw: false,
            last_rows: 0,
            vocab: 0,
            io: None,
            in_flight: VecDeque::new(),
            launches: 0,
        }
    }

    /// This runner, drawing plain sampled rows on the device when `on` (`RunnerOptions::device_draw`).
    pub fn drawing_on_device(mut self, on: bool) -> Self {
        self.device_draw = on;
        self
    }

    /// Whether plain sampled rows are drawn on the device (else on the host from their rows).
    pub fn device_draw(&self) -> bool {
        self.device_draw
    }

    /// The last step's logits (`[rows, vocab]` f32, its first `rows` rows valid), if a step ran.
    pub fn logits(&self) -> Option<&CudaBuffer> {
        self.bufs.as_ref().map(|b| &b.logits)
    }

    /// How many step graphs are captured now (0 after a failed capture, which turns replay off).
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Device bytes the kept graphs took when they were captured.
    pub fn graph_bytes(&self) -> usize {
        self.graph_bytes
    }

    /// The activation sets held now: (product-input dtype, rows) of each, in allocation order.
    pub fn activation_sets(&self) -> Vec<(DType, usize)> {
        self.bufs
            .as_ref()
            .map(|b| b.acts.iter().map(|a| (a.dtype, a.rows)).collect())
            .unwrap_or_default()
    }

    /// Whether this runner can take `chunks`: a pure decode step (one new token per sequence).
    pub fn accepts(chunks: &[SeqChunk<'_>]) -> bool {
        !chunks.is_empty() && chunks.iter().all(|c| c.tokens.len() == 1)
    }

    /// Runs one decode step of `chunks` (each one token; see [`Self::accepts`]) on `model` and
    /// `kv`, and returns the greedy token of each chunk (largest logit, lowest id on ties).
    /// The logits stay on the device for [`Self::download_logits_row`].
    pub fn step(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        kv: &mut KvCache<CudaBackend>,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<u32>, ModelError> {
        self.step_overlapped(model, kv, chunks, &[], &mut HostWork::none())
    }

    /// [`Self::step`], with the token of each `(row, draw)` of `draws` drawn on the device from
    /// its logits row (`draw_tokens`, after the step, in the same stream) in place of that row's
    /// greedy id, and `host` run once the step is enqueued and before its ids are waited for, so
    /// the host work overlaps the step. `host` does not run when the step fails before it is
    /// enqueued (the caller runs it then).
    pub fn step_overlapped(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        kv: &mut KvCache<CudaBackend>,
        chunks: &[SeqChunk<'_>],
        draws: &[(usize, DrawRow)],
        host: &mut HostWork<'_>,
    ) -> Result<Vec<u32>, ModelError> {
        self.launch(model, kv, chunks, draws, None)?;
        host.run();
        self.wait(model.backend())
    }

    /// Steps launched and not yet waited for.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The picked ids of the oldest step launched and not yet waited for (`[its rows]`), once
    /// the device has them.
    pub fn wait(&mut self, backend: &CudaBackend) -> Result<Vec<u32>, ModelError> {
        let Some(step) = self.in_flight.pop_front() else {
            return Err(BackendError::Device("no decode step in flight".into()).into());
        };
        let Some(io) = self.io.as_ref() else {
            return Err(BackendError::Device("decode transfer rows missing".into()).into());
        };
        let picked = backend.staged_u32(&io[step.set].down)?;
        if picked.len() != step.rows {
            return Err(BackendError::Device(format!(
                "{} picked ids came back for a step of {} rows",
                picked.len(),
                step.rows
            ))
            .into());
        }
        Ok(picked.to_vec())
    }

    /// Enqueues one decode step of `chunks` (each one token; see [`Self::accepts`]) with the
    /// device draws `draws` (as [`Self::step_overlapped`]) and the download of its picked ids,
    /// without waiting for the device; [`Self::wait`] returns the ids. With `fed` (`[rows]`), row
    /// `i`'s token id is not its chunk's but the id the step launched just before (still in
    /// flight) picked for its row `fed[i]`, copied on the device (one copy per run of
    /// consecutive rows). A launch that fails leaves nothing in flight.
    pub fn launch(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        kv: &mut KvCache<CudaBackend>,
        chunks: &[SeqChunk<'_>],
        draws: &[(usize, DrawRow)],
        fed: Option<&[u32]>,
    ) -> Result<(), ModelError> {
        if !Self::accepts(chunks) {
            return Err(ModelError::InvalidBatch(
                "the decode graph runner takes one new token per sequence".into(),
            ));
        }
        if self.in_flight.len() >= 2 {
            // The two transfer sets would be reused under a step not yet waited for.
            return Err(ModelError::InvalidBatch(
                "two decode steps are in flight already: wait for one first".into(),
            ));
        }
        let c = model.config();
        let b = model.backend();
        let step = model.plan_step(kv, chunks)?;
        let block_size = kv.block_size();
        let n = chunks.len();
        if draws.iter().any(|(row, _)| *row >= n) {
            return Err(ModelError::InvalidBatch(format!(
                "a draw names a row past the step's {n} rows"
            )));
        }
        let bucket = batch_bucket(n);
        let ctx_b = ctx_bucket(step.max_ctx_len);
        let stride = ctx_b.div_ceil(block_size);
        // The block-table buffer is sized for the longest context the cache or the model allows,
        // so a step into a longer context bucket does not reallocate it (which would drop every
        // captured graph); at Llama-3's 131072 positions and 16-token blocks that is 32 KiB a row.
        let longest = c.max_position_embeddings.min(kv.num_blocks() * block_size);
        let max_stride = ctx_bucket(longest).div_ceil(block_size).max(stride);
        if let Some(map) = fed {
            // The ids come from the step before: it must be in flight with the rows the map
            // names, and the buffers holding its picks must not be reallocated.
            let before = self.in_flight.back().map_or(0, |s| s.rows);
            let fits = self
                .bufs
                .as_ref()
                .is_some_and(|b| b.rows >= bucket && b.table_capacity >= bucket * max_stride);
            if map.len() != n || map.iter().any(|&r| r as usize >= before) || !fits {
                return Err(ModelError::InvalidBatch(format!(
                    "a fed decode step of {n} rows (map of {}) follows {before} rows in flight \
                     (buffers fit: {fits})",
                    map.len()
                )));
            }
        }
        self.ensure_buffers(model, bucket, bucket * max_stride)?;
        let set = self.ensure_acts(model, bucket)?;
        if self.io.is_none() {
            let io = |b: &CudaBackend| -> Result<StepIo, BackendError> {
                Ok(StepIo {
                    up: b.pinned_rows(4 * bucket + bucket * stride, true)?,
                    down: b.pinned_rows(bucket, false)?,
                })
            };
            self.io = Some([io(b)?, io(b)?]);
        }
        let io_set = (self.launches % 2) as usize;
        let Some(io) = self.io.as_mut().map(|io| &mut io[io_set]) else {
            return Err(BackendError::Device("decode transfer rows missing".into()).into());
        };
        let Some(bufs) = self.bufs.as_mut() else {
            return Err(BackendError::Device("decode buffers missing".into()).into());
        };
        // Host inputs, padded to the bucket.
        let mut ids = vec![0u32; bucket]; // [bucket]
        let mut positions = vec![0u32; bucket]; // [bucket]
        let mut slots = vec![u32::MAX; bucket]; // [bucket]
        let mut ctx_lens = vec![0u32; bucket]; // [bucket]
        let mut tables = vec![0u32; bucket * stride]; // [bucket, stride]
        ids[..n].copy_from_slice(&step.tokens);
        positions[..n].copy_from_slice(&step.positions);
        slots[..n].copy_from_slice(&step.slot_mapping);
        ctx_lens[..n].copy_from_slice(&step.ctx_lens);
        let src_stride = step.max_blocks_per_seq;
        for s in 0..n {
            let used = (step.ctx_lens[s] as usize).div_ceil(block_size);
            tables[s * stride..s * stride + used]
                .copy_from_slice(&step.block_tables[s * src_stride..s * src_stride + used]);
        }
        let meta = &mut bufs.meta;
        if let Some(map) = fed {
            b.upload_u32_staged(
                &mut io.up,
                &mut [
                    (&mut meta.positions, &positions),
                    (&mut meta.slot_mapping, &slots),
                    (&mut meta.ctx_lens, &ctx_lens),
                    (&mut meta.block_tables, &tables),
                ],
            )?;
            for (dst, src, len) in runs(map) {
                b.copy_u32_at(&bufs.picked, src, &mut bufs.ids, dst, len)?;
            }
        } else {
            b.upload_u32_staged(
                &mut io.up,
                &mut [
                    (&mut bufs.ids, &ids),
                    (&mut meta.positions, &positions),
                    (&mut meta.slot_mapping, &slots),
                    (&mut meta.ctx_lens, &ctx_lens),
                    (&mut meta.block_tables, &tables),
                ],
            )?;
        }
        bufs.meta.n_tokens = bucket;
        bufs.meta.n_seqs = bucket;
        bufs.meta.max_q_len = 1;
        bufs.meta.max_ctx_len = ctx_b;
        bufs.meta.max_blocks_per_seq = stride;

        let key = (bucket, ctx_b);
        if b.scratch_generation() != self.generation {
            self.graphs.clear();
            self.graph_bytes = 0;
            self.generation = b.scratch_generation();
        }
        self.steps += 1;
        if !self.use_graphs || !self.warm.contains(&key) {
            enqueue_step(model, kv, bufs, set, bucket)?;
            self.warm.insert(key);
        } else {
            if !self.graphs.contains_key(&key) {
                match b.capture(|| enqueue_step(model, kv, bufs, set, bucket)) {
                    Ok(g) if b.scratch_generation() == self.generation => {
                        keep(&mut self.graphs, &mut self.graph_bytes, self.steps, key, g)
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("CUDA graph capture failed, decoding eagerly: {e}");
                        self.use_graphs = false;
                    }
                }
            }
            let steps = self.steps;
            match self.graphs.get_mut(&key) {
                Some((g, used)) => {
                    *used = steps;
                    b.replay(g)?
                }
                None => enqueue_step(model, kv, bufs, set, bucket)?,
            }
        }
        b.enqueue_draws_at_rows(&bufs.logits, c.vocab_size, draws, &mut bufs.picked)?;
        let Some(io) = self.io.as_mut().map(|io| &mut io[io_set]) else {
            return Err(BackendError::Device("decode transfer rows missing".into()).into());
        };
        b.download_u32_staged(&bufs.picked, n, &mut io.down)?;
        self.in_flight.push_back(InFlight {
            rows: n,
            set: io_set,
        });
        self.launches += 1;
        self.last_rows = n;
        self.vocab = c.vocab_size;
        Ok(())
    }

    /// Copies row `row` of the last step's logits (`[vocab]` f32) into `out`.
    pub fn download_logits_row(
        &self,
        backend: &CudaBackend,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let Some(bufs) = self.bufs.as_ref() else {
            return Err(BackendError::Device("no decode step has run".into()));
        };
        if row >= self.last_rows || out.len() != self.vocab {
            return Err(BackendError::Shape {
                op: "download_logits_row",
                detail: format!(
                    "row {row} of {} rows, {} values for a vocabulary of {}",
                    self.last_rows,
                    out.len(),
                    self.vocab
                ),
            });
        }
        backend.download_f32_at(&bufs.logits, row * self.vocab, out)
    }

    /// Makes the fixed buffers hold `rows` rows and `table_elems` block-table entries, growing
    /// them (and dropping every graph) when they are smaller.
    fn ensure_buffers(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        rows: usize,
        table_elems: usize,
    ) -> Result<(), ModelError> {
        if let Some(bufs) = &self.bufs
            && bufs.rows >= rows
            && bufs.table_capacity >= table_elems
        {
            return Ok(());
        }
        let (rows, table_elems) = match &self.bufs {
            Some(old) => (rows.max(old.rows), table_elems.max(old.table_capacity)),
            None => (rows, table_elems),
        };
        self.bufs = None;
        self.graphs.clear();
        self.graph_bytes = 0;
        self.warm.clear();
        let c = model.config();
        let b = model.backend();
        let f32s = |len: usize| b.alloc(DType::F32, len);
        let u32s = |len: usize| b.alloc(DType::U32, len);
        let q_starts: Vec<u32> = (0..=rows as u32).collect(); // [rows + 1]
        self.bufs = Some(StepBuffers {
            rows,
            table_capacity: table_elems,
            ids: u32s(rows)?,
            meta: BatchMeta {
                n_tokens: rows,
                n_seqs: rows,
                max_q_len: 1,
                max_ctx_len: 1,
                max_blocks_per_seq: 1,
                positions: u32s(rows)?,
                slot_mapping: u32s(rows)?,
                q_starts: b.upload_u32(&q_starts)?,
                ctx_lens: u32s(rows)?,
                block_tables: u32s(table_elems)?,
            },
            acts: Vec::new(),
            logits: f32s(rows * c.vocab_size)?,
            picked: u32s(rows)?,
        });
        Ok(())
    }

    /// The index of the activation set a step of `bucket` rows uses (the one of
    /// `matmul_input_dtype(bucket)`), allocated or grown to `bucket` rows first (growing one drops
    /// every graph, as [`Self::ensure_buffers`] does). Call after `ensure_buffers`.
    fn ensure_acts(
        &mut self,
        model: &LlamaModel<CudaBackend>,
        bucket: usize,
    ) -> Result<usize, ModelError> {
        let dtype = model.backend().matmul_input_dtype(bucket);
        let Some(bufs) = self.bufs.as_mut() else {
            return Err(BackendError::Device("decode buffers missing".into()).into());
        };
        let found = bufs.acts.iter().position(|a| a.dtype == dtype);
        if let Some(i) = found
            && bufs.acts[i].rows >= bucket
        {
            return Ok(i);
        }
        let set = ActSet {
            dtype,
            rows: bucket,
            acts: model.alloc_activations(bucket)?,
        };
        self.graphs.clear();
        self.graph_bytes = 0;
        self.warm.clear();
        Ok(match found {
            Some(i) => {
                bufs.acts[i] = set;
                i
            }
            None => {
                bufs.acts.push(set);
                bufs.acts.len() - 1
            }
        })
    }
}

/// Keeps `g` under `key` in `graphs` (stamped `now`), first dropping the least recently replayed
/// graphs while the kept ones would pass [`MAX_GRAPHS`] or [`MAX_GRAPH_BYTES`]; `bytes` is the
/// kept graphs' total.
fn keep(
    graphs: &mut HashMap<(usize, usize), (StepGraph, u64)>,
    bytes: &mut usize,
    now: u64,
    key: (usize, usize),
    g: StepGraph,
) {
    while !graphs.is_empty() && (graphs.len() >= MAX_GRAPHS || *bytes + g.bytes() > MAX_GRAPH_BYTES)
    {
        let oldest = graphs
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| *k);
        match oldest.and_then(|k| graphs.remove(&k)) {
            Some((old, _)) => *bytes = bytes.saturating_sub(old.bytes()),
            None => break,
        }
    }
    tracing::debug!(
        "decode graph captured: batch {} ctx {} ({} KiB); {} graphs, {} MiB",
        key.0,
        key.1,
        g.bytes() >> 10,
        graphs.len() + 1,
        (*bytes + g.bytes()) >> 20
    );
    *bytes += g.bytes();
    graphs.insert(key, (g, now));
}

/// The runs of consecutive rows of `map` (row `i` takes row `map[i]`): `(first row, first source
/// row, rows)`, in order.
fn runs(map: &[u32]) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &src) in map.iter().enumerate() {
        match out.last_mut() {
            Some((dst, from, len)) if *dst + *len == i && *from + *len == src as usize => *len += 1,
            _ => out.push((i, src as usize, 1)),
        }
    }
    out
}

/// Enqueues one decode step of `n` rows (the bucket) on the fixed buffers and activation set
/// `set`: the model's forward pass into every row's logits ([`LlamaModel::forward_into`]), then
/// the argmax of every logits row. Nothing is downloaded or allocated, so it can be captured.
fn enqueue_step(
    model: &LlamaModel<CudaBackend>,
    kv: &mut KvCache<CudaBackend>,
    a: &mut StepBuffers,
    set: usize,
    n: usize,
) -> Result<(), BackendError> {
    let vocab = model.config().vocab_size;
    let Some(acts) = a.acts.get_mut(set) else {
        return Err(BackendError::Device("decode activations missing".into()));
    };
    model.forward_into(&a.ids, kv, &a.meta, &mut acts.acts, &mut a.logits, n)?;
    model
        .backend()
        .argmax_rows(&a.logits, vocab, n, &mut a.picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_batch_with_little_padding() {
        for n in 1..=300 {
            let b = batch_bucket(n);
            assert!(b >= n);
            if n > 32 {
                assert!(b - n < 16 && b.is_multiple_of(16), "{n} -> {b}");
            }
        }
        assert_eq!([1, 2, 3, 5, 17, 33].map(batch_bucket), [1, 2, 4, 8, 32, 48]);
        assert_eq!([1, 256, 257, 5000].map(ctx_bucket), [256, 256, 512, 8192]);
    }

    #[test]
    fn fed_rows_copy_in_runs() {
        assert_eq!(runs(&[0, 1, 2, 3]), [(0, 0, 4)]);
        // Rows 1 and 4 of the step before ended.
        assert_eq!(runs(&[0, 2, 3, 5]), [(0, 0, 1), (1, 2, 2), (3, 5, 1)]);
        assert_eq!(runs(&[3, 2]), [(0, 3, 1), (1, 2, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
