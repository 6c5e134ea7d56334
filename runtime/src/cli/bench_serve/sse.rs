//! Incremental Server-Sent Events decoder for streamed OpenAI responses.
//!
//! Design: the WHATWG HTML "server-sent events" event-stream grammar, reduced to what a client of
//! an OpenAI-compatible server needs. Bytes arrive in arbitrary pieces (a network read may end in
//! the middle of a line or of a UTF-8 sequence), so the decoder buffers until a line ending (LF,
//! CRLF or CR), ignores comment lines (`:` first, e.g. `: keep-alive`) and fields other than
//! `data`, joins the `data` lines of one event with LF, and yields the event's data at the blank
//! line that ends it. `data: [DONE]` (OpenAI's end marker) is reported as [`SseEvent::Done`].

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The event's data (its `data` lines joined with LF).
    Data(String),
    /// OpenAI's `data: [DONE]` end marker.
    Done,
}

/// Decoder state: the unfinished line and the data lines of the event being read.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
    /// The previous piece ended in CR: a LF at the start of the next piece belongs to it.
    after_cr: bool,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the stream; returns the events they complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.end_line(&line, &mut events);
                }
                _ => self.line.push(b),
            }
        }
        events
    }

    /// Ends the stream: an event whose closing blank line never came is still reported, as
    /// clients of servers that close the connection right after the last `data:` line expect.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.end_line(&line, &mut events);
        }
        self.end_line(b"", &mut events);
        events
    }

    fn end_line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                events.push(if data.trim() == "[DONE]" {
                    SseEvent::Done
                } else {
                    SseEvent::Data(data)
                });
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let value = String::from_utf8_lossy(value);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(&value);
                }
                None => self.data = Some(value.into_owned()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(stream: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for chunk in stream.chunks(piece) {
            out.extend(d.feed(chunk));
        }
        out.extend(d.finish());
        out
    }

    #[test]
    fn events_survive_any_split_comments_and_done() {
        let stream = ": keep-alive\n\ndata: {\"a\":\"é\"}\n\nid: 3\nevent: x\ndata: one\r\ndata:two\r\n\r\n: c\ndata: [DONE]\n\n";
        let want = vec![
            SseEvent::Data("{\"a\":\"é\"}".into()),
            SseEvent::Data("one\ntwo".into()),
            SseEvent::Done,
        ];
        // Every piece size, down to one byte (splits the CRLF pairs and the two-byte 'é').
        for piece in 1..=stream.len() {
            assert_eq!(
                decode_in_pieces(stream.as_bytes(), piece),
                want,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn lone_cr_ends_lines_and_unterminated_event_is_kept() {
        assert_eq!(
            decode_in_pieces(b"data: a\r\rdata: b", 3),
            vec![SseEvent::Data("a".into()), SseEvent::Data("b".into())]
        );
        // Blank lines and comments alone produce nothing.
        assert!(decode_in_pieces(b"\n\n: x\n\n", 2).is_empty());
    }
}
