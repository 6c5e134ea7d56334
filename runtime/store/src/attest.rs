//! Per-response receipts: what a client keeps to prove, offline and without the run directory, that
//! the run's key signed a log holding exactly the response it received.
//!
//! A receipt (serde JSON, the `receipt` field `sov generate --json` prints) holds the response's
//! `Finished` journal record (its canonical body bytes, base64 — the log leaf), the leaf's index,
//! the request's `Accepted` record (prompt tokens and sampling parameters) the same way, the
//! signed tree head note covering both (with any witness cosignatures appended), and an RFC 6962
//! inclusion proof for each (base64 hashes, leaf to root). [`verify`] checks: the leaf decodes to
//! a `Finished` record whose tokens and text are the response's, the request leaf to the
//! `Accepted` record of the same request, both re-encode to the same bytes, both proofs lead from
//! their leaf hashes to the head's root, and the head's signature verifies under the given key.
//! So the prompt and sampling parameters are proven with the output: a client (or
//! `sov verify --response`) compares them with what it sent.

use base64ct::{Base64, Encoding};
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use super::error::{CheckpointError, Result};
use super::head::{self, TreeHead};
use super::journal::{self, JournalRecord, RequestRecord};
use super::merkle::{self, Hash, Tree};

/// Receipt format name (the `format` field).
pub const RECEIPT_FORMAT: &str = "sov-response-receipt/v2";

/// A per-response receipt.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResponseReceipt {
    /// Always [`RECEIPT_FORMAT`].
    pub format: String,
    /// Index of the response's record in the log.
    pub leaf_index: u64,
    /// The record's canonical body bytes, base64 (the leaf).
    pub leaf: String,
    /// The signed tree head note (C2SP tlog-checkpoint) whose tree holds the leaf.
    pub head: String,
    /// RFC 6962 inclusion proof, base64 hashes from the leaf up.
    pub proof: Vec<String>,
    /// Index of the request's `Accepted` record (prompt and sampling parameters) in the log.
    pub request_index: u64,
    /// That record's canonical body bytes, base64.
    pub request: String,
    /// Its RFC 6962 inclusion proof in the same head.
    pub request_proof: Vec<String>,
}

/// One leaf of the log: its index and canonical record body bytes.
#[derive(Debug, Clone, Copy)]
pub struct Leaf<'a> {
    /// Index in the log.
    pub index: u64,
    /// The record's body bytes.
    pub body: &'a [u8],
}

/// What a verified receipt says.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedResponse {
    /// The request the response answered.
    pub request_id: u64,
    /// Why it ended (OpenAI terms).
    pub reason: String,
    /// Index of its leaf.
    pub leaf_index: u64,
    /// The signed head (origin, tree size, root, spec and model digests).
    pub head: TreeHead,
    /// The signed request: prompt tokens and sampling parameters.
    pub request: RequestRecord,
}

impl ResponseReceipt {
    /// The receipt for `response` (a `Finished` record) and `request` (its `Accepted` record),
    /// leaves of `tree`, signed by head note `head` of size `size`.
    pub fn build(
        tree: &Tree,
        response: Leaf<'_>,
        request: Leaf<'_>,
        head: &str,
        size: u64,
    ) -> Result<Self> {
        let proof = |l: Leaf<'_>| -> Result<Vec<String>> {
            Ok(tree
                .inclusion_proof(l.index, size)
                .map_err(|e| CheckpointError::Usage(format!("inclusion proof: {e}")))?
                .iter()
                .map(|h| Base64::encode_string(h))
                .collect())
        };
        Ok(Self {
            format: RECEIPT_FORMAT.into(),
            leaf_index: response.index,
            leaf: Base64::encode_string(response.body),
            head: head.to_string(),
            proof: proof(response)?,
            request_index: request.index,
            request: Base64::encode_string(request.body),
            request_proof: proof(request)?,
        })
    }

    /// Bytes of the JSON proof and leaf (for size reports).
    pub fn proof_bytes(&self) -> usize {
        self.proof
            .iter()
            .chain(&self.request_proof)
            .map(String::len)
            .sum()
    }

    /// The receipt's two leaves' body bytes (response, request), decoded.
    pub fn leaves(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        Ok((
            decode_b64(&self.leaf, "leaf")?,
            decode_b64(&self.request, "request leaf")?,
        ))
    }
}

fn bad(what: impl Into<String>) -> CheckpointError {
    CheckpointError::Receipt(what.into())
}

fn decode_b64(s: &str, what: &str) -> Result<Vec<u8>> {
    let raw = Base64::decode_vec(s).map_err(|_| bad(format!("{what} is not base64")))?;
    if Base64::encode_string(&raw) != s {
        return Err(bad(format!("{what} base64 is not canonical")));
    }
    Ok(raw)
}

/// Verify `receipt` for a response of `tokens` and `text` under `key` (see the module doc).
pub fn verify(
    receipt: &ResponseReceipt,
    key: &VerifyingKey,
    tokens: &[u32],
    text: &str,
) -> Result<VerifiedResponse> {
    if receipt.format != RECEIPT_FORMAT {
        return Err(bad(format!("unknown receipt format {:?}", receipt.format)));
    }
    let leaf = decode_b64(&receipt.leaf, "leaf")?;
    let record = journal::decode_body(&leaf).map_err(|e| bad(format!("leaf: {e}")))?;
    if journal::encode_body(&record)? != leaf {
        return Err(bad("leaf is not a canonical record encoding"));
    }
    let JournalRecord::Finished(f) = record else {
        return Err(bad("leaf is not a Finished record"));
    };
    if f.output != tokens {
        return Err(bad(format!(
            "the response's tokens differ from the signed record of request {}",
            f.request_id
        )));
    }
    if f.text != text {
        return Err(bad(format!(
            "the response's text differs from the signed record of request {}",
            f.request_id
        )));
    }
    let req_leaf = decode_b64(&receipt.request, "request leaf")?;
    let req = journal::decode_body(&req_leaf).map_err(|e| bad(format!("request leaf: {e}")))?;
    if journal::encode_body(&req)? != req_leaf {
        return Err(bad("request leaf is not a canonical record encoding"));
    }
    let JournalRecord::Accepted(request) = req else {
        return Err(bad("request leaf is not an Accepted record"));
    };
    if request.request_id != f.request_id {
        return Err(bad(format!(
            "request leaf is request {}, the response answers {}",
            request.request_id, f.request_id
        )));
    }
    let head = head::open(&receipt.head, key).map_err(|e| bad(format!("head: {e}")))?;
    for (what, index, leaf, proof) in [
        ("leaf", receipt.leaf_index, &leaf, &receipt.proof),
        (
            "request leaf",
            receipt.request_index,
            &req_leaf,
            &receipt.request_proof,
        ),
    ] {
        let mut hashes: Vec<Hash> = Vec::with_capacity(proof.len());
        for (i, p) in proof.iter().enumerate() {
            let raw = decode_b64(p, "proof hash")?;
            hashes.push(
                raw.as_slice()
                    .try_into()
                    .map_err(|_| bad(format!("{what} proof hash {i} is not 32 bytes")))?,
            );
        }
        merkle::verify_inclusion(
            index,
            head.size,
            &merkle::leaf_hash(leaf),
            &hashes,
            &head.root,
        )
        .map_err(|e| bad(format!("{what} {index} not in the signed tree: {e}")))?;
    }
    Ok(VerifiedResponse {
        request_id: f.request_id,
        reason: f.reason,
        leaf_index: receipt.leaf_index,
        head,
        request,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn verify_never_panics_on_garbage(
            index in any::<u64>(),
            leaf in proptest::collection::vec(any::<u8>(), 0..200),
            head in ".{0,200}",
            proof in proptest::collection::vec("[A-Za-z0-9+/=]{0,48}", 0..8),
            json in ".{0,300}",
        ) {
            let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]).verifying_key();
            let r = ResponseReceipt {
                format: RECEIPT_FORMAT.into(),
                leaf_index: index,
                leaf: Base64::encode_string(&leaf),
                head,
                proof: proof.clone(),
                request_index: index / 2,
                request: Base64::encode_string(&leaf),
                request_proof: proof,
            };
            let _ = verify(&r, &key, &[1, 2], "x");
            if let Ok(r) = serde_json::from_str::<ResponseReceipt>(&json) {
                let _ = verify(&r, &key, &[], "");
            }
        }
    }
}
