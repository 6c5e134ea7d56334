//! The client side of a witness's reply: which of its cosignature lines verify, for a given signed
//! checkpoint, under the witness keys the client trusts (lines by unknown keys are ignored, as
//! c2sp.org/tlog-witness asks), and attaching verified lines to the checkpoint note.

use crate::error::{CheckpointError, Result};
use crate::note::{self, Note, VerifierKey};

/// One verified cosignature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cosignature {
    /// Index of the witness key (in the list given) that made it.
    pub witness: usize,
    /// Its timestamp, seconds since the epoch.
    pub timestamp: u64,
    /// The signature line, newline-terminated.
    pub line: String,
}

/// The lines among `lines` that are valid cosignatures of `checkpoint` (a signed note) by one of
/// `witnesses`. A line naming a trusted key that does not verify is an error (a forged or
/// corrupted reply), a line of an unknown key is skipped.
pub fn verified(
    checkpoint: &str,
    lines: &[String],
    witnesses: &[VerifierKey],
) -> Result<Vec<Cosignature>> {
    let body = note::parse(checkpoint)?.body;
    let mut out = Vec::new();
    for line in lines {
        let sig = note::parse(&format!("x\n\n{line}"))?
            .signatures
            .pop()
            .ok_or_else(|| CheckpointError::Decode("empty cosignature line".into()))?;
        let one = Note {
            body: body.clone(),
            signatures: vec![sig],
        };
        for (i, w) in witnesses.iter().enumerate() {
            if let Some(timestamp) = one.verify_cosignature(w)? {
                out.push(Cosignature {
                    witness: i,
                    timestamp,
                    line: line.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The checkpoint note with `lines` appended (what a verifier with a policy reads).
pub fn attach<'a>(checkpoint: &str, lines: impl IntoIterator<Item = &'a str>) -> String {
    let mut s = checkpoint.to_string();
    for l in lines {
        s.push_str(l);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    #[test]
    fn keeps_valid_lines_skips_unknown_refuses_forged() {
        let body = "example.com/log\n3\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n";
        let cp = note::sign(body, "example.com/log", &SigningKey::from_bytes(&[1; 32])).unwrap();
        let (k2, k3) = (
            SigningKey::from_bytes(&[2; 32]),
            SigningKey::from_bytes(&[3; 32]),
        );
        let w2 = crate::witness::witness_verifier("w2", &k2.verifying_key()).unwrap();
        let l2 = note::cosign_line(body, "w2", &k2, 10).unwrap();
        let l3 = note::cosign_line(body, "w3", &k3, 11).unwrap();
        let got = verified(&cp, &[l2.clone(), l3], std::slice::from_ref(&w2)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].witness, got[0].timestamp), (0, 10));
        let policy = crate::Policy {
            witnesses: vec![w2.clone()],
            quorum: 1,
        };
        let attached = attach(&cp, [l2.as_str()]);
        assert_eq!(
            policy
                .count_cosignatures(&note::parse(&attached).unwrap())
                .unwrap(),
            1
        );
        // A line of w2 over another body does not verify: an error, not a skipped line.
        let other = note::cosign_line("example.com/log\n4\nx\n", "w2", &k2, 10).unwrap();
        assert!(verified(&cp, &[other], &[w2]).is_err());
    }
}
