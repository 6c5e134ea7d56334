//! Reads one streamed OpenAI chunk (the JSON in an SSE `data:` line) leniently, so the benchmark
//! works against any OpenAI-compatible server (sov serve, llama.cpp's llama-server, vLLM).
//!
//! Design: vLLM `bench serve`'s reading of a chunk. The text is `choices[0].text` (completions)
//! or `choices[0].delta.content` (chat); `usage` (the `stream_options.include_usage` chunk, or a
//! server that sends it on the last content chunk) gives the token counts. Anything else in the
//! chunk is ignored; a chunk that is not JSON, or an `error` object, is reported as an error.

use serde_json::Value;

/// What one chunk says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// Generated text of the chunk's first choice (`text` or `delta.content`), when it has some.
    pub text: Option<String>,
    /// `usage.prompt_tokens`, when the chunk carries usage.
    pub prompt_tokens: Option<usize>,
    /// `usage.completion_tokens`, when the chunk carries usage.
    pub completion_tokens: Option<usize>,
}

impl Chunk {
    /// Whether the chunk delivers generated text (counts as a token arrival). A role-only chat
    /// delta or an empty `text` does not.
    pub fn has_text(&self) -> bool {
        self.text.as_deref().is_some_and(|t| !t.is_empty())
    }
}

/// Parses one chunk; `Err` holds a message for a malformed chunk or a streamed error object.
pub fn parse_chunk(data: &str) -> Result<Chunk, String> {
    let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk is not JSON ({e})"))?;
    if let Some(err) = v.get("error") {
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Err(format!("server error in stream: {message}"));
    }
    let choice = v.get("choices").and_then(|c| c.get(0));
    let text = choice.and_then(|c| {
        c.get("text")
            .or_else(|| c.get("delta").and_then(|d| d.get("content")))
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let usage = v.get("usage").filter(|u| u.is_object());
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .map(|n| n as usize)
    };
    Ok(Chunk {
        text,
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_chat_usage_and_error_chunks() {
        // Shapes as the OpenAI API reference documents them (completions and chat chunk objects).
        let c = parse_chunk(r#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]}"#).unwrap();
        assert_eq!((c.text.as_deref(), c.has_text()), (Some("Hi"), true));
        let role = parse_chunk(r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#).unwrap();
        assert!(!role.has_text());
        let chat =
            parse_chunk(r#"{"choices":[{"index":0,"delta":{"content":" there"}}],"usage":null}"#)
                .unwrap();
        assert_eq!(chat.text.as_deref(), Some(" there"));
        assert_eq!(chat.completion_tokens, None);
        let usage = parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#).unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (Some(12), Some(7))
        );
        assert!(!usage.has_text());
        assert!(
            parse_chunk(r#"{"error":{"message":"boom","type":"x"}}"#)
                .unwrap_err()
                .contains("boom")
        );
        assert!(parse_chunk("not json").is_err());
    }
}
