//! `sov verify DIR --key PUBKEY [--policy FILE] [--head HEIGHT:DIGEST]`: audit a checkpoint
//! directory (every receipt, signature, chain link, snapshot digest, stored block and journal
//! record; see `checkpoint::audit`) and print a summary.
//!
//! Exit status: 0 the directory verifies; 1 a problem, named by file, height and what is wrong;
//! 3 the chain verifies but an interrupted checkpoint left uncommitted bytes (sov discards them on
//! resume; the newest receipt is the state resume will use).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::app::run_dir::checkpoint_dir;
use crate::checkpoint::digest::{from_hex, to_hex};
use crate::checkpoint::journal::JournalRecord;
use crate::checkpoint::{Anchor, Audit, AuditOptions, Policy, audit, keys};

/// Arguments of `sov verify`.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Checkpoint directory to verify (or a run directory holding one in `checkpoints/`).
    pub dir: PathBuf,
    /// Public key of the engine: a C2SP verifier-key line (checkpoint.pub) or an SPKI PEM file.
    #[arg(long)]
    pub key: PathBuf,
    /// Witness policy file (`witness <vkey>` lines and `quorum <k>`); every receipt must be quorate.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Expected chain head `HEIGHT:DIGEST` (e.g. from slots 7..15 or a witness) to detect rollback.
    #[arg(long)]
    pub head: Option<String>,
}

fn parse_head(text: &str) -> anyhow::Result<Anchor> {
    let (h, d) = text
        .split_once(':')
        .context("--head must be HEIGHT:DIGEST")?;
    let height = h.parse::<u64>().context("--head height is not a number")?;
    let digest = from_hex(d).context("--head digest must be 64 lowercase hex digits")?;
    Ok(Anchor { height, digest })
}

/// Run `sov verify`.
pub fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let key = keys::load_public(&args.key)?;
    let policy = args.policy.as_deref().map(Policy::load).transpose()?;
    let anchor = args.head.as_deref().map(parse_head).transpose()?;
    if !args.dir.is_dir() {
        eprintln!("FAIL {}: not a directory", args.dir.display());
        return Ok(ExitCode::from(1));
    }
    let inner = checkpoint_dir(&args.dir);
    let dir = if inner.is_dir() {
        inner
    } else {
        args.dir.clone()
    };
    match audit(
        &dir,
        AuditOptions {
            key: &key,
            policy: policy.as_ref(),
            anchor,
            head: None,
        },
    ) {
        Err(e) => {
            eprintln!("FAIL {}: {e}", dir.display());
            Ok(ExitCode::from(1))
        }
        Ok(a) => {
            print!("{}", summary(&args, &a, policy.as_ref()));
            if a.torn.is_clean() {
                println!("OK");
                Ok(ExitCode::SUCCESS)
            } else {
                for line in a.torn.describe() {
                    println!("TORN {line}");
                }
                println!(
                    "OK up to height {} (uncommitted leftovers above)",
                    a.chain.len()
                );
                Ok(ExitCode::from(3))
            }
        }
    }
}

/// The human summary of a verified directory.
fn summary(args: &VerifyArgs, a: &Audit, policy: Option<&Policy>) -> String {
    let mut out = format!("checkpoint directory {}\n", args.dir.display());
    let blocks: u64 = a.entries.iter().map(|e| u64::from(e.len)).sum();
    let snapshots: u64 = a.chain.iter().map(|l| l.snapshot_bytes).sum();
    match a.head() {
        None => out.push_str("chain: empty (no checkpoint yet)\n"),
        Some(head) => {
            let b = &head.receipt.body;
            out.push_str(&format!(
                "chain: {} receipts, heights 1..{}, every Ed25519 signature (verify_strict) and link valid\n",
                a.chain.len(),
                b.height
            ));
            out.push_str(&format!(
                "head: height {} receipt {}\n",
                b.height,
                to_hex(&head.receipt.digest)
            ));
            out.push_str(&format!(
                "      time_ms {} spec {} model {}\n",
                b.time_ms,
                to_hex(&b.spec),
                to_hex(&b.model)
            ));
            out.push_str(&format!(
                "      {} sequences, kv-root {}\n",
                head.sequences,
                to_hex(&b.kv_root)
            ));
        }
    }
    out.push_str(&format!(
        "snapshots: {} ({snapshots} bytes), digests and KV roots match\nblocks: {} stored once ({blocks} bytes), every one re-hashed\n",
        a.chain.len(),
        a.entries.len()
    ));
    let accepted = a
        .journal
        .records
        .iter()
        .filter(|(_, r)| matches!(r, JournalRecord::Accepted(_)))
        .count();
    let after = a.head().map_or(accepted, |h| {
        a.journal.accepted_since(h.commit.journal_len).len()
    });
    let finished = a.journal.finished().count();
    out.push_str(&format!(
        "journal: {} records, {accepted} requests accepted ({after} after the newest checkpoint), {finished} finished, markers agree\n",
        a.journal.records.len()
    ));
    if let Some(p) = policy {
        let min = a.chain.iter().map(|l| l.cosignatures).min().unwrap_or(0);
        out.push_str(&format!(
            "witnesses: every receipt quorate ({} of {} required; fewest present {min})\n",
            p.quorum,
            p.witnesses.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixture;

    fn args(dir: &std::path::Path, key: PathBuf) -> VerifyArgs {
        VerifyArgs {
            dir: dir.to_path_buf(),
            key,
            policy: None,
            head: None,
        }
    }

    fn pubkey(dir: &std::path::Path, sk: &ed25519_dalek::SigningKey) -> PathBuf {
        let p = dir.join(to_hex(sk.verifying_key().as_bytes()));
        std::fs::write(&p, keys::verifier_key(&sk.verifying_key()).to_text()).unwrap();
        p
    }

    #[test]
    fn exit_codes_clean_tampered_torn_and_wrong_key() {
        let keydir = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let infos = fixture::build(dir.path());
        let key = pubkey(keydir.path(), &fixture::key());
        assert_eq!(
            run(args(dir.path(), key.clone())).unwrap(),
            ExitCode::SUCCESS
        );
        let mut a = args(dir.path(), key.clone());
        a.head = Some(format!("{}:{}", infos[2].height, to_hex(&infos[2].digest)));
        assert_eq!(run(a.clone()).unwrap(), ExitCode::SUCCESS);
        a.head = Some(format!("4:{}", to_hex(&infos[2].digest)));
        assert_eq!(run(a).unwrap(), ExitCode::from(1));
        let other = pubkey(keydir.path(), &fixture::other_key());
        assert_eq!(run(args(dir.path(), other)).unwrap(), ExitCode::from(1));
        std::fs::write(dir.path().join("snapshot-00000004.snap.tmp"), b"x").unwrap();
        assert_eq!(
            run(args(dir.path(), key.clone())).unwrap(),
            ExitCode::from(3)
        );
        std::fs::write(dir.path().join("blocks.seg"), b"x").unwrap();
        assert_eq!(run(args(dir.path(), key)).unwrap(), ExitCode::from(1));
    }

    #[test]
    fn bad_head_argument_is_an_error_not_a_panic() {
        for bad in ["", "3", "x:00", "3:zz"] {
            assert!(parse_head(bad).is_err());
        }
    }
}
