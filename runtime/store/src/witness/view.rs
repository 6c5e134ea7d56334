//! A witness's durable view of each log and the `add-checkpoint` decision
//! (<https://c2sp.org/tlog-witness>).
//!
//! State directory (created 0700): `witness.lock` (an exclusive advisory lock: one witness process
//! per directory) and one file per log, `view-<32 hex of SHA-256(origin)>`, 0600, holding the
//! newest cosigned checkpoint's three lines (origin, size, base64 root). A view is replaced by
//! write-temp, fsync, rename, directory fsync, before the cosignature is returned; the check of
//! `old` against the view and that write happen under one mutex, so two concurrent requests cannot
//! both advance from the same view (the race the spec describes).
//!
//! Decision, in the spec's order: the checkpoint parses (400), its origin is configured (404), a
//! signature verifies under the log's key (403), `old` is not beyond its size (400), `old` is the
//! view's size (409 with the view's size), equal sizes have equal roots (409), the proof is empty
//! when `old` is 0 (400) and verifies from the view's root otherwise (422); then the view is
//! persisted and a timestamped cosignature/v1 line returned.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64ct::{Base64, Encoding};
use ed25519_dalek::SigningKey;
use sha2::{Digest as _, Sha256};

use super::checkpoint::Checkpoint;
use super::error::AddError;
use super::logs::Logs;
use super::protocol::AddCheckpoint;
use crate::digest::to_hex;
use crate::error::{CheckpointError, Result};
use crate::merkle::{Hash, verify_consistency};
use crate::note::{self, VerifierKey};
use crate::{fsutil, witness::witness_verifier};

/// Lock file of a state directory.
pub const LOCK_FILE: &str = "witness.lock";

/// A witness's view of one log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Size of the newest checkpoint cosigned.
    pub size: u64,
    /// Its root.
    pub root: Hash,
}

/// A witness: its key, the logs it accepts, its persisted views.
pub struct Witness {
    name: String,
    key: SigningKey,
    logs: Logs,
    dir: PathBuf,
    views: Mutex<HashMap<String, View>>,
    _lock: File,
}

/// File name of the view of `origin`.
pub fn view_file(origin: &str) -> String {
    format!(
        "view-{}",
        &to_hex(&Sha256::digest(origin.as_bytes()).into())[..32]
    )
}

impl Witness {
    /// Open (creating) the state directory `dir`, lock it and load every view.
    pub fn open(dir: &Path, name: &str, key: SigningKey, logs: Logs) -> Result<Self> {
        note::check_name(name)?;
        fsutil::create_private_dir(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| CheckpointError::io(&lock_path, e))?;
        lock.try_lock().map_err(|_| {
            CheckpointError::Usage(format!(
                "{} is held by another witness process",
                dir.display()
            ))
        })?;
        let mut views = HashMap::new();
        for entry in std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))? {
            let path = entry.map_err(|e| CheckpointError::io(dir, e))?.path();
            let Some(fname) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if fname.ends_with(fsutil::TMP_SUFFIX) {
                // An interrupted replace: the old view file is intact.
                std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
                continue;
            }
            if !fname.starts_with("view-") {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
            let c =
                Checkpoint::parse(&text).map_err(|e| CheckpointError::corrupt(&path, None, e))?;
            if view_file(&c.origin) != fname {
                return Err(CheckpointError::corrupt(
                    &path,
                    None,
                    "file name does not match the origin it holds",
                ));
            }
            views.insert(
                c.origin,
                View {
                    size: c.size,
                    root: c.root,
                },
            );
        }
        Ok(Self {
            name: name.to_string(),
            key,
            logs,
            dir: dir.to_path_buf(),
            views: Mutex::new(views),
            _lock: lock,
        })
    }

    /// The witness's verifier key (type 0x04), as clients and policies list it.
    pub fn verifier(&self) -> VerifierKey {
        // The name was checked at open.
        witness_verifier(&self.name, &self.key.verifying_key()).unwrap_or(VerifierKey {
            name: self.name.clone(),
            kind: note::TYPE_COSIGNATURE,
            key: self.key.verifying_key(),
        })
    }

    /// The view of `origin`, if the witness cosigned any checkpoint of it.
    pub fn view(&self, origin: &str) -> Option<View> {
        self.views.lock().ok()?.get(origin).cloned()
    }

    /// Handle one `add-checkpoint` body at `timestamp` (seconds since the epoch): the cosignature
    /// line(s) to return, or why not (see the module doc).
    pub fn add_checkpoint(&self, body: &[u8], timestamp: u64) -> Result<String, AddError> {
        let req = AddCheckpoint::parse(body)?;
        let note = note::parse(&req.checkpoint)
            .map_err(|e| AddError::Malformed(format!("checkpoint: {e}")))?;
        let c = Checkpoint::parse(&note.body).map_err(AddError::Malformed)?;
        let log = self
            .logs
            .find(&c.origin)
            .ok_or_else(|| AddError::UnknownLog(c.origin.clone()))?;
        note.verify_signer(&log.key)
            .map_err(|_| AddError::Forbidden(c.origin.clone()))?;
        if req.old > c.size {
            return Err(AddError::Malformed(format!(
                "old size {} is beyond the checkpoint's size {}",
                req.old, c.size
            )));
        }
        let mut views = self
            .views
            .lock()
            .map_err(|_| AddError::State("view lock poisoned".into()))?;
        let view = views.get(&c.origin);
        let have = view.map_or(0, |v| v.size);
        if req.old != have {
            return Err(AddError::Conflict { size: have });
        }
        match view {
            Some(v) if v.size == c.size => {
                if v.root != c.root {
                    return Err(AddError::Conflict { size: have });
                }
                if !req.proof.is_empty() {
                    return Err(AddError::BadProof("non-empty proof for equal sizes".into()));
                }
            }
            Some(v) => verify_consistency(v.size, c.size, &v.root, &c.root, &req.proof)
                .map_err(|e| AddError::BadProof(e.to_string()))?,
            None if !req.proof.is_empty() => {
                return Err(AddError::Malformed(
                    "the consistency proof must be empty when old is 0".into(),
                ));
            }
            None => {}
        }
        let text = format!(
            "{}\n{}\n{}\n",
            c.origin,
            c.size,
            Base64::encode_string(&c.root)
        );
        fsutil::replace_file(&self.dir, &view_file(&c.origin), text.as_bytes())
            .map_err(|e| AddError::State(e.to_string()))?;
        views.insert(
            c.origin.clone(),
            View {
                size: c.size,
                root: c.root,
            },
        );
        drop(views);
        note::cosign_line(&note.body, &self.name, &self.key, timestamp)
            .map_err(|e| AddError::State(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
