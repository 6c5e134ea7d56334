//! sov's tokenizer: a thin wrapper over the `tokenizers` crate (Hugging Face's tokenizer library),
//! built from a `tokenizer.json` or from GGUF metadata (see `gguf::tokenizer`).
//!
//! Design: the wrapper fixes the small API the engine needs (encode, decode, token/id lookup,
//! vocabulary size) and owns the one thing `tokenizer.json` expresses through its post-processor
//! but GGUF expresses through `tokenizer.ggml.add_bos_token` / `add_eos_token`: prepending BOS
//! and appending EOS.

use std::path::Path;

use super::error::LoadError;

/// A text <-> token-id codec.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Token prepended by `encode(_, true)` (GGUF `add_bos_token`); tokenizer.json files do this
    /// in their own post-processor instead.
    prepend_bos: Option<u32>,
    /// Token appended by `encode(_, true)` (GGUF `add_eos_token`).
    append_eos: Option<u32>,
}

impl Tokenizer {
    /// Wraps a built `tokenizers` tokenizer; `prepend_bos` is added in front of `encode(_, true)`.
    pub fn from_inner(inner: tokenizers::Tokenizer, prepend_bos: Option<u32>) -> Self {
        Tokenizer {
            inner,
            prepend_bos,
            append_eos: None,
        }
    }

    /// This tokenizer, with `append_eos` added at the end of `encode(_, true)`.
    pub fn with_eos_appended(mut self, append_eos: Option<u32>) -> Self {
        self.append_eos = append_eos;
        self
    }

    /// Reads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        if !path.is_file() {
            return Err(LoadError::Missing {
                path: path.to_path_buf(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| LoadError::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(Tokenizer::from_inner(inner, None))
    }

    /// Token ids of `text`. With `add_special`, the tokenizer's own additions (BOS for models that
    /// want it) are included. Special tokens written in the text (`<|im_start|>`) always encode to
    /// their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, LoadError> {
        let encoding =
            self.inner
                .encode_fast(text, add_special)
                .map_err(|e| LoadError::Tokenize {
                    message: format!("encoding {} bytes of text: {e}", text.len()),
                })?;
        let ids = encoding.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 2);
        match self.prepend_bos {
            Some(bos) if add_special && ids.first() != Some(&bos) => out.push(bos),
            _ => {}
        }
        out.extend_from_slice(ids);
        if let Some(eos) = self.append_eos.filter(|_| add_special) {
            out.push(eos);
        }
        Ok(out)
    }

    /// Text of `ids`, special tokens included (so `decode(encode(s))` gives back `s`). Ids outside
    /// the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, LoadError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| LoadError::Tokenize {
                message: format!("decoding {} ids: {e}", ids.len()),
            })
    }

    /// Text of `ids` without special tokens (`<|im_end|>` and friends).
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String, LoadError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| LoadError::Tokenize {
                message: format!("decoding {} ids: {e}", ids.len()),
            })
    }

    /// Id of the token spelled `token` (vocabulary or added tokens).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Text token `id` adds in the middle of a text, special tokens skipped (as
    /// [`decode_skip_special`](Self::decode_skip_special)). `decode(&[id])` alone is not that for
    /// SentencePiece vocabularies: their decoder strips the `▁` space marker at the start of a
    /// text, so `▁Paris` would read `Paris`. This decodes the token after an anchor token (`a`)
    /// and returns what it added; where that cannot be done, the token decoded alone.
    pub fn token_text(&self, id: u32) -> Result<String, LoadError> {
        let alone = || self.decode_skip_special(&[id]);
        let Some(&anchor) = self.encode("a", false)?.last() else {
            return alone();
        };
        let head = self.decode_skip_special(&[anchor])?;
        let pair = self.decode_skip_special(&[anchor, id])?;
        match pair.strip_prefix(head.as_str()) {
            Some(rest) if !head.is_empty() => Ok(rest.to_string()),
            _ => alone(),
        }
    }

    /// Spelling of token `id` (byte-level BPE spells a space as `Ġ`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether `encode(_, true)` puts `bos` in front (checked by encoding, so it covers both the
    /// GGUF flag and a tokenizer.json post-processor).
    pub fn adds_bos(&self, bos: u32) -> bool {
        matches!(self.encode("a", true), Ok(ids) if ids.first() == Some(&bos))
            && !matches!(self.encode("a", false), Ok(ids) if ids.first() == Some(&bos))
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture GGUF's tokenizer (byte-level BPE, control tokens 0..3).
    fn tiny() -> Tokenizer {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("src/loader/fixtures/tiny_llama.gguf");
        crate::loader::load_model(&path, false)
            .expect("fixture loads")
            .tokenizer
    }

    #[test]
    fn gguf_add_bos_prepends_only_with_add_special() {
        let t = Tokenizer::from_inner(tiny().inner().clone(), Some(1));
        assert_eq!(t.encode("the", true).expect("encodes")[0], 1);
        assert_ne!(t.encode("the", false).expect("encodes")[0], 1);
        // A prompt that already starts with BOS does not get a second one.
        let ids = t.encode("<|im_start|>the", true).expect("encodes");
        assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
        assert!(t.adds_bos(1));
        assert!(!tiny().adds_bos(1));
    }

    /// Byte-level BPE spells spaces inside its tokens (`Ġ`), so a token's text in the middle of
    /// a text is the token decoded alone; a special token's is empty.
    #[test]
    fn token_text_of_byte_level_bpe_is_the_token_alone() {
        let t = tiny();
        let ids = t
            .encode("Once upon a time, there was", false)
            .expect("encodes");
        assert!(ids.len() > 3);
        for id in ids {
            let alone = t.decode_skip_special(&[id]).expect("decodes");
            assert_eq!(t.token_text(id).expect("decodes"), alone, "id {id}");
        }
        assert_eq!(t.token_text(1).expect("decodes"), "");
    }

    /// A tokenizer.json whose post-processor adds BOS (as Llama 3's does) is detected as such.
    #[test]
    fn tokenizer_json_template_processing_bos_is_detected() {
        let mut json: serde_json::Value =
            serde_json::from_str(&tiny().inner().to_string(false).expect("serializes"))
                .expect("json");
        json["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}
            ],
            "pair": [
                {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}}
            ],
            "special_tokens": {
                "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).expect("write");
        let t = Tokenizer::from_file(&path).expect("loads");
        assert_eq!(t.encode("the", true).expect("encodes")[0], 1);
        assert!(t.adds_bos(1));
        assert_eq!(t.decode(&[1, 260]).expect("decodes"), "<|im_start|>the");
        assert_eq!(t.decode_skip_special(&[1, 260]).expect("decodes"), "the");

        std::fs::write(&path, "{ not json").expect("write");
        let err = Tokenizer::from_file(&path).expect_err("garbage");
        assert!(
            err.to_string().contains("tokenizer.json: tokenizer:"),
            "{err}"
        );
    }
}
