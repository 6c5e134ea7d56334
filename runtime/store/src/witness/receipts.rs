//! Witness cosigning of snapshot receipts (C2SP tlog-cosignature/v1): a witness that has checked
//! a receipt appends one signature line to the receipt's note. The signed body (and so the receipt
//! digest and the chain) is unchanged, and the file only grows (earlier bytes are never rewritten).

use std::io::Write;
use std::path::Path;

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::audit::receipt_name;
use crate::error::{CheckpointError, Result};
use crate::note::{self, TYPE_COSIGNATURE, VerifierKey};
use crate::receipt;

/// The verifier key line (`name+id+base64(0x04 || key)`) a policy lists for a witness key.
pub fn witness_verifier(name: &str, key: &VerifyingKey) -> Result<VerifierKey> {
    note::check_name(name)?;
    Ok(VerifierKey {
        name: name.to_string(),
        kind: TYPE_COSIGNATURE,
        key: *key,
    })
}

/// Check receipt `height` in `dir` under the engine key, then append witness `name`'s cosignature
/// (timestamp in seconds since the epoch) and fsync. Refuses a second cosignature by one witness.
pub fn cosign(
    dir: &Path,
    height: u64,
    engine_key: &VerifyingKey,
    name: &str,
    witness: &SigningKey,
    timestamp: u64,
) -> Result<()> {
    let rname = receipt_name(height);
    let path = dir.join(&rname);
    let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
    let signed = receipt::open(&text, engine_key)
        .map_err(|e| CheckpointError::corrupt(&rname, Some(height), e.to_string()))?;
    let vk = witness_verifier(name, &witness.verifying_key())?;
    if signed.note.verify_cosignature(&vk)?.is_some() {
        return Err(CheckpointError::Usage(format!(
            "{name} already cosigned {rname}"
        )));
    }
    let line = note::cosign_line(&signed.note.body, name, witness, timestamp)?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| CheckpointError::io(&path, e))?;
    f.write_all(line.as_bytes())
        .and_then(|_| f.sync_data())
        .map_err(|e| CheckpointError::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{self, key};
    use crate::{AuditOptions, Policy, audit};
    use base64ct::Encoding;

    fn witness(i: u8) -> (String, SigningKey) {
        (
            format!("witness{i}"),
            SigningKey::from_bytes(&[0x70 + i; 32]),
        )
    }

    fn policy(k: usize) -> Policy {
        let lines: String = (1..=3)
            .map(|i| {
                let (name, sk) = witness(i);
                format!(
                    "witness {}\n",
                    witness_verifier(&name, &sk.verifying_key())
                        .unwrap()
                        .to_text()
                )
            })
            .collect();
        Policy::parse(&format!("{lines}quorum {k}\n")).unwrap()
    }

    #[test]
    fn k_of_n_quorum_over_a_real_chain() {
        let dir = tempfile::tempdir().unwrap();
        let infos = fixture::build(dir.path());
        let vk = key().verifying_key();
        let p = policy(2);
        let run = |p: &Policy| {
            audit(
                dir.path(),
                AuditOptions {
                    key: &vk,
                    policy: Some(p),
                    anchor: None,
                },
            )
        };
        assert!(run(&p).unwrap_err().to_string().contains("not quorate"));
        for h in 1..=3 {
            for i in [1, 3] {
                let (name, sk) = witness(i);
                cosign(dir.path(), h, &vk, &name, &sk, 1_764_000_000 + h).unwrap();
            }
        }
        let a = run(&p).unwrap();
        assert!(a.chain.iter().all(|l| l.cosignatures == 2));
        // Cosigning changes neither the receipt digests nor plain verification.
        assert_eq!(a.head().unwrap().receipt.digest, infos[2].digest);
        audit(
            dir.path(),
            AuditOptions {
                key: &vk,
                policy: None,
                anchor: None,
            },
        )
        .unwrap();
        assert!(
            run(&policy(3))
                .unwrap_err()
                .to_string()
                .contains("not quorate")
        );
        let (name, sk) = witness(1);
        assert!(
            cosign(dir.path(), 1, &vk, &name, &sk, 5).is_err(),
            "second cosignature by one witness"
        );
        // A cosignature line altered after the fact is an error, not a missing vote.
        let path = dir.path().join(receipt_name(2));
        let text = std::fs::read_to_string(&path).unwrap();
        let last = text.trim_end().rsplit('\n').next().unwrap().to_string();
        let b64 = last.rsplit(' ').next().unwrap();
        let mut raw = base64ct::Base64::decode_vec(b64).unwrap();
        raw[20] ^= 1;
        let forged = last.replace(b64, &base64ct::Base64::encode_string(&raw));
        std::fs::write(&path, text.replace(&last, &forged)).unwrap();
        assert!(run(&p).unwrap_err().to_string().contains("does not verify"));
    }
}
