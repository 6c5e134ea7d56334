//! The text side of the engine: a tokenizer seen through two calls, so the engine does not depend
//! on which tokenizer implementation the loader provides.

/// Text to token ids and back. `decode` of a prefix that ends inside a multi-byte character must
/// yield U+FFFD there (what byte-level BPE tokenizers do), which [`super::text`] relies on to hold
/// partial characters back.
pub trait TextCodec: Send + Sync {
    /// Token ids of `text` (no special tokens added beyond what the text spells out).
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Text of `ids`, special tokens skipped.
    fn decode(&self, ids: &[u32]) -> Result<String, String>;
    /// Text token `t` adds in the middle of a text (logprobs' `token` strings); by default the
    /// token decoded alone, which differs where a decoder treats a text's start specially
    /// (SentencePiece's leading `▁`).
    fn token_text(&self, t: u32) -> String {
        self.decode(&[t]).unwrap_or_default()
    }
}

/// A byte-level codec: token id = byte value. For tests and demos with random-weight models, whose
/// vocabulary has no tokenizer; ids >= 256 decode to nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        let bytes: Vec<u8> = ids.iter().filter_map(|&t| u8::try_from(t).ok()).collect();
        // Valid UTF-8 (the usual case) becomes the string without a copy.
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}
