//! Signing keys.
//!
//! Private keys are PKCS#8 PEM files created with mode 0600 (never overwritten); loading refuses a
//! key file group or others can read, like ssh does. The public key is written next to it twice: as
//! a C2SP verifier key line (`*.pub`, readable by note/transparency-log tools) and as SPKI PEM
//! (`*.pub.pem`). Key material is never logged: errors name paths, not contents.
//!
//! The default key lives in a directory the caller names (sov's config directory, which the
//! application resolves from its flags and the environment: this crate reads no environment).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};

use super::error::{CheckpointError, Result};
use super::note::{TYPE_ED25519, VerifierKey};
use super::receipt::SIGNER_NAME;

/// File name of the private key inside a key directory.
pub const PRIVATE_KEY_FILE: &str = "checkpoint.key";
/// File name of the verifier-key line.
pub const PUBLIC_KEY_FILE: &str = "checkpoint.pub";
/// File name of the SPKI PEM public key.
pub const PUBLIC_PEM_FILE: &str = "checkpoint.pub.pem";

fn key_err(path: &Path, what: impl Into<String>) -> CheckpointError {
    CheckpointError::Key {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// The verifier key (C2SP form) of a signing key.
pub fn verifier_key(key: &VerifyingKey) -> VerifierKey {
    VerifierKey {
        name: SIGNER_NAME.to_string(),
        kind: TYPE_ED25519,
        key: *key,
    }
}

/// Paths written by [`generate`].
#[derive(Debug, Clone)]
pub struct KeyFiles {
    /// PKCS#8 PEM private key (mode 0600).
    pub private: PathBuf,
    /// The public key as a note verifier key line (`<name>+<hex key id>+<base64>`).
    pub public: PathBuf,
    /// The public key as SPKI PEM.
    pub public_pem: PathBuf,
}

impl KeyFiles {
    /// The files of a key directory.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            private: dir.join(PRIVATE_KEY_FILE),
            public: dir.join(PUBLIC_KEY_FILE),
            public_pem: dir.join(PUBLIC_PEM_FILE),
        }
    }
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| CheckpointError::io(path, e))?;
    // The umask may have narrowed the mode; make it exact.
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| CheckpointError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| CheckpointError::io(path, e))
}

/// Generate a key into `dir` (created 0700 if absent). Refuses to overwrite an existing key.
pub fn generate(dir: &Path) -> Result<KeyFiles> {
    let files = KeyFiles::in_dir(dir);
    if files.private.exists() {
        return Err(key_err(
            &files.private,
            "already exists; refusing to overwrite a key",
        ));
    }
    fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let key = SigningKey::generate(&mut rand_core::OsRng);
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| key_err(&files.private, format!("PKCS#8 encoding failed: {e}")))?;
    write_new(&files.private, pem.as_bytes(), 0o600)?;
    let vk = key.verifying_key();
    let public = format!("{}\n", verifier_key(&vk).to_text());
    let pub_pem = vk
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| key_err(&files.public_pem, format!("SPKI encoding failed: {e}")))?;
    for (path, bytes) in [
        (&files.public, public.as_bytes()),
        (&files.public_pem, pub_pem.as_bytes()),
    ] {
        if path.exists() {
            fs::remove_file(path).map_err(|e| CheckpointError::io(path, e))?;
        }
        write_new(path, bytes, 0o644)?;
    }
    super::fsutil::sync_dir(dir)?;
    Ok(files)
}

/// Load a private key, refusing a file readable or writable by group or others.
pub fn load_private(path: &Path) -> Result<SigningKey> {
    let meta = fs::metadata(path).map_err(|e| CheckpointError::io(path, e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(key_err(
            path,
            format!(
                "permissions {mode:o} are too open; run: chmod 600 {}",
                path.display()
            ),
        ));
    }
    let text = fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    SigningKey::from_pkcs8_pem(&text)
        .map_err(|_| key_err(path, "not a PKCS#8 PEM Ed25519 private key"))
}

/// Load a public key from a C2SP verifier-key line or an SPKI PEM file.
pub fn load_public(path: &Path) -> Result<VerifyingKey> {
    let text = fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    if text.contains("-----BEGIN") {
        return VerifyingKey::from_public_key_pem(&text)
            .map_err(|_| key_err(path, "not an SPKI PEM Ed25519 public key"));
    }
    VerifierKey::parse(text.trim())
        .map(|vk| vk.key)
        .map_err(|e| key_err(path, e.to_string()))
}

/// The default key in directory `dir` (sov's config directory), created on first use. Returns the
/// key, the public-key path and whether it was just created (the caller prints where the public key
/// is).
pub fn load_or_create_in(dir: &Path) -> Result<(SigningKey, PathBuf, bool)> {
    let files = KeyFiles::in_dir(dir);
    let created = if files.private.exists() {
        false
    } else {
        fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
        generate(dir)?;
        true
    };
    Ok((load_private(&files.private)?, files.public, created))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_writes_0600_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path()).unwrap();
        let mode = fs::metadata(&files.private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sk = load_private(&files.private).unwrap();
        assert_eq!(load_public(&files.public).unwrap(), sk.verifying_key());
        assert_eq!(load_public(&files.public_pem).unwrap(), sk.verifying_key());
        assert!(
            fs::read_to_string(&files.private)
                .unwrap()
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(generate(dir.path()).is_err(), "overwrote an existing key");
    }

    #[test]
    fn group_or_other_readable_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path()).unwrap();
        for mode in [0o640, 0o604, 0o660, 0o644] {
            fs::set_permissions(&files.private, fs::Permissions::from_mode(mode)).unwrap();
            let err = load_private(&files.private).unwrap_err().to_string();
            assert!(err.contains("too open"), "{mode:o}: {err}");
            assert!(!err.contains("PRIVATE KEY"), "key material in error");
        }
        fs::set_permissions(&files.private, fs::Permissions::from_mode(0o400)).unwrap();
        load_private(&files.private).unwrap();
    }

    #[test]
    fn garbage_key_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        write_new(
            &p,
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            0o600,
        )
        .unwrap();
        assert!(load_private(&p).is_err());
        assert!(load_public(&p).is_err());
        let q = dir.path().join("q");
        write_new(&q, b"name+00000000+AAAA", 0o600).unwrap();
        assert!(load_public(&q).is_err());
    }
}
