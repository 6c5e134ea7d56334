//! The one call the engine makes into a model: a forward pass over a batch of sequence chunks on a
//! paged KV cache the model owns. [`crate::model::LlamaModel`] implements it on every backend; tests
//! of scheduling logic use `FakeModel` (the `fake` test module).

use rayon::prelude::*;

use super::draw::{DrawSpec, draw};
use super::sampler::argmax;
use crate::checkpoint::driver::KvBlockIo;
use crate::model::batch::SeqChunk;

/// A model plus its paged KV cache, driven by the engine's block tables.
pub trait ForwardModel: Send {
    /// Size of the logits row of one chunk.
    fn vocab_size(&self) -> usize;
    /// Runs `chunks` (prefill chunks and decode tokens mixed) and returns the logits of the last
    /// token of each chunk, `[chunks.len(), vocab_size]` row-major.
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String>;
    /// Runs `chunks` as [`ForwardModel::forward`] does and returns what `picks` asks of each
    /// chunk's last token: the argmax or drawn token chosen by the model (on its device when it
    /// can), or the logits row for the engine to sample on the host. The default runs `forward`
    /// and picks on the host, with the sampler's own [`argmax`] and [`draw`].
    fn forward_pick(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        pick_on_host(self.vocab_size(), self.forward(chunks)?, picks)
    }
    /// [`ForwardModel::forward_pick`], running `host` (the host work of the step before: text,
    /// events) while the pass computes: exactly once, whether the pass succeeds or not. A model
    /// on an accelerator runs it between launching the pass and waiting for its answer, so the
    /// host work no longer stands between two passes; the default (a model on the host's own
    /// cores) runs it after the pass.
    fn forward_pick_overlapped(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        let picked = self.forward_pick(chunks, picks);
        host.run();
        picked
    }
    /// Block-level access to the KV cache, for checkpoints that store KV (`KvMode::Blocks`);
    /// None when the model keeps no KV the engine can read (then only `Recompute` mode works).
    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        None
    }
    /// Whether [`ForwardModel::launch_decode`] takes a decode step with these picks (the engine
    /// asks before each launch). Default: no, the model answers every step in turn.
    fn launches_decode(&self, picks: &[RowPick]) -> bool {
        let _ = picks;
        false
    }
    /// Enqueues a decode step (every chunk one new token, every pick a token the model chooses)
    /// and returns without waiting for it; its picks come back from
    /// [`ForwardModel::wait_decode`], oldest launch first. With `fed` (`[rows]`), row `i`'s input
    /// token is not its chunk's (a placeholder) but the token the model picks for row `fed[i]` of
    /// the step launched just before, still in flight: the engine launches step N + 1 before
    /// step N's tokens reach the host (`super::ahead`). A launch that fails leaves nothing in
    /// flight.
    fn launch_decode(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), String> {
        let _ = (chunks, picks, fed);
        Err("this model does not launch decode steps ahead".into())
    }
    /// The picks of the oldest decode step [`ForwardModel::launch_decode`] enqueued, once it is
    /// done (one token a row); an error when none is in flight.
    fn wait_decode(&mut self) -> Result<PickedRows, String> {
        Err("no decode step is in flight".into())
    }
    /// Whether [`ForwardModel::launch_pass`] takes a pass with these picks (the engine asks
    /// before each launch). Default: no, every pass is answered before the next.
    fn launches_pass(&self, picks: &[RowPick]) -> bool {
        let _ = picks;
        false
    }
    /// Enqueues a pass over `chunks` (any pass [`ForwardModel::forward_pick`] takes: prompt
    /// chunks in the engine's use) and returns without waiting for it; its picks come back from
    /// [`ForwardModel::wait_pass`], oldest launch first. At most two passes are in flight: the
    /// engine launches prefill pass N + 1 before it waits for pass N (`super::prefill_ahead`).
    /// A launch that fails leaves nothing more in flight.
    fn launch_pass(&mut self, chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> Result<(), String> {
        let _ = (chunks, picks);
        Err("this model does not launch passes ahead".into())
    }
    /// The picks of the oldest pass [`ForwardModel::launch_pass`] enqueued, once it is done; an
    /// error when none is in flight.
    fn wait_pass(&mut self) -> Result<PickedRows, String> {
        Err("no pass is in flight".into())
    }
}

/// Host work handed to [`ForwardModel::forward_pick_overlapped`], run at most once: whoever
/// launches the pass runs it while the pass computes, and the caller runs it afterwards if nobody
/// did ([`HostWork::run`] is a no-op the second time).
pub struct HostWork<'a> {
    work: Option<&'a mut dyn FnMut()>,
}

impl<'a> HostWork<'a> {
    /// Work to run once.
    pub fn new(work: &'a mut dyn FnMut()) -> Self {
        Self { work: Some(work) }
    }

    /// No work (callers of the overlapped paths that have none).
    pub fn none() -> Self {
        Self { work: None }
    }

    /// Runs the work if it has not run yet.
    pub fn run(&mut self) {
        if let Some(work) = self.work.take() {
            work();
        }
    }
}

impl<T: ForwardModel + ?Sized> ForwardModel for Box<T> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, String> {
        (**self).forward(chunks)
    }
    fn forward_pick(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
    ) -> Result<PickedRows, String> {
        (**self).forward_pick(chunks, picks)
    }
    fn forward_pick_overlapped(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        host: &mut HostWork<'_>,
    ) -> Result<PickedRows, String> {
        (**self).forward_pick_overlapped(chunks, picks, host)
    }
    fn kv_io(&mut self) -> Option<&mut dyn KvBlockIo> {
        (**self).kv_io()
    }
    fn launches_decode(&self, picks: &[RowPick]) -> bool {
        (**self).launches_decode(picks)
    }
    fn launch_decode(
        &mut self,
        chunks: &[SeqChunk<'_>],
        picks: &[RowPick],
        fed: Option<&[u32]>,
    ) -> Result<(), String> {
        (**self).launch_decode(chunks, picks, fed)
    }
    fn wait_decode(&mut self) -> Result<PickedRows, String> {
        (**self).wait_decode()
    }
    fn launches_pass(&self, picks: &[RowPick]) -> bool {
        (**self).launches_pass(picks)
    }
    fn launch_pass(&mut self, chunks: &[SeqChunk<'_>], picks: &[RowPick]) -> Result<(), String> {
        (**self).launch_pass(chunks, picks)
    }
    fn wait_pass(&mut self) -> Result<PickedRows, String> {
        (**self).wait_pass()
    }
}

/// What the engine needs from one chunk's last token after a forward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowPick {
    /// Nothing (a prompt chunk that does not finish its prompt).
    Skip,
    /// The largest logit, the lowest token id among ties (greedy sampling without penalties or
    /// logprobs): the model may choose it where the logits are, so only the id travels.
    Argmax,
    /// The token [`draw`] chooses with this spec (temperature, top-k, top-p, min-p sampling
    /// without penalties, bias or logprobs; the request's random bits included): the draw is
    /// specified to the bit, so the model may make it where the logits are.
    Draw(DrawSpec),
    /// The logits row, for the host sampler.
    Logits,
}

impl RowPick {
    /// Whether the model answers this row with a token (an argmax or a draw).
    pub fn is_token(&self) -> bool {
        matches!(self, RowPick::Argmax | RowPick::Draw(_))
    }

    /// The token this pick asks of `row` (`[vocab]` logits), chosen on the host; None for the
    /// rows that want no token.
    pub fn token_on_host(&self, row: &[f32]) -> Option<u32> {
        match self {
            RowPick::Argmax => Some(argmax(row)),
            RowPick::Draw(spec) => Some(draw(row, spec)),
            RowPick::Skip | RowPick::Logits => None,
        }
    }
}

/// Result of [`ForwardModel::forward_pick`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PickedRows {
    /// Per chunk: the chosen token of an [`RowPick::Argmax`] or [`RowPick::Draw`] row, None for
    /// the others.
    pub tokens: Vec<Option<u32>>,
    /// Logits of the [`RowPick::Logits`] rows, in chunk order: `[count of those rows, vocab]`.
    pub logits: Vec<f32>,
}

/// [`ForwardModel::forward_pick`] from a full `[picks.len(), vocab]` logits matrix, on the host.
pub fn pick_on_host(
    vocab: usize,
    logits: Vec<f32>,
    picks: &[RowPick],
) -> Result<PickedRows, String> {
    if vocab == 0 || logits.len() != picks.len() * vocab {
        return Err(format!(
            "forward returned {} logits for {} rows of {vocab}",
            logits.len(),
            picks.len()
        ));
    }
    if picks.iter().all(|p| *p == RowPick::Logits) {
        return Ok(PickedRows {
            tokens: vec![None; picks.len()],
            logits,
        });
    }
    let rows = logits.chunks_exact(vocab.max(1));
    let draws = picks
        .iter()
        .filter(|p| matches!(p, RowPick::Draw(_)))
        .count();
    let tokens = if draws > 1 {
        // A draw reads the whole row (~0.6 ms at a 128K vocabulary): the rows on the pool.
        let rows: Vec<&[f32]> = rows.clone().collect();
        picks
            .par_iter()
            .zip(rows)
            .map(|(pick, row)| pick.token_on_host(row))
            .collect()
    } else {
        picks
            .iter()
            .zip(rows.clone())
            .map(|(pick, row)| pick.token_on_host(row))
            .collect()
    };
    let mut out = PickedRows {
        tokens,
        logits: Vec::new(),
    };
    for (pick, row) in picks.iter().zip(rows) {
        if *pick == RowPick::Logits {
            out.logits.extend_from_slice(row);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_picks_follow_the_sampler_argmax_and_keep_only_logits_rows() {
        // 3 rows of a vocabulary of 4; row 1 has a tie (lowest id wins), row 2 a NaN.
        let logits = vec![
            0.5,
            2.0,
            -1.0,
            0.0, //
            3.0,
            -2.0,
            3.0,
            1.0, //
            f32::NAN,
            0.1,
            0.7,
            0.2,
        ];
        let picks = [RowPick::Logits, RowPick::Argmax, RowPick::Argmax];
        let out = pick_on_host(4, logits.clone(), &picks).unwrap();
        assert_eq!(out.tokens, vec![None, Some(0), Some(2)]);
        assert_eq!(out.logits, logits[..4].to_vec());
        // Skip rows give nothing; all-Logits keeps the matrix as it is.
        let out = pick_on_host(4, logits.clone(), &[RowPick::Skip; 3]).unwrap();
        assert_eq!((out.tokens, out.logits.len()), (vec![None; 3], 0));
        let out = pick_on_host(4, logits.clone(), &[RowPick::Logits; 3]).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out.logits), bits(&logits));
        // Draw rows come back as the drawn token: top-k 1 is the argmax, and any draw is `draw`'s.
        let spec = DrawSpec {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            bits: 3 << 50,
        };
        let one = DrawSpec { top_k: 1, ..spec };
        let drawn = [RowPick::Draw(one), RowPick::Draw(spec), RowPick::Draw(spec)];
        let out = pick_on_host(4, logits.clone(), &drawn).unwrap();
        let want: Vec<Option<u32>> = (0..3)
            .map(|r| Some(draw(&logits[r * 4..r * 4 + 4], &drawn_spec(&drawn[r]))))
            .collect();
        assert_eq!(out.tokens, want);
        assert_eq!((out.tokens[0], out.logits.len()), (Some(1), 0));
        // A forward that returned the wrong number of values is an error, not a panic.
        assert!(pick_on_host(4, logits[..8].to_vec(), &picks).is_err());
        assert!(pick_on_host(0, Vec::new(), &picks).is_err());
    }

    fn drawn_spec(pick: &RowPick) -> DrawSpec {
        match pick {
            RowPick::Draw(spec) => *spec,
            _ => panic!("not a draw"),
        }
    }

    #[test]
    fn host_work_runs_once() {
        let mut count = 0;
        {
            let mut work = || count += 1;
            let mut host = HostWork::new(&mut work);
            host.run();
            host.run();
        }
        assert_eq!(count, 1);
        HostWork::none().run();
    }
}
