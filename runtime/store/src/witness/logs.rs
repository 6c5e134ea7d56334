//! Which logs a witness accepts. C2SP witnesses are configured with each log's origin and public
//! key; every sov run is its own log (origin `sov.run/<16 hex>`, named by its first record), so an
//! entry's origin may end in `*` to accept every origin with that prefix signed by that key
//! (`sov.run/*`). Each concrete origin still gets its own view.
//!
//! Command-line form (`sov witness --log`): `ORIGIN=VKEY_FILE`, the file holding the log's
//! verifier key (`<name>+<hex id>+<base64>`, e.g. a `checkpoint.pub`) or an SPKI PEM key.

use ed25519_dalek::VerifyingKey;

use crate::error::{CheckpointError, Result};

/// One accepted log (or family of logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogKey {
    /// The origin, or a prefix of origins when it ends in `*`.
    pub origin: String,
    /// The key the log's checkpoints must be signed with.
    pub key: VerifyingKey,
}

impl LogKey {
    /// Whether `origin` is this entry's.
    pub fn matches(&self, origin: &str) -> bool {
        match self.origin.strip_suffix('*') {
            Some(prefix) => origin.starts_with(prefix),
            None => origin == self.origin,
        }
    }

    /// Parse `ORIGIN=VKEY_FILE`, reading the key file.
    pub fn from_arg(arg: &str) -> Result<Self> {
        let (origin, path) = arg.split_once('=').ok_or_else(|| {
            CheckpointError::Usage(format!("--log {arg:?}: expected ORIGIN=VKEY_FILE"))
        })?;
        if origin.is_empty() || origin.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(CheckpointError::Usage(format!(
                "--log {arg:?}: the origin must be non-empty, without spaces"
            )));
        }
        let key = crate::keys::load_public(std::path::Path::new(path))?;
        Ok(Self {
            origin: origin.to_string(),
            key,
        })
    }
}

/// The configured logs, first match wins.
#[derive(Debug, Clone, Default)]
pub struct Logs(pub Vec<LogKey>);

impl Logs {
    /// The entry accepting `origin`, if any.
    pub fn find(&self, origin: &str) -> Option<&LogKey> {
        self.0.iter().find(|l| l.matches(origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    #[test]
    fn exact_and_prefix_origins() {
        let key = SigningKey::from_bytes(&[1; 32]).verifying_key();
        let logs = Logs(vec![
            LogKey {
                origin: "example.com/log".into(),
                key,
            },
            LogKey {
                origin: "sov.run/*".into(),
                key,
            },
        ]);
        assert!(logs.find("example.com/log").is_some());
        assert!(logs.find("example.com/log2").is_none());
        assert!(logs.find("sov.run/0123456789abcdef").is_some());
        assert!(logs.find("sov.ru").is_none());
    }

    #[test]
    fn from_arg_reads_a_vkey_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::keys::generate(dir.path()).unwrap();
        let arg = format!("sov.run/*={}", files.public.display());
        let l = LogKey::from_arg(&arg).unwrap();
        assert_eq!(l.key, crate::keys::load_public(&files.public).unwrap());
        assert!(LogKey::from_arg("no-equals").is_err());
        assert!(LogKey::from_arg(&format!("a b={}", files.public.display())).is_err());
        assert!(LogKey::from_arg("x=/nonexistent").is_err());
    }
}
