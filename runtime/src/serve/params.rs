//! Request bodies of `/v1/completions` and `/v1/chat/completions`, parsed and checked into a
//! [`Job`]: token prompts, sampling, limits and how the response is shaped.
//!
//! Design: lenient like vLLM (unknown fields ignored, nulls mean "default"), strict on values
//! (OpenAI's ranges and messages, 400 naming the parameter); wrong JSON types are 422. The same
//! function rebuilds a job from a journaled body on resume or retry, so it must be deterministic.

use std::collections::HashMap;

use serde::Deserialize;

use super::engine_link;
use super::error::ApiError;
use super::registry::Endpoint;
use crate::engine::request::MAX_TOP_LOGPROBS;
use crate::engine::{SamplingParams, TextCodec};
use crate::loader::{ChatMessage, ChatTemplate};

/// Most choices per request (`n` times the number of prompts).
pub const MAX_CHOICES: usize = 128;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `prompt` of `/v1/completions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with empty `choices` and the `usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Fields both endpoints take.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonBody {
    /// The model id (must be the served one when given).
    pub model: Option<String>,
    /// Most new tokens.
    pub max_tokens: Option<i64>,
    /// Chat's newer spelling of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature in [0, 2] (default 1).
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1] (default 1).
    pub top_p: Option<f32>,
    /// Top-k (0 or -1: off).
    pub top_k: Option<i64>,
    /// Min-p in [0, 1].
    pub min_p: Option<f32>,
    /// Sampler seed (choice i uses seed + i).
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// Hugging Face repetition penalty (> 0).
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) -> bias in [-100, 100].
    pub logit_bias: Option<HashMap<String, f64>>,
    /// No EOS or stop before this many tokens.
    pub min_tokens: Option<i64>,
    /// Keep going past EOS.
    pub ignore_eos: Option<bool>,
    /// End-user id (accepted, unused).
    pub user: Option<String>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    pub response_format: Option<serde_json::Value>,
    /// Only null or 1.
    pub best_of: Option<i64>,
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionBody {
    /// Shared fields.
    #[serde(flatten)]
    pub common: CommonBody,
    /// The prompt(s).
    pub prompt: PromptField,
    /// Return the prompt before the completion.
    pub echo: Option<bool>,
    /// Top logprobs per token (0..=20).
    pub logprobs: Option<i64>,
}

/// One part of a message's list content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other part types are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts (`{"type":"text","text":...}`).
    Parts(Vec<ContentPart>),
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Its content (null: empty).
    pub content: Option<Content>,
    /// Optional author name.
    pub name: Option<String>,
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatBody {
    /// Shared fields.
    #[serde(flatten)]
    pub common: CommonBody,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Return logprobs of the chosen tokens.
    pub logprobs: Option<bool>,
    /// And this many alternatives per token (0..=20).
    pub top_logprobs: Option<i64>,
}

/// What the server needs to turn a body into a job.
pub struct JobContext<'a> {
    /// Tokenizer.
    pub codec: &'a dyn TextCodec,
    /// The chat template, if any.
    pub template: Option<&'a ChatTemplate>,
    /// The served model id.
    pub model_name: &'a str,
    /// Prompt plus completion tokens allowed.
    pub context_len: usize,
    /// Vocabulary size (logit_bias keys must be below it).
    pub vocab_size: usize,
}

/// Which logprobs shape the response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogprobsMode {
    /// None.
    Off,
    /// Completions' `{tokens, token_logprobs, top_logprobs, text_offset}` with this many tops.
    Completion(usize),
    /// Chat's `{content: [{token, logprob, bytes, top_logprobs}]}` with this many tops.
    Chat(usize),
}

/// One prompt of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPrompt {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Its text (for `echo`).
    pub text: String,
    /// Most new tokens for it.
    pub max_tokens: usize,
}

/// A checked request, ready to submit.
#[derive(Debug, Clone)]
pub struct Job {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The prompts (one for chat).
    pub prompts: Vec<JobPrompt>,
    /// Choices per prompt.
    pub n: usize,
    /// Sampling (seed is the first choice's; choice i uses seed + i).
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep going past EOS.
    pub ignore_eos: bool,
    /// Token bias.
    pub logit_bias: Vec<(u32, f32)>,
    /// No EOS/stop before this many tokens.
    pub min_tokens: usize,
    /// Stream as SSE.
    pub stream: bool,
    /// Last chunk carries usage.
    pub include_usage: bool,
    /// Completions: prompt text before the completion.
    pub echo: bool,
    /// Logprobs shape.
    pub logprobs: LogprobsMode,
    /// Structured output (`response_format`), None: free text.
    pub grammar: Option<crate::engine::constraint::Grammar>,
}

impl Job {
    /// Choices in the response (prompts times n); choice i is prompt i / n.
    pub fn choices(&self) -> usize {
        self.prompts.len() * self.n
    }
}

fn decode_body<T: serde::de::DeserializeOwned>(body: &serde_json::Value) -> Result<T, ApiError> {
    serde_json::from_value(body.clone()).map_err(|e| ApiError::unprocessable(e.to_string()))
}

/// Parses and checks a body of `endpoint`.
pub fn parse(
    endpoint: Endpoint,
    body: &serde_json::Value,
    cx: &JobContext<'_>,
) -> Result<Job, ApiError> {
    if !body.is_object() {
        return Err(ApiError::unprocessable(
            "the request body must be a JSON object",
        ));
    }
    let (common, texts, echo, logprobs) = match endpoint {
        Endpoint::Completion => {
            let b: CompletionBody = decode_body(body)?;
            let lp = match b.logprobs {
                None => LogprobsMode::Off,
                Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                    LogprobsMode::Completion(k as usize)
                }
                Some(k) => {
                    return Err(ApiError::invalid_param(
                        "logprobs",
                        format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                    ));
                }
            };
            let prompts = completion_prompts(b.prompt, cx)?;
            (b.common, prompts, b.echo.unwrap_or(false), lp)
        }
        Endpoint::Chat => {
            let b: ChatBody = decode_body(body)?;
            let lp = match (b.logprobs.unwrap_or(false), b.top_logprobs) {
                (false, Some(k)) if k > 0 => {
                    return Err(ApiError::invalid_param(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    ));
                }
                (false, _) => LogprobsMode::Off,
                (true, None) => LogprobsMode::Chat(0),
                (true, Some(k)) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                    LogprobsMode::Chat(k as usize)
                }
                (true, Some(k)) => {
                    return Err(ApiError::invalid_param(
                        "top_logprobs",
                        format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                    ));
                }
            };
            let text = chat_prompt(&b.messages, cx)?;
            let tokens = cx
                .codec
                .encode(&text)
                .map_err(|e| ApiError::bad_request(format!("tokenizer: {e}")))?;
            (b.common, vec![(tokens, text)], false, lp)
        }
    };
    build(endpoint, common, texts, echo, logprobs, cx)
}

fn completion_prompts(
    prompt: PromptField,
    cx: &JobContext<'_>,
) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let encode = |t: String| -> Result<(Vec<u32>, String), ApiError> {
        let ids = cx
            .codec
            .encode(&t)
            .map_err(|e| ApiError::bad_request(format!("tokenizer: {e}")))?;
        Ok((ids, t))
    };
    let decode = |ids: Vec<u32>| -> Result<(Vec<u32>, String), ApiError> {
        if let Some(&t) = ids.iter().find(|&&t| t as usize >= cx.vocab_size) {
            return Err(ApiError::invalid_param(
                "prompt",
                format!(
                    "token id {t} is outside the vocabulary (size {})",
                    cx.vocab_size
                ),
            ));
        }
        let text = cx.codec.decode(&ids).unwrap_or_default();
        Ok((ids, text))
    };
    let out: Vec<_> = match prompt {
        PromptField::Text(t) => vec![encode(t)?],
        PromptField::Texts(ts) => ts.into_iter().map(encode).collect::<Result<_, _>>()?,
        PromptField::Tokens(ids) => vec![decode(ids)?],
        PromptField::TokenLists(l) => l.into_iter().map(decode).collect::<Result<_, _>>()?,
    };
    if out.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "prompt must not be empty",
        ));
    }
    if out.iter().any(|(ids, _)| ids.is_empty()) {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    Ok(out)
}

/// Renders the conversation with the model's chat template.
pub fn chat_prompt(messages: &[Message], cx: &JobContext<'_>) -> Result<String, ApiError> {
    let template = cx.template.ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions")
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut values = Vec::with_capacity(messages.len());
    for m in messages {
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                "messages",
                                format!(
                                    "content parts of type `{kind}` are not supported (text only)"
                                ),
                            ));
                        }
                    }
                }
                texts.join("\n")
            }
        };
        let mut msg = ChatMessage::new(m.role.clone(), content);
        msg.name = m.name.clone();
        values.push(msg);
    }
    template
        .apply(&values, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn build(
    endpoint: Endpoint,
    c: CommonBody,
    texts: Vec<(Vec<u32>, String)>,
    echo: bool,
    logprobs: LogprobsMode,
    cx: &JobContext<'_>,
) -> Result<Job, ApiError> {
    if let Some(m) = &c.model
        && m != cx.model_name
    {
        return Err(ApiError::model_not_found(m));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    if let Some(b) = c.best_of
        && b != 1
    {
        return Err(ApiError::invalid_param(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    let n = c.n.unwrap_or(1);
    if n < 1 || (n as usize).saturating_mul(texts.len()) > MAX_CHOICES {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be at least 1 and n times the prompts at most {MAX_CHOICES}"),
        ));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match c.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be -1 (off) or positive, got {k}"),
            ));
        }
    };
    let max_tokens = c.max_completion_tokens.or(c.max_tokens);
    if let Some(m) = max_tokens
        && m < 1
    {
        return Err(ApiError::invalid_param(
            "max_tokens",
            format!("max_tokens must be at least 1, got {m}"),
        ));
    }
    let min_tokens = match c.min_tokens.unwrap_or(0) {
        m if m < 0 => {
            return Err(ApiError::invalid_param(
                "min_tokens",
                "min_tokens must be >= 0",
            ));
        }
        m => m as usize,
    };
    if let (Some(m), Some(max)) = (c.min_tokens, max_tokens)
        && m > max
    {
        return Err(ApiError::invalid_param(
            "min_tokens",
            "min_tokens must not exceed max_tokens",
        ));
    }
    let mut logit_bias = Vec::new();
    for (k, v) in c.logit_bias.unwrap_or_default() {
        let id: u32 = k.parse().map_err(|_| {
            ApiError::invalid_param(
                "logit_bias",
                format!("logit_bias key `{k}` is not a token id"),
            )
        })?;
        if id as usize >= cx.vocab_size {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!(
                    "token id {id} is outside the vocabulary (size {})",
                    cx.vocab_size
                ),
            ));
        }
        if !(-100.0..=100.0).contains(&v) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!("logit_bias values must be in [-100, 100], got {v}"),
            ));
        }
        logit_bias.push((id, v as f32));
    }
    logit_bias.sort_by_key(|&(id, _)| id);
    let stop = match c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
            "stop",
            "stop strings must not be empty",
        ));
    }
    let grammar = match &c.response_format {
        Some(f) => engine_link::structured(f)?,
        None => None,
    };
    let mut prompts = Vec::with_capacity(texts.len());
    for (tokens, text) in texts {
        let p = tokens.len();
        let max = match max_tokens {
            Some(m) => m as usize,
            None => cx.context_len.saturating_sub(p),
        };
        if p.saturating_add(max) > cx.context_len || max == 0 {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({} in the messages, {} in the completion). Please reduce the length of the \
                 messages or completion.",
                cx.context_len,
                p.saturating_add(max),
                p,
                max
            ))
            .with_param("messages")
            .with_code("context_length_exceeded"));
        }
        prompts.push(JobPrompt {
            tokens,
            text,
            max_tokens: max,
        });
    }
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        seed: c.seed.map(|s| s as u64),
        logprobs: match logprobs {
            LogprobsMode::Off => None,
            LogprobsMode::Completion(k) | LogprobsMode::Chat(k) => Some(k),
        },
        logit_bias: logit_bias.clone(),
        min_tokens,
    };
    sampling.validate().map_err(ApiError::from)?;
    Ok(Job {
        endpoint,
        prompts,
        n: n as usize,
        sampling,
        stop,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        logit_bias,
        min_tokens,
        stream,
        include_usage: c
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        echo,
        logprobs,
        grammar,
    })
}
