//! Signed tree heads of the verifiable log: C2SP tlog-checkpoint notes
//! (<https://c2sp.org/tlog-checkpoint>) signed with the run's key through [`super::note`].
//!
//! Canonical body (the three lines the format fixes, then sov's extension lines in fixed order;
//! digests lowercase hex, decimal without leading zeros; optional lines absent when unknown):
//! ```text
//! sov.run/<16 hex: the first leaf's hash>     origin: names this run's log
//! 42                                          tree size
//! <base64 of the 32-byte RFC 6962 root>       root hash
//! sov-spec <64 hex>                           SPEC_DIGEST of the machine that ran
//! sov-model <64 hex>                          digest of the model weights and config
//! sov-checkpoint <height> <64 hex>            newest checkpoint receipt (height, digest), if any
//! sov-snapshot <64 hex>                       its snapshot digest
//! sov-kv-root <64 hex>                        its KV root
//! sov-backend <name>                          e.g. cpu, cuda (when the engine says)
//! sov-precision <name>                        e.g. f32, bf16 (when the engine says)
//! sov-sampler <name>                          the sampled-token draw rule, e.g. draw-1 (when said)
//! ```
//! Parsing re-serializes and compares, so any non-canonical byte is refused.

use base64ct::{Base64, Encoding};
use ed25519_dalek::{SigningKey, VerifyingKey};

use super::digest::{Digest, from_hex, to_hex};
use super::error::{CheckpointError, Result};
use super::merkle::Hash;
use super::note;
use super::receipt::SIGNER_NAME;

/// The newest checkpoint a head names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadCheckpoint {
    /// Receipt height.
    pub height: u64,
    /// Receipt digest.
    pub receipt: Digest,
    /// Snapshot digest.
    pub snapshot: Digest,
    /// KV root.
    pub kv_root: Digest,
}

/// The signed content of a tree head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHead {
    /// The log's origin line (`sov.run/<16 hex>`).
    pub origin: String,
    /// Number of leaves.
    pub size: u64,
    /// RFC 6962 root of the first `size` leaves.
    pub root: Hash,
    /// `SPEC_DIGEST` of the machine that ran.
    pub spec: Digest,
    /// Digest of the model weights and config.
    pub model: Digest,
    /// The newest checkpoint at the time of the head.
    pub checkpoint: Option<HeadCheckpoint>,
    /// Compute backend name, when known.
    pub backend: Option<String>,
    /// Numeric precision name, when known.
    pub precision: Option<String>,
    /// The rule sampled tokens were drawn by, when named (heads before it have none).
    pub sampler: Option<String>,
}

/// The origin of the log whose first leaf hash is `first`.
pub fn origin_for(first: &Hash) -> String {
    format!("sov.run/{}", &to_hex(first)[..16])
}

fn check_word(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|c| c.is_ascii_graphic()) {
        return Err(CheckpointError::Decode(format!(
            "tree head: {what} must be 1 to 64 printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

impl TreeHead {
    /// The canonical note body.
    pub fn canonical(&self) -> String {
        let mut s = format!(
            "{}\n{}\n{}\nsov-spec {}\nsov-model {}\n",
            self.origin,
            self.size,
            Base64::encode_string(&self.root),
            to_hex(&self.spec),
            to_hex(&self.model)
        );
        if let Some(c) = &self.checkpoint {
            s.push_str(&format!(
                "sov-checkpoint {} {}\nsov-snapshot {}\nsov-kv-root {}\n",
                c.height,
                to_hex(&c.receipt),
                to_hex(&c.snapshot),
                to_hex(&c.kv_root)
            ));
        }
        if let Some(b) = &self.backend {
            s.push_str(&format!("sov-backend {b}\n"));
        }
        if let Some(p) = &self.precision {
            s.push_str(&format!("sov-precision {p}\n"));
        }
        if let Some(r) = &self.sampler {
            s.push_str(&format!("sov-sampler {r}\n"));
        }
        s
    }

    /// Parse a canonical body; anything that does not re-serialize byte-identically is refused.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |what: &str| CheckpointError::Decode(format!("tree head: {what}"));
        let lines: Vec<&str> = text
            .strip_suffix('\n')
            .unwrap_or(text)
            .split('\n')
            .collect();
        if lines.len() < 5 {
            return Err(bad("too few lines"));
        }
        let origin = lines[0].to_string();
        check_word("origin", &origin)?;
        let size = lines[1]
            .parse::<u64>()
            .map_err(|_| bad("tree size is not a number"))?;
        let raw = Base64::decode_vec(lines[2]).map_err(|_| bad("root hash is not base64"))?;
        let root: Hash = raw
            .as_slice()
            .try_into()
            .map_err(|_| bad("root hash is not 32 bytes"))?;
        let mut rest = lines[3..].iter().copied().peekable();
        let mut take = |name: &str| -> Option<String> {
            let v = rest
                .peek()?
                .strip_prefix(name)?
                .strip_prefix(' ')?
                .to_string();
            rest.next();
            Some(v)
        };
        let digest = |v: Option<String>, name: &str| -> Result<Digest> {
            v.as_deref()
                .and_then(from_hex)
                .ok_or_else(|| bad(&format!("{name} missing or not 64 hex digits")))
        };
        let spec = digest(take("sov-spec"), "sov-spec")?;
        let model = digest(take("sov-model"), "sov-model")?;
        let checkpoint = match take("sov-checkpoint") {
            None => None,
            Some(v) => {
                let (h, d) = v
                    .split_once(' ')
                    .ok_or_else(|| bad("sov-checkpoint needs a height and a digest"))?;
                Some(HeadCheckpoint {
                    height: h
                        .parse()
                        .map_err(|_| bad("checkpoint height is not a number"))?,
                    receipt: digest(Some(d.to_string()), "sov-checkpoint")?,
                    snapshot: digest(take("sov-snapshot"), "sov-snapshot")?,
                    kv_root: digest(take("sov-kv-root"), "sov-kv-root")?,
                })
            }
        };
        let backend = take("sov-backend");
        let precision = take("sov-precision");
        let sampler = take("sov-sampler");
        for (what, v) in [
            ("backend", &backend),
            ("precision", &precision),
            ("sampler", &sampler),
        ] {
            if let Some(v) = v {
                check_word(what, v)?;
            }
        }
        if rest.next().is_some() {
            return Err(bad("unknown or misplaced extension line"));
        }
        let head = Self {
            origin,
            size,
            root,
            spec,
            model,
            checkpoint,
            backend,
            precision,
            sampler,
        };
        if head.canonical() != text {
            return Err(bad("not in canonical form"));
        }
        Ok(head)
    }
}

/// Sign a head, returning the note text.
pub fn sign(head: &TreeHead, key: &SigningKey) -> Result<String> {
    note::sign(&head.canonical(), SIGNER_NAME, key)
}

/// Parse head note text and verify its signature by `key` (`verify_strict`).
pub fn open(text: &str, key: &VerifyingKey) -> Result<TreeHead> {
    let n = note::parse(text)?;
    let head = TreeHead::parse(&n.body)?;
    n.verify_signer(key)?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn head() -> TreeHead {
        TreeHead {
            origin: origin_for(&[0xab; 32]),
            size: 42,
            root: [7; 32],
            spec: [1; 32],
            model: [2; 32],
            checkpoint: Some(HeadCheckpoint {
                height: 3,
                receipt: [3; 32],
                snapshot: [4; 32],
                kv_root: [5; 32],
            }),
            backend: Some("cpu".into()),
            precision: Some("f32".into()),
            sampler: Some("draw-1".into()),
        }
    }

    #[test]
    fn is_a_c2sp_checkpoint_and_round_trips() {
        let h = head();
        let c = h.canonical();
        let mut lines = c.lines();
        assert_eq!(lines.next(), Some("sov.run/abababababababab"));
        assert_eq!(lines.next(), Some("42"));
        // The root line is standard padded base64 of the 32 bytes.
        assert_eq!(
            lines.next(),
            Some("BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=")
        );
        assert_eq!(TreeHead::parse(&c).unwrap(), h);
        let bare = TreeHead {
            checkpoint: None,
            backend: None,
            precision: None,
            sampler: None,
            ..h
        };
        assert_eq!(TreeHead::parse(&bare.canonical()).unwrap(), bare);
    }

    #[test]
    fn sign_open_and_refusals() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let text = sign(&head(), &key).unwrap();
        assert_eq!(open(&text, &key.verifying_key()).unwrap(), head());
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(open(&text, &other.verifying_key()).is_err());
        let c = head().canonical();
        for bad in [
            c.replace("\n42\n", "\n042\n"),
            c.replace("sov-model 0202", "sov-modelx 0202"),
            c.replace(
                "sov-backend cpu\nsov-precision f32\n",
                "sov-precision f32\nsov-backend cpu\n",
            ),
            c.clone() + "sov-extra x\n",
            c.replace("sov-kv-root", "sov-kvroot"),
            c.replace("sov-backend cpu", "sov-backend c u"),
            c.replace(
                "sov-precision f32\nsov-sampler draw-1\n",
                "sov-sampler draw-1\nsov-precision f32\n",
            ),
        ] {
            if let Ok(h) = TreeHead::parse(&bad) {
                panic!("accepted {bad:?} as {h:?}");
            }
        }
        let flipped = text.replacen("42", "43", 1);
        assert!(open(&flipped, &key.verifying_key()).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn decoders_never_panic(text in "(sov.run/[0-9a-f]{0,16}\n)?[0-9]{0,3}\n?[A-Za-z0-9+/=]{0,44}\n?(sov-[a-z-]{0,12} [0-9a-f ]{0,70}\n){0,8}") {
            let _ = TreeHead::parse(&text);
            let _ = open(&text, &SigningKey::from_bytes(&[1; 32]).verifying_key());
        }

        #[test]
        fn mutated_heads_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..5)) {
            let key = SigningKey::from_bytes(&[9; 32]);
            let mut chars: Vec<char> = sign(&head(), &key).unwrap().chars().collect();
            for (i, c) in edits {
                let at = i.index(chars.len());
                chars[at] = c;
            }
            let text: String = chars.into_iter().collect();
            let _ = open(&text, &key.verifying_key());
        }
    }
}
