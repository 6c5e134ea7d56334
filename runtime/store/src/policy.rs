//! Witness policy: which witness keys may cosign receipts and how many must (k of n).
//!
//! File format (one directive per line, `#` comments), modelled on the Sigsum/C2SP policy files:
//! ```text
//! witness <name>+<hex key id>+<base64(0x04 || Ed25519 public key)>
//! witness ...
//! quorum 2
//! ```
//! A receipt is quorate when at least `quorum` distinct listed witnesses have a valid tlog
//! cosignature/v1 line on it.

use std::path::Path;

use super::error::{CheckpointError, Result};
use super::note::{self, Note, VerifierKey};

/// A parsed k-of-n witness policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Witness keys allowed to cosign (type [`TYPE_COSIGNATURE`](note::TYPE_COSIGNATURE)).
    pub witnesses: Vec<VerifierKey>,
    /// Number of distinct listed witnesses that must have a valid cosignature on a receipt.
    pub quorum: usize,
}

impl Policy {
    /// Parse policy text.
    pub fn parse(text: &str) -> Result<Self> {
        let mut witnesses: Vec<VerifierKey> = Vec::new();
        let mut quorum = None;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad =
                |what: &str| CheckpointError::Decode(format!("policy line {}: {what}", n + 1));
            let (word, rest) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad("expected a directive and a value"))?;
            match word {
                "witness" => {
                    let vk = VerifierKey::parse(rest.trim()).map_err(|e| bad(&e.to_string()))?;
                    if vk.kind != note::TYPE_COSIGNATURE {
                        return Err(bad("witness key must be a cosignature/v1 key (type 0x04)"));
                    }
                    if witnesses
                        .iter()
                        .any(|w| w.name == vk.name || w.key == vk.key)
                    {
                        return Err(bad("duplicate witness"));
                    }
                    witnesses.push(vk);
                }
                "quorum" => {
                    if quorum.is_some() {
                        return Err(bad("quorum given twice"));
                    }
                    quorum = Some(
                        rest.trim()
                            .parse::<usize>()
                            .map_err(|_| bad("quorum must be a number"))?,
                    );
                }
                _ => return Err(bad("unknown directive (expected witness or quorum)")),
            }
        }
        let quorum =
            quorum.ok_or_else(|| CheckpointError::Decode("policy: no quorum line".into()))?;
        if quorum == 0 || quorum > witnesses.len() {
            return Err(CheckpointError::Decode(format!(
                "policy: quorum {quorum} must be between 1 and the {} witnesses listed",
                witnesses.len()
            )));
        }
        Ok(Self { witnesses, quorum })
    }

    /// Read and parse a policy file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
        Self::parse(&text)
    }

    /// Count valid cosignatures on `note` by listed witnesses; an invalid one is an error.
    pub fn count_cosignatures(&self, note: &Note) -> Result<usize> {
        let mut n = 0;
        for w in &self.witnesses {
            if note.verify_cosignature(w)?.is_some() {
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn wkey(seed: u8, name: &str) -> VerifierKey {
        VerifierKey {
            name: name.into(),
            kind: note::TYPE_COSIGNATURE,
            key: SigningKey::from_bytes(&[seed; 32]).verifying_key(),
        }
    }

    #[test]
    fn parses_and_counts_k_of_n() {
        let (a, b) = (wkey(1, "w1"), wkey(2, "w2"));
        let text = format!(
            "# witnesses\nwitness {}\nwitness {}\nquorum 2\n",
            a.to_text(),
            b.to_text()
        );
        let p = Policy::parse(&text).unwrap();
        assert_eq!(p.quorum, 2);
        let body = "x\n";
        let mut note_text = note::sign(body, "log", &SigningKey::from_bytes(&[9; 32])).unwrap();
        note_text.push_str(
            &note::cosign_line(body, "w1", &SigningKey::from_bytes(&[1; 32]), 10).unwrap(),
        );
        let n = note::parse(&note_text).unwrap();
        assert_eq!(p.count_cosignatures(&n).unwrap(), 1);
        note_text.push_str(
            &note::cosign_line(body, "w2", &SigningKey::from_bytes(&[2; 32]), 11).unwrap(),
        );
        assert_eq!(
            p.count_cosignatures(&note::parse(&note_text).unwrap())
                .unwrap(),
            2
        );
    }

    #[test]
    fn rejects_bad_policies() {
        let a = wkey(1, "w1");
        for bad in [
            "quorum 1\n".to_string(),
            format!("witness {}\nquorum 2\n", a.to_text()),
            format!("witness {}\nquorum 0\n", a.to_text()),
            format!(
                "witness {}\nwitness {}\nquorum 1\n",
                a.to_text(),
                a.to_text()
            ),
            format!("witnes {}\nquorum 1\n", a.to_text()),
            format!("witness {}\n", a.to_text()),
        ] {
            assert!(Policy::parse(&bad).is_err(), "accepted {bad:?}");
        }
    }
}
