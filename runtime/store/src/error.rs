//! Errors of the checkpoint subsystem: every problem names the file, the chain height when one is
//! known, and what is wrong, so `sov verify` can print the first problem as-is.

use std::path::PathBuf;

/// Where a problem was found: a file in the checkpoint directory and, when known, a chain height.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// File the problem is in (relative to the checkpoint directory when possible).
    pub file: PathBuf,
    /// Receipt-chain height the file belongs to, when it belongs to one.
    pub height: Option<u64>,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.height {
            Some(h) => write!(f, "{} (height {h})", self.file.display()),
            None => write!(f, "{}", self.file.display()),
        }
    }
}

/// Everything that can go wrong reading, writing or verifying a checkpoint directory.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An operating-system I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Stored data is damaged, missing, reordered or inconsistent (tampering or corruption).
    #[error("{at}: {what}")]
    Corrupt {
        /// The file (and chain height, when known) the problem was found in.
        at: Location,
        /// What is wrong, in words.
        what: String,
    },
    /// A byte string that should decode (snapshot, receipt, record, key) does not.
    #[error("decode error: {0}")]
    Decode(String),
    /// A key file is missing, malformed or has unsafe permissions.
    #[error("key {path}: {what}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A per-response receipt does not verify (edited response, other run, other key).
    #[error("receipt does not verify: {0}")]
    Receipt(String),
    /// The caller asked for something the store cannot do (e.g. a snapshot naming an absent block).
    #[error("{0}")]
    Usage(String),
}

impl CheckpointError {
    /// Wrap an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// A corruption/tampering problem in `file` (at `height`, when known).
    pub fn corrupt(file: impl Into<PathBuf>, height: Option<u64>, what: impl Into<String>) -> Self {
        Self::Corrupt {
            at: Location {
                file: file.into(),
                height,
            },
            what: what.into(),
        }
    }
}

/// Result alias of the checkpoint subsystem.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
