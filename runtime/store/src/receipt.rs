//! Receipts: the signed statement of one checkpoint, chained by digest.
//!
//! Canonical body (one field per line, fixed order, lowercase hex, decimal without leading zeros):
//! ```text
//! sov-receipt/v1
//! height 5
//! prev <64 hex: digest of the previous receipt body, zeros at height 1>
//! spec <64 hex: SPEC_DIGEST of the machine that ran>
//! model <64 hex: digest of the model weights/config>
//! snapshot <64 hex: digest of the snapshot file>
//! kv-root <64 hex: digest over the snapshot's ordered block hashes>
//! time <unix milliseconds>
//! ```
//! The body is a C2SP signed note signed by the engine key; witnesses may append tlog cosignature
//! lines. The receipt digest (what chains and what slots 8..15 mirror) is BLAKE3 of the body; parsing
//! re-serializes and compares, so any non-canonical byte is refused.

use ed25519_dalek::{SigningKey, VerifyingKey};

use super::digest::{Digest, from_hex, receipt_digest, to_hex};
use super::error::{CheckpointError, Result};
use super::note;

/// Receipt format version (first body line).
pub const RECEIPT_FORMAT: u32 = 1;
/// Note key name the engine signs receipts with.
pub const SIGNER_NAME: &str = "sov-checkpoint";

/// The signed content of a receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptBody {
    /// Position in the chain, starting at 1.
    pub height: u64,
    /// Digest of the previous receipt body (all zeros at height 1).
    pub prev: Digest,
    /// `SPEC_DIGEST` of the machine that ran.
    pub spec: Digest,
    /// Digest of the model weights and config.
    pub model: Digest,
    /// Digest of the snapshot file.
    pub snapshot: Digest,
    /// Digest over the snapshot's ordered block hashes.
    pub kv_root: Digest,
    /// Wall time of the checkpoint, unix milliseconds.
    pub time_ms: u64,
}

impl ReceiptBody {
    /// The canonical text the signature covers.
    pub fn canonical(&self) -> String {
        format!(
            "sov-receipt/v{RECEIPT_FORMAT}\nheight {}\nprev {}\nspec {}\nmodel {}\nsnapshot {}\nkv-root {}\ntime {}\n",
            self.height,
            to_hex(&self.prev),
            to_hex(&self.spec),
            to_hex(&self.model),
            to_hex(&self.snapshot),
            to_hex(&self.kv_root),
            self.time_ms
        )
    }

    /// Digest of the canonical body.
    pub fn digest(&self) -> Digest {
        receipt_digest(self.canonical().as_bytes())
    }

    /// Parse a canonical body; anything that does not re-serialize byte-identically is refused.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |what: &str| CheckpointError::Decode(format!("receipt body: {what}"));
        let mut lines = text.lines();
        if lines.next() != Some(format!("sov-receipt/v{RECEIPT_FORMAT}").as_str()) {
            return Err(bad("unknown format line"));
        }
        let mut field = |name: &str| -> Result<String> {
            let line = lines
                .next()
                .ok_or_else(|| bad(&format!("missing {name}")))?;
            let value = line
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .ok_or_else(|| bad(&format!("expected {name}")))?;
            Ok(value.to_string())
        };
        let number = |s: String, name: &str| -> Result<u64> {
            s.parse::<u64>()
                .map_err(|_| bad(&format!("{name} is not a number")))
        };
        let digest = |s: String, name: &str| {
            from_hex(&s).ok_or_else(|| bad(&format!("{name} is not 64 hex digits")))
        };
        let height = number(field("height")?, "height")?;
        let prev = digest(field("prev")?, "prev")?;
        let spec = digest(field("spec")?, "spec")?;
        let model = digest(field("model")?, "model")?;
        let snapshot = digest(field("snapshot")?, "snapshot")?;
        let kv_root = digest(field("kv-root")?, "kv-root")?;
        let time_ms = number(field("time")?, "time")?;
        let body = Self {
            height,
            prev,
            spec,
            model,
            snapshot,
            kv_root,
            time_ms,
        };
        if body.canonical() != text {
            return Err(bad("not in canonical form"));
        }
        Ok(body)
    }
}

/// A receipt as read from disk and verified against the engine key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedReceipt {
    /// The verified body.
    pub body: ReceiptBody,
    /// BLAKE3 digest of the canonical body.
    pub digest: Digest,
    /// The engine's Ed25519 signature over the body.
    pub signature: [u8; 64],
    /// The parsed note (for cosignature checks).
    pub note: note::Note,
}

/// Sign a receipt body, returning the note text to store.
pub fn sign(body: &ReceiptBody, key: &SigningKey) -> Result<String> {
    note::sign(&body.canonical(), SIGNER_NAME, key)
}

/// Parse receipt note text and verify its signature by `key` with `verify_strict`.
pub fn open(text: &str, key: &VerifyingKey) -> Result<SignedReceipt> {
    let note = note::parse(text)?;
    let body = ReceiptBody::parse(&note.body)?;
    let signature = note.verify_signer(key)?;
    let digest = receipt_digest(note.body.as_bytes());
    Ok(SignedReceipt {
        body,
        digest,
        signature,
        note,
    })
}

/// Parse receipt note text without checking any signature (used to detect forks and foreign keys).
pub fn parse_unverified(text: &str) -> Result<(ReceiptBody, Digest)> {
    let note = note::parse(text)?;
    let body = ReceiptBody::parse(&note.body)?;
    let digest = receipt_digest(note.body.as_bytes());
    Ok((body, digest))
}

/// The slot words that mirror a receipt: slot 7 the height, 8..15 the digest, 16..31 the signature
/// (each 4 bytes little-endian, as `specs/runtime.toml` lays out slots 16..31).
pub fn slot_words(height: u64, digest: &Digest, signature: &[u8; 64]) -> [u32; 25] {
    let mut out = [0u32; 25];
    out[0] = u32::try_from(height).unwrap_or(u32::MAX);
    for (i, w) in digest
        .chunks_exact(4)
        .chain(signature.chunks_exact(4))
        .enumerate()
    {
        out[1 + i] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    out
}

/// Read a receipt digest back from slots 8..15 (the inverse of [`slot_words`]).
pub fn digest_from_slots(slots: &[u32; 32]) -> Digest {
    let mut d = [0u8; 32];
    for (i, w) in slots[8..16].iter().enumerate() {
        d[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body() -> ReceiptBody {
        ReceiptBody {
            height: 3,
            prev: [1; 32],
            spec: [2; 32],
            model: [3; 32],
            snapshot: [4; 32],
            kv_root: [5; 32],
            time_ms: 1_764_430_000_000,
        }
    }

    #[test]
    fn sign_open_round_trip_and_other_key_refused() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let text = sign(&body(), &key).unwrap();
        let r = open(&text, &key.verifying_key()).unwrap();
        assert_eq!(r.body, body());
        assert_eq!(r.digest, body().digest());
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(open(&text, &other.verifying_key()).is_err());
    }

    #[test]
    fn non_canonical_bodies_refused() {
        let c = body().canonical();
        for bad in [
            c.replace("height 3", "height 03"),
            c.replace("height 3", "height  3"),
            c.replace("prev 01", "prev 0A"),
            c.clone() + "extra\n",
            c.replace("time", "Time"),
        ] {
            assert!(ReceiptBody::parse(&bad).is_err(), "accepted {bad:?}");
        }
        assert_eq!(ReceiptBody::parse(&c).unwrap(), body());
    }

    #[test]
    fn every_flipped_byte_of_a_receipt_is_refused() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let text = sign(&body(), &key).unwrap();
        let vk = key.verifying_key();
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x20, 0x80] {
                let mut b = bytes.to_vec();
                b[i] ^= bit;
                if let Ok(s) = std::str::from_utf8(&b) {
                    assert!(
                        open(s, &vk).is_err(),
                        "flip of byte {i} bit {bit:#x} accepted"
                    );
                }
            }
        }
    }

    #[test]
    fn slot_words_round_trip() {
        let d: Digest = std::array::from_fn(|i| i as u8);
        let sig = [0xabu8; 64];
        let w = slot_words(7, &d, &sig);
        let mut slots = [0u32; 32];
        slots[7..32].copy_from_slice(&w);
        assert_eq!(slots[7], 7);
        assert_eq!(digest_from_slots(&slots), d);
        assert_eq!(slots[16], 0xabab_abab);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn decoders_never_panic(text in "(sov-receipt/v1\n)?[a-z0-9 \n\u{2014}+/=-]{0,400}") {
            let _ = ReceiptBody::parse(&text);
            let _ = parse_unverified(&text);
            let _ = open(&text, &SigningKey::from_bytes(&[1; 32]).verifying_key());
        }

        #[test]
        fn decoders_never_panic_on_mutated_receipts(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..5)) {
            let key = SigningKey::from_bytes(&[9; 32]);
            let mut chars: Vec<char> = sign(&body(), &key).unwrap().chars().collect();
            for (i, c) in edits {
                let at = i.index(chars.len());
                chars[at] = c;
            }
            let text: String = chars.into_iter().collect();
            let _ = open(&text, &key.verifying_key());
        }
    }
}
