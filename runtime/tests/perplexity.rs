//! `sov::app::perplexity` against Hugging Face transformers 5.17: the perplexity sov measures over
//! a fixture's prompt (CPU backend, one window) equals the one transformers' own logits give
//! (`tests/fixtures/make_parity.py` stored them at every position), for the three tiny-random
//! fixtures; and windows split the text as documented (each window scored on its own).

mod common;

use common::fixture::load;
use sov::app::perplexity::{perplexity_on, token_nll};
use sov::backend::cpu::CpuBackend;
use sov::model::LlamaModel;

/// Mean negative log-likelihood of `tokens[1..]` under `logits` (`[tokens.len(), vocab]`, the
/// logits at each position), computed here from the reference's numbers.
fn reference_nll(tokens: &[u32], logits: &[f32], vocab: usize) -> f64 {
    let rows: Vec<f64> = logits
        .chunks_exact(vocab)
        .zip(&tokens[1..])
        .map(|(row, &next)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            max + sum.ln() - row[next as usize] as f64
        })
        .collect();
    rows.iter().sum::<f64>() / rows.len() as f64
}

#[test]
fn perplexity_equals_the_one_transformers_logits_give() {
    for name in ["tiny_llama3", "tiny_tied", "tiny_untied"] {
        let f = load(name);
        let vocab = f.config.vocab_size;
        let model = LlamaModel::new(CpuBackend::new(), &f.config, &f.weights).expect("fixture");
        for (tokens, logits) in f.prompts.iter().filter(|(t, _)| t.len() >= 2) {
            let want = reference_nll(tokens, logits, vocab);
            let got = perplexity_on(&model, tokens, tokens.len()).expect("perplexity");
            assert_eq!((got.scored, got.windows), (tokens.len() - 1, 1));
            assert!(
                (got.mean_nll - want).abs() < 1e-4,
                "{name}, {} tokens: mean NLL {} vs transformers' {want}",
                tokens.len(),
                got.mean_nll
            );
            println!(
                "{name}, {} tokens: perplexity {:.4} (transformers' logits: {:.4})",
                tokens.len(),
                got.value(),
                want.exp()
            );
        }
    }
}

#[test]
fn windows_are_scored_on_their_own() {
    let f = load("tiny_llama3");
    let model = LlamaModel::new(CpuBackend::new(), &f.config, &f.weights).expect("fixture");
    let tokens = f
        .prompts
        .iter()
        .map(|(t, _)| t)
        .max_by_key(|t| t.len())
        .expect("a prompt");
    let (window, parts) = (7, tokens.chunks(7).filter(|p| p.len() >= 2));
    let mut sum = 0.0;
    let mut scored = 0;
    for part in parts {
        let one = perplexity_on(&model, part, part.len()).expect("one window");
        sum += one.mean_nll * one.scored as f64;
        scored += one.scored;
    }
    let all = perplexity_on(&model, tokens, window).expect("windows");
    assert_eq!(all.scored, scored);
    assert_eq!(all.windows, tokens.len().div_ceil(window));
    assert!((all.mean_nll - sum / scored as f64).abs() < 1e-9);
    // Bad windows and too little text are errors, not panics.
    assert!(perplexity_on(&model, tokens, 1).is_err());
    assert!(perplexity_on(&model, tokens, f.config.max_position_embeddings + 1).is_err());
    assert!(perplexity_on(&model, &tokens[..1], window).is_err());
    assert_eq!(token_nll(&[0.0, 0.0], 1), Some(std::f64::consts::LN_2));
    assert_eq!(token_nll(&[0.0, 0.0], 2), None);
    assert_eq!(token_nll(&[f32::NEG_INFINITY; 3], 0), None);
}
