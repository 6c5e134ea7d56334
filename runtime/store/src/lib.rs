//! WORM checkpoints: content-addressed KV blocks, rkyv snapshots, Ed25519-signed receipts in a
//! hash chain, a durable request journal, and the verifier behind `sov verify`.
//!
//! # Directory format (one run directory)
//! ```text
//! blocks.seg              append-only raw KV block bytes, each block once (content addressed)
//! blocks.idx              append-only 56-byte entries: hash, offset, len, checksum
//! snapshot-00000001.snap  rkyv snapshot + commit point (index entries, segment and journal length)
//! receipt-00000001.note   C2SP signed note: height, prev digest, spec, model, snapshot, KV root, time
//! journal.log             append-only checksummed records: sessions, accepted and finished
//!                         requests, checkpoint markers; each record is a leaf of the log
//! heads.log               append-only signed tree heads (C2SP tlog-checkpoint notes) of the RFC
//!                         6962 Merkle tree over the journal, with the leaf hashes each one added
//! cosignatures.log        append-only witness cosignatures of heads, `<tree size> <signature
//!                         line>` (only with witnesses; see [`witness::cosigned`])
//! ```
//! Directories are created 0700 and files 0600 (they hold every prompt and answer).
//! Heights start at 1; receipt N's `prev` is the digest of receipt N-1's body (zeros at 1).
//!
//! # API for an engine
//! ```ignore
//! use sov_store::*;
//! // Open (creates the directory; audits it; discards a torn tail; refuses tampering).
//! let (key, pub_path, created) = keys::load_or_create_in(&config_dir)?; // or keys::load_private(path)
//! let mut store = CheckpointStore::open_with(&dir, key, SPEC_DIGEST, model_digest,
//!                                            Anchor::from_slots(&persisted_slots))?;
//! // On accept, before admitting a request:
//! store.accept(&RequestRecord { request_id, prompt, sampling, accepted_ms, extra: vec![] })?;
//! // On the checkpoint action: hash each full block once when it fills (block_hash), pass bytes only
//! // for blocks the store lacks (store.contains_block), partial tails go inside the snapshot.
//! let info = store.write(&snapshot, &new_block_bytes)?;
//! info.mirror_into(&mut slots);          // slot 7 height, 8..15 receipt digest, 16..31 signature
//! // On resume:
//! match store.latest_valid()? {
//!     Some(r) => { /* restore r.snapshot, copy r.blocks[hash] into KV, re-admit r.pending */ }
//!     None => { /* re-admit store.pending_without_checkpoint()? */ }
//! }
//! ```
//! This crate knows bytes, not engines, models or devices: it imports nothing from the `sov` crate.
//! [`driver`] holds the engine-agnostic part of checkpointing (per-block hash cache, KV block reads
//! and writes through the [`driver::KvBlockIo`] and [`driver::EngineSnapshot`] traits an engine
//! implements); the adapter that binds it to sov's engine lives on the engine side
//! (`sov::engine::checkpointing`).
//!
//! Anyone holding the public key checks a directory with [`audit::audit`] (what `sov verify` runs),
//! and a client checks a response's [`ResponseReceipt`] offline with [`attest::verify`].
//!
//! # Design
//! Full KV blocks never change, so they are hashed (BLAKE3) and stored once; a checkpoint costs
//! only blocks filled since the previous one plus the snapshot (tokens, RNG state, partial tails).
//! Snapshots are rkyv archives validated with bytecheck on every load; receipts are canonical text
//! so the signed bytes are unambiguous and readable by transparency-log tooling. Durability: data,
//! fsync, receipt (temp + fsync + rename + directory fsync); the receipt is the commit point.
//! [`KvMode::Recompute`] stores tokens only and rebuilds KV by prefill on restore.

#![warn(missing_docs)]

pub mod attest;
pub mod audit;
pub mod blockstore;
pub mod digest;
pub mod driver;
pub mod error;
mod frame;
mod fsutil;
pub mod head;
// rkyv's `Archive` derive emits `JournalRecordResolver` with undocumented fields for the named
// variants (`Checkpoint`, `Session`), and a lint level on the enum does not reach that sibling
// item, so the module allows it; everything written by hand in `journal` is documented.
#[allow(missing_docs)]
pub mod journal;
pub mod keys;
pub mod merkle;
pub mod note;
pub mod policy;
pub mod receipt;
pub mod snapshot;
pub mod store;
pub mod tlog;
pub mod witness;

#[cfg(any(test, feature = "test-fixtures"))]
#[doc(hidden)]
pub mod fixture;
#[cfg(test)]
mod tests;

pub use attest::ResponseReceipt;
pub use audit::{Anchor, Audit, AuditOptions, audit};
pub use digest::{Digest, block_hash, kv_root};
pub use error::{CheckpointError, Result};
pub use journal::{FinishedRecord, Journal, JournalRecord, RequestRecord};
pub use policy::Policy;
pub use snapshot::{
    FinishState, KvLayout, KvMode, LogitBias, SamplingParams, SequenceSnapshot, Snapshot,
    StoreCommit,
};
pub use store::{CheckpointStore, HeadSink, Platform, ReceiptInfo, Restored, newest_platform};
