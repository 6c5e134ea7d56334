//! Record framing shared by the append-only logs (`journal.log`, `heads.log`):
//! `[magic 4][len u32][header check 4][body check 8][body]` (little-endian; checks are keyed BLAKE3
//! over the magic and length, and over the body). A frame cut short at the end of a file is a torn
//! write; any complete frame that fails its checks is corruption.
//!
//! The checks catch torn and flipped bytes, not an adversary (anyone can recompute them): the
//! signed tree heads over the records do that.

use super::digest::record_checksum;
use super::error::{CheckpointError, Result};

/// Bytes before a frame's body.
pub const HEADER_LEN: usize = 20;
/// Largest body accepted when reading (guards allocation on a corrupted length).
pub const MAX_BODY: u32 = 256 << 20;

/// Frame `body` under `magic`.
pub fn encode(magic: &[u8; 4], body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_BODY)
        .ok_or_else(|| CheckpointError::Usage("log record too large".into()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&len.to_le_bytes());
    let hcheck = record_checksum(&[magic, &len.to_le_bytes()]);
    out.extend_from_slice(&hcheck[..4]);
    out.extend_from_slice(&record_checksum(&[body]));
    out.extend_from_slice(body);
    Ok(out)
}

/// The intact frames of a file.
#[derive(Debug, Clone, Default)]
pub struct Frames<'a> {
    /// (byte offset, body), in file order.
    pub bodies: Vec<(u64, &'a [u8])>,
    /// Bytes of complete, valid frames.
    pub valid_len: u64,
    /// Bytes after `valid_len` belonging to a torn final frame (0 when none).
    pub torn_bytes: u64,
}

/// Split `bytes` into frames: all complete frames must be valid; only the last may be torn.
/// Errors name `file` and the byte offset.
pub fn scan<'a>(bytes: &'a [u8], magic: &[u8; 4], file: &str) -> Result<Frames<'a>> {
    let corrupt = |at: usize, what: &str| {
        CheckpointError::corrupt(file, None, format!("record at byte {at}: {what}"))
    };
    let mut out = Frames::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER_LEN {
            // Only a torn header may be short, and it must still be a prefix of a plausible header.
            if !magic.starts_with(&rest[..rest.len().min(4)]) {
                return Err(corrupt(at, "bad magic"));
            }
            out.torn_bytes = rest.len() as u64;
            break;
        }
        if &rest[..4] != magic {
            return Err(corrupt(at, "bad magic"));
        }
        let len_bytes = [rest[4], rest[5], rest[6], rest[7]];
        if record_checksum(&[magic, &len_bytes])[..4] != rest[8..12] {
            return Err(corrupt(at, "header checksum mismatch"));
        }
        let len = u32::from_le_bytes(len_bytes);
        if len > MAX_BODY {
            return Err(corrupt(at, "length too large"));
        }
        let end = HEADER_LEN + len as usize;
        if rest.len() < end {
            out.torn_bytes = rest.len() as u64;
            break;
        }
        let body = &rest[HEADER_LEN..end];
        if record_checksum(&[body])[..] != rest[12..20] {
            return Err(corrupt(at, "body checksum mismatch"));
        }
        out.bodies.push((at as u64, body));
        at += end;
        out.valid_len = at as u64;
    }
    Ok(out)
}
