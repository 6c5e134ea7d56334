//! What a caller asks for: a prompt, how many tokens, how to sample, when to stop.
//!
//! Validation happens here, before anything reaches the engine thread, so a bad request is refused
//! with a clear [`EngineError`] and never disturbs the requests already running.

use super::draw::DrawSpec;
use super::error::EngineError;

/// The prompt, as text (tokenized by the engine's tokenizer) or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, encoded with the engine's tokenizer.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// Sampling parameters, with the meaning (and defaults) of vLLM's `SamplingParams`. The default
/// samples at temperature 1.0 without a seed, so two runs differ: set `temperature: 0.0` for greedy
/// decoding, or a `seed` for reproducible sampling.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability sums to at least top_p; 1 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below min_p times the top probability; 0 disables.
    pub min_p: f32,
    /// Hugging Face style: logits of tokens seen in prompt or output are divided (if positive) or
    /// multiplied (if negative) by it; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI style: subtract frequency_penalty * count of the token in the output so far.
    pub frequency_penalty: f32,
    /// OpenAI style: subtract presence_penalty once if the token occurs in the output so far.
    pub presence_penalty: f32,
    /// Seed of this request's random stream; `None` draws one at submit time (still recorded, so the
    /// run can be checkpointed and replayed).
    pub seed: Option<u64>,
    /// Return the log-probability of each chosen token and of the `n` most likely ones (`Some(0)`:
    /// chosen token only).
    pub logprobs: Option<usize>,
    /// OpenAI's `logit_bias`: added to these tokens' logits before sampling, each in [-100, 100]
    /// (-100 in effect bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// End-of-sequence tokens are suppressed until this many tokens were generated (vLLM's
    /// `min_tokens`; stop strings still apply).
    pub min_tokens: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
            logprobs: None,
            logit_bias: Vec::new(),
            min_tokens: 0,
        }
    }
}

/// The most top-n logprobs a request may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

impl SamplingParams {
    /// Greedy decoding (temperature 0), everything else at its default.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every value; the first bad one is named in the error.
    pub fn validate(&self) -> Result<(), EngineError> {
        fn bad(name: &'static str, value: impl ToString, reason: &'static str) -> EngineError {
            EngineError::InvalidSampling {
                name,
                value: value.to_string(),
                reason,
            }
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(bad(
                "temperature",
                self.temperature,
                "must be a finite number >= 0",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p, "must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", self.min_p, "must be in [0, 1]"));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return Err(bad(
                "repetition_penalty",
                self.repetition_penalty,
                "must be a finite number > 0",
            ));
        }
        if !self.frequency_penalty.is_finite() || self.frequency_penalty.abs() > 2.0 {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "must be in [-2, 2]",
            ));
        }
        if !self.presence_penalty.is_finite() || self.presence_penalty.abs() > 2.0 {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "must be in [-2, 2]",
            ));
        }
        if let Some(n) = self.logprobs
            && n > MAX_TOP_LOGPROBS
        {
            return Err(bad("logprobs", n, "at most 20 top logprobs"));
        }
        if let Some(&(token, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !b.is_finite() || b.abs() > 100.0)
        {
            return Err(bad(
                "logit_bias",
                format!("{token}: {bias}"),
                "each bias must be in [-100, 100]",
            ));
        }
        Ok(())
    }

    /// True when the next token, `generated` tokens into the output, is the [`super::draw::draw`]
    /// of the model's unchanged logits: sampled (not greedy), and nothing (penalty, bias, EOS
    /// suppression, logprobs) changes or reads the row, so the model may draw it where the logits
    /// are.
    pub fn is_plain_draw(&self, generated: usize) -> bool {
        !self.is_greedy() && self.leaves_the_row_alone(generated)
    }

    /// True when no penalty, bias, EOS suppression or logprobs changes or reads the logits row
    /// of the token `generated` tokens into the output.
    fn leaves_the_row_alone(&self, generated: usize) -> bool {
        self.logprobs.is_none()
            && self.repetition_penalty == 1.0
            && self.frequency_penalty == 0.0
            && self.presence_penalty == 0.0
            && self.logit_bias.is_empty()
            && generated >= self.min_tokens
    }

    /// The draw of a sampled token with these parameters and the request's random `bits` (53 of
    /// them); penalties, bias and logprobs are the sampler's, outside the draw.
    pub fn draw_spec(&self, bits: u64) -> DrawSpec {
        DrawSpec {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            bits,
        }
    }

    /// True when sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// True when the next token, `generated` tokens into the output, is the plain argmax of the
    /// model's logits: greedy, and nothing (penalty, bias, EOS suppression, logprobs) changes or
    /// reads the row, so the model may pick it where the logits are.
    pub fn is_plain_argmax(&self, generated: usize) -> bool {
        self.is_greedy() && self.leaves_the_row_alone(generated)
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// What to continue.
    pub prompt: Prompt,
    /// Most new tokens to generate (also capped by the scheduler's `max_tokens` constant and the
    /// context length).
    pub max_tokens: usize,
    /// How to sample each token.
    pub sampling: SamplingParams,
    /// Generation stops (reason `stop`) when the text contains one of these; the stop string itself
    /// is not returned.
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// The front end's own bytes about this request (e.g. a server's request id and body),
    /// journaled with it and handed back when a run resumes; the engine does not read them.
    pub tag: Vec<u8>,
    /// Structured output: the text must match this grammar (None: free text). Needs an engine
    /// with grammar support ([`super::EngineConfig::grammar`]).
    pub grammar: Option<super::constraint::Grammar>,
}

impl Request {
    /// A request for `max_tokens` new tokens after `prompt`, default sampling (temperature 1.0,
    /// unseeded: see [`SamplingParams`]).
    pub fn new(prompt: Prompt, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            tag: Vec::new(),
            grammar: None,
        }
    }

    /// Validation that does not need the tokenizer or the model.
    pub fn validate(&self) -> Result<(), EngineError> {
        match &self.prompt {
            Prompt::Text(t) if t.is_empty() => return Err(EngineError::EmptyPrompt),
            Prompt::Tokens(t) if t.is_empty() => return Err(EngineError::EmptyPrompt),
            _ => {}
        }
        if self.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens);
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(EngineError::InvalidSampling {
                name: "stop",
                value: "\"\"".into(),
                reason: "stop strings must not be empty",
            });
        }
        self.sampling.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Request {
        Request::new(Prompt::Text("hi".into()), 4)
    }

    #[test]
    fn accepts_defaults_and_greedy() {
        assert_eq!(req().validate(), Ok(()));
        let mut r = req();
        r.sampling = SamplingParams::greedy();
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn refuses_each_bad_value() {
        let mut r = req();
        r.prompt = Prompt::Text(String::new());
        assert_eq!(r.validate(), Err(EngineError::EmptyPrompt));
        let mut r = req();
        r.prompt = Prompt::Tokens(vec![]);
        assert_eq!(r.validate(), Err(EngineError::EmptyPrompt));
        let mut r = req();
        r.max_tokens = 0;
        assert_eq!(r.validate(), Err(EngineError::ZeroMaxTokens));
        type Edit = fn(&mut SamplingParams);
        let cases: [(&str, Edit); 11] = [
            ("temperature", |s| s.temperature = -0.5),
            ("temperature", |s| s.temperature = f32::NAN),
            ("top_p", |s| s.top_p = 0.0),
            ("top_p", |s| s.top_p = 1.5),
            ("min_p", |s| s.min_p = -0.1),
            ("repetition_penalty", |s| s.repetition_penalty = 0.0),
            ("frequency_penalty", |s| s.frequency_penalty = f32::INFINITY),
            ("presence_penalty", |s| s.presence_penalty = 3.0),
            ("logprobs", |s| s.logprobs = Some(21)),
            ("logit_bias", |s| s.logit_bias = vec![(3, 100.5)]),
            ("logit_bias", |s| {
                s.logit_bias = vec![(1, 0.0), (3, f32::NAN)]
            }),
        ];
        for (name, edit) in cases {
            let mut r = req();
            edit(&mut r.sampling);
            match r.validate() {
                Err(EngineError::InvalidSampling { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{name}: expected InvalidSampling, got {other:?}"),
            }
        }
        let mut r = req();
        r.stop = vec![String::new()];
        assert!(matches!(
            r.validate(),
            Err(EngineError::InvalidSampling { name: "stop", .. })
        ));
    }
}
