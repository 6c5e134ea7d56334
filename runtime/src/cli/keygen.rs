//! `sov keygen [--out DIR]`: create the Ed25519 key that signs checkpoint receipts — a PKCS#8 PEM
//! private key (mode 0600) and its public key as a C2SP verifier-key line and as SPKI PEM. Without
//! `--out` the key goes to sov's config directory, where the engine finds it. The private key is
//! never printed.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::app::SovDirs;
use crate::checkpoint::keys;

/// Arguments of `sov keygen`.
#[derive(clap::Args, Debug, Clone)]
pub struct KeygenArgs {
    /// Directory to write checkpoint.key, checkpoint.pub and checkpoint.pub.pem into
    /// (default: sov's config directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Run `sov keygen`.
pub fn run(args: KeygenArgs, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    let dir = match args.out {
        Some(d) => d,
        None => dirs.config.clone(),
    };
    let files = keys::generate(&dir)?;
    let public = keys::load_public(&files.public)?;
    println!(
        "private key: {} (mode 0600, keep it secret)",
        files.private.display()
    );
    println!("public key:  {}", files.public.display());
    println!("             {}", files.public_pem.display());
    println!("verifier key: {}", keys::verifier_key(&public).to_text());
    println!(
        "verify checkpoints with: sov verify RUN_DIR/checkpoints --key {}",
        files.public.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Directories `--out` makes irrelevant.
    fn unused_dirs() -> SovDirs {
        SovDirs {
            cache: "/nonexistent/cache".into(),
            state: "/nonexistent/state".into(),
            config: "/nonexistent/config".into(),
        }
    }

    #[test]
    fn writes_a_private_key_0600_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("keys");
        assert_eq!(
            run(
                KeygenArgs {
                    out: Some(out.clone())
                },
                &unused_dirs()
            )
            .unwrap(),
            ExitCode::SUCCESS
        );
        let mode = std::fs::metadata(out.join(keys::PRIVATE_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        keys::load_private(&out.join(keys::PRIVATE_KEY_FILE)).unwrap();
        assert!(run(KeygenArgs { out: Some(out) }, &unused_dirs()).is_err());
    }
}
