//! Streaming text of one sequence: incremental detokenization that never splits a UTF-8 character,
//! and stop-string matching that never streams text a stop string may still swallow.
//!
//! Design: Hugging Face TGI's / vLLM's incremental decoding with a prefix and a read offset: decode
//! the tokens since `prefix_offset` twice (without and with the new ones) and emit the difference,
//! unless the new text ends in U+FFFD (a character still incomplete). The first of those decodes
//! only changes when the offsets move, so its length is kept until they do: a token that adds no
//! text (an id the codec skips, one byte of a longer character) costs one decode, not two. Stop
//! strings: the newest `longest_stop - 1` bytes stay held back until the sequence finishes.

use super::codec::TextCodec;

/// Incremental detokenizer state for one sequence.
#[derive(Debug, Clone)]
pub struct TextStream {
    /// Token ids decoded so far, starting with up to `CONTEXT` prompt tokens for spacing context.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Length of the text of `ids[prefix_offset..read_offset]`, once decoded (None after the
    /// offsets move).
    prefix_text_len: Option<usize>,
    /// All text produced (before stop truncation takes effect).
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    stop: Vec<String>,
    hold_back: usize,
}

/// Prompt tokens kept as decoding context (leading-space handling of SentencePiece-style tokenizers).
const CONTEXT: usize = 5;

/// What one new token produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TextDelta {
    /// Text safe to stream now (whole characters, not possibly part of a stop string).
    pub text: String,
    /// A stop string matched; the text was cut just before it.
    pub stopped: bool,
}

impl TextStream {
    /// A stream for a sequence with prompt `prompt` that stops at any of `stop`.
    pub fn new(prompt: &[u32], stop: Vec<String>) -> Self {
        let ctx = &prompt[prompt.len().saturating_sub(CONTEXT)..];
        let hold_back = stop
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        Self {
            ids: ctx.to_vec(),
            prefix_offset: 0,
            read_offset: ctx.len(),
            prefix_text_len: None,
            text: String::new(),
            emitted: 0,
            stop,
            hold_back,
        }
    }

    /// The stop strings this stream cuts at.
    pub fn stops(&self) -> &[String] {
        &self.stop
    }

    /// The full text so far (including what is held back).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text handed out so far (what the stream's events carried; held-back text excluded).
    pub fn emitted(&self) -> &str {
        self.text.get(..self.emitted).unwrap_or_default()
    }

    /// Adds one generated token.
    pub fn push(&mut self, codec: &dyn TextCodec, token: u32) -> Result<TextDelta, String> {
        self.ids.push(token);
        let prefix_len = self.prefix_text_len(codec)?;
        let full = codec.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix_len && !full.ends_with('\u{FFFD}') {
            if let Some(new) = full.get(prefix_len..) {
                self.text.push_str(new);
            }
            self.advance();
        }
        Ok(self.release(false))
    }

    /// Length of the text of `ids[prefix_offset..read_offset]`, decoded once per offset pair.
    fn prefix_text_len(&mut self, codec: &dyn TextCodec) -> Result<usize, String> {
        match self.prefix_text_len {
            Some(n) => Ok(n),
            None => {
                let n = codec
                    .decode(&self.ids[self.prefix_offset..self.read_offset])?
                    .len();
                self.prefix_text_len = Some(n);
                Ok(n)
            }
        }
    }

    /// Everything decoded so far is text now: the read window becomes the prefix.
    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.prefix_text_len = None;
    }

    /// The sequence finished: flushes everything still held back (an incomplete final character is
    /// emitted as U+FFFD, as the tokenizer decodes it).
    pub fn finish(&mut self, codec: &dyn TextCodec) -> Result<TextDelta, String> {
        if self.read_offset < self.ids.len() {
            let prefix_len = self.prefix_text_len(codec)?;
            let full = codec.decode(&self.ids[self.prefix_offset..])?;
            if let Some(new) = full.get(prefix_len..) {
                self.text.push_str(new);
            }
            self.advance();
        }
        Ok(self.release(true))
    }

    /// Cuts at the first stop string, then hands out what is safe.
    fn release(&mut self, finished: bool) -> TextDelta {
        // A match can only start in the part not yet handed out (earlier text was checked).
        let search_from =
            floor_char_boundary(&self.text, self.emitted.saturating_sub(self.hold_back));
        let hit = self
            .stop
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| search_from + i)
            })
            .min();
        if let Some(at) = hit {
            self.text.truncate(at);
        }
        let end = if hit.is_some() || finished {
            self.text.len()
        } else {
            floor_char_boundary(&self.text, self.text.len().saturating_sub(self.hold_back))
        };
        let end = end.max(self.emitted);
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        TextDelta {
            text: out,
            stopped: hit.is_some(),
        }
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::codec::ByteCodec;
    use super::*;

    fn stream_all(text: &str, stop: &[&str]) -> (Vec<String>, bool) {
        let mut s = TextStream::new(&[b'>' as u32], stop.iter().map(|x| x.to_string()).collect());
        let mut deltas = Vec::new();
        for b in text.bytes() {
            let d = s.push(&ByteCodec, b as u32).unwrap();
            deltas.push(d.text);
            if d.stopped {
                return (deltas, true);
            }
        }
        deltas.push(s.finish(&ByteCodec).unwrap().text);
        (deltas, false)
    }

    #[test]
    fn deltas_never_split_a_character() {
        let text = "héllo wörld 🎉 ok";
        let (deltas, stopped) = stream_all(text, &[]);
        assert!(!stopped);
        assert_eq!(deltas.concat(), text);
        // Every delta is a whole string (it is a String, so valid UTF-8); the emoji's first three
        // bytes produce empty deltas, its fourth the whole character.
        let emoji_at = deltas.iter().position(|d| d.contains('🎉')).unwrap();
        assert_eq!(deltas[emoji_at], "🎉");
        assert!(deltas[emoji_at - 3..emoji_at].iter().all(String::is_empty));
    }

    #[test]
    fn stop_string_cuts_and_is_never_streamed() {
        let (deltas, stopped) = stream_all("abc STOP def", &["STOP", "zz"]);
        assert!(stopped);
        assert_eq!(deltas.concat(), "abc ");
        // A near-miss is streamed in full once it cannot become a stop string.
        let (deltas, stopped) = stream_all("STOxP", &["STOP"]);
        assert!(!stopped);
        assert_eq!(deltas.concat(), "STOxP");
    }

    /// The byte codec, counting its decode calls.
    struct Counting(AtomicUsize);

    impl TextCodec for Counting {
        fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
            ByteCodec.encode(text)
        }
        fn decode(&self, ids: &[u32]) -> Result<String, String> {
            self.0.fetch_add(1, Ordering::Relaxed);
            ByteCodec.decode(ids)
        }
    }

    /// The incremental decoding of TGI / vLLM written out plainly (two decodes per token, nothing
    /// kept), without stop strings: the text after each token and at the end.
    fn reference_deltas(prompt: &[u32], tokens: &[u32]) -> Vec<String> {
        let mut ids = prompt[prompt.len().saturating_sub(CONTEXT)..].to_vec();
        let (mut prefix_offset, mut read_offset) = (0, ids.len());
        let mut deltas = Vec::new();
        for &t in tokens {
            ids.push(t);
            let prefix = ByteCodec.decode(&ids[prefix_offset..read_offset]).unwrap();
            let full = ByteCodec.decode(&ids[prefix_offset..]).unwrap();
            if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
                deltas.push(full.get(prefix.len()..).unwrap_or_default().to_string());
                prefix_offset = read_offset;
                read_offset = ids.len();
            } else {
                deltas.push(String::new());
            }
        }
        let prefix = ByteCodec.decode(&ids[prefix_offset..read_offset]).unwrap();
        let full = ByteCodec.decode(&ids[prefix_offset..]).unwrap();
        deltas.push(full.get(prefix.len()..).unwrap_or_default().to_string());
        deltas
    }

    proptest::proptest! {
        /// Same deltas as the plain algorithm on random ids: ASCII, UTF-8 lead and continuation
        /// bytes, and ids the codec skips (>= 256).
        #[test]
        fn same_deltas_as_the_plain_algorithm(
            prompt in proptest::collection::vec(0u32..300, 1..8),
            tokens in proptest::collection::vec(
                proptest::prop_oneof![0u32..128, 0x80u32..0x100, 256u32..1000], 0..60),
        ) {
            let mut s = TextStream::new(&prompt, Vec::new());
            let mut got: Vec<String> = tokens
                .iter()
                .map(|&t| s.push(&ByteCodec, t).unwrap().text)
                .collect();
            got.push(s.finish(&ByteCodec).unwrap().text);
            proptest::prop_assert_eq!(got, reference_deltas(&prompt, &tokens));
        }
    }

    #[test]
    fn a_token_without_text_costs_one_decode() {
        let codec = Counting(AtomicUsize::new(0));
        let mut s = TextStream::new(&[b'>' as u32], Vec::new());
        s.push(&codec, b'a' as u32).unwrap();
        let before = codec.0.load(Ordering::Relaxed);
        // Ids the byte codec skips add no text: the offsets stay, the prefix is not decoded again.
        for _ in 0..10 {
            assert_eq!(s.push(&codec, 1000).unwrap().text, "");
        }
        assert_eq!(
            codec.0.load(Ordering::Relaxed) - before,
            11,
            "one prefix decode, then one per token"
        );
        assert_eq!(s.push(&codec, b'b' as u32).unwrap().text, "b");
    }

    #[test]
    fn incomplete_tail_is_flushed_at_finish() {
        let mut s = TextStream::new(&[], vec![]);
        // First two bytes of a three-byte character.
        assert_eq!(s.push(&ByteCodec, 0xE2).unwrap().text, "");
        assert_eq!(s.push(&ByteCodec, 0x82).unwrap().text, "");
        assert_eq!(s.finish(&ByteCodec).unwrap().text, "\u{FFFD}");
    }
}
