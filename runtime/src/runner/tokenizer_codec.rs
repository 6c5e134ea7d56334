//! [`TokenizerCodec`]: the loader's tokenizer as the engine's [`TextCodec`].

use crate::engine::TextCodec;
use crate::loader::Tokenizer;

/// The loader's tokenizer as the engine's codec. `add_special` adds the model's BOS (when it uses
/// one) in front of every prompt, as `transformers` does for plain completion prompts.
pub struct TokenizerCodec {
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// Prepend the model's BOS token (when it has one) to every prompt.
    pub add_special: bool,
}

impl TextCodec for TokenizerCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, self.add_special)
            .map_err(|e| e.to_string())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer
            .decode_skip_special(ids)
            .map_err(|e| e.to_string())
    }

    fn token_text(&self, t: u32) -> String {
        self.tokenizer.token_text(t).unwrap_or_default()
    }
}
