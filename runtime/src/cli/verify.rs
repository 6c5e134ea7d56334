//! `sov verify DIR --key PUBKEY [--policy FILE] [--head HEIGHT:DIGEST | --head NOTE]`: audit a
//! checkpoint directory (every receipt, signature, chain link, snapshot digest, stored block,
//! journal record and the verifiable log over them: signed heads, consistency proofs, every signed
//! leaf; see `checkpoint::audit`) and print a summary. `--head` with a file holding a signed head
//! note (or a response JSON line with a receipt) catches a rollback of the whole directory.
//!
//! `sov verify --response FILE --key PUBKEY`: check, offline and without the run directory, a file
//! of JSON objects (one per line, as `sov generate --json` prints them): each one's `tokens` and
//! `text` are the leaf of its `receipt`, the leaf is in the signed tree (RFC 6962 inclusion proof),
//! the head's signature verifies (`checkpoint::attest`).
//!
//! `--policy FILE` (a witness policy: `witness <vkey>` lines, `quorum K`) requires K valid
//! cosignatures by listed witnesses on the newest signed head (for a directory: from its
//! `cosignatures.log`, written by `--witness`) or on the head each response's receipt cites (its
//! note carries the cosignatures); a shortfall fails naming how many were found.
//!
//! Exit status: 0 the directory (or every response) verifies; 1 a problem, named by file, height
//! or line and what is wrong; 3 the chain verifies but an interrupted checkpoint left uncommitted
//! bytes (sov discards them on resume; the newest receipt is the state resume will use).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::app::run_dir::checkpoint_dir;
use crate::checkpoint::attest::{self, ResponseReceipt};
use crate::checkpoint::audit::audit_known;
use crate::checkpoint::digest::{from_hex, to_hex};
use crate::checkpoint::journal::JournalRecord;
use crate::checkpoint::witness::cosigned;
use crate::checkpoint::{Anchor, Audit, AuditOptions, Policy, keys};

/// Arguments of `sov verify`.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Checkpoint directory to verify (or a run directory holding one in `checkpoints/`).
    #[arg(required_unless_present = "response", conflicts_with = "response")]
    pub dir: Option<PathBuf>,
    /// Check the receipts of a file of responses (JSON lines with `tokens`, `text`, `receipt`)
    /// offline instead of a directory.
    #[arg(long)]
    pub response: Option<PathBuf>,
    /// Public key of the engine: a C2SP verifier-key line (checkpoint.pub) or an SPKI PEM file.
    #[arg(long)]
    pub key: PathBuf,
    /// Witness policy file (`witness <vkey>` lines and `quorum <k>`): the newest signed head (or
    /// each response's head) must carry K valid cosignatures by listed witnesses.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Expected head: `HEIGHT:DIGEST` of the receipt chain (e.g. from slots 7..15 or a witness),
    /// or a file holding a signed tree head note (or a response JSON line with a `receipt`) that
    /// the log must contain; either detects a rollback.
    #[arg(long)]
    pub head: Option<String>,
}

/// What `--head` named.
#[derive(Debug)]
enum KnownHead {
    Chain(Anchor),
    Note(String),
}

fn parse_anchor(text: &str) -> anyhow::Result<Anchor> {
    let (h, d) = text
        .split_once(':')
        .context("--head must be HEIGHT:DIGEST or a file with a signed head")?;
    let height = h.parse::<u64>().context("--head height is not a number")?;
    let digest = from_hex(d).context("--head digest must be 64 lowercase hex digits")?;
    Ok(Anchor { height, digest })
}

fn parse_head(text: &str) -> anyhow::Result<KnownHead> {
    if let Ok(a) = parse_anchor(text) {
        return Ok(KnownHead::Chain(a));
    }
    let path = std::path::Path::new(text);
    if !path.is_file() {
        return parse_anchor(text).map(KnownHead::Chain);
    }
    let body = std::fs::read_to_string(path).with_context(|| format!("reading {text}"))?;
    if body.trim_start().starts_with('{') {
        let line = body.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{text}: not JSON"))?;
        let note = v
            .get("receipt")
            .unwrap_or(&v)
            .get("head")
            .and_then(|h| h.as_str())
            .with_context(|| format!("{text}: no receipt head in the first JSON line"))?;
        return Ok(KnownHead::Note(note.to_string()));
    }
    Ok(KnownHead::Note(body))
}

/// Run `sov verify`.
pub fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let key = keys::load_public(&args.key)?;
    let policy = args.policy.as_deref().map(Policy::load).transpose()?;
    if let Some(file) = &args.response {
        return verify_responses(file, &key, policy.as_ref());
    }
    let Some(arg_dir) = args.dir.clone() else {
        anyhow::bail!("give a directory or --response FILE");
    };
    let known = args.head.as_deref().map(parse_head).transpose()?;
    let (anchor, head_note) = match known {
        Some(KnownHead::Chain(a)) => (Some(a), None),
        Some(KnownHead::Note(n)) => (None, Some(n)),
        None => (None, None),
    };
    if !arg_dir.is_dir() {
        eprintln!("FAIL {}: not a directory", arg_dir.display());
        return Ok(ExitCode::from(1));
    }
    let inner = checkpoint_dir(&arg_dir);
    let dir = if inner.is_dir() {
        inner
    } else {
        arg_dir.clone()
    };
    match audit_known(
        &dir,
        AuditOptions {
            key: &key,
            policy: None,
            anchor,
        },
        head_note.as_deref(),
    )
    .and_then(|a| {
        let cosigned = match &policy {
            Some(p) => Some(cosigned::check_log(&dir, &a.log, p)?),
            None => None,
        };
        Ok((a, cosigned))
    }) {
        Err(e) => {
            eprintln!("FAIL {}: {e}", dir.display());
            Ok(ExitCode::from(1))
        }
        Ok((a, cosigned)) => {
            print!("{}", summary(&arg_dir, &a, policy.as_ref().zip(cosigned)));
            if head_note.is_some() {
                println!(
                    "known head: contained in the log (consistency proof to the newest head valid)"
                );
            }
            for w in &a.warnings {
                println!("WARN {w}");
            }
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

/// Check every response line of `file` (see the module doc); prints one line per response.
fn verify_responses(
    file: &std::path::Path,
    key: &ed25519_dalek::VerifyingKey,
    policy: Option<&Policy>,
) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut failed = 0usize;
    let mut checked = 0usize;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        checked += 1;
        match verify_response_line(line, key, policy) {
            Ok((v, cosigs)) => println!(
                "OK line {}: request {} ({}; prompt {} tokens, seed {}, temperature {}, max_tokens {}), leaf {} of {} signed by {} (spec {}, model {}){}",
                n + 1,
                v.request_id,
                v.reason,
                v.request.prompt.len(),
                v.request.sampling.seed,
                v.request.sampling.temperature,
                v.request.sampling.max_tokens,
                v.leaf_index,
                v.head.size,
                v.head.origin,
                &to_hex(&v.head.spec)[..16],
                &to_hex(&v.head.model)[..16],
                cosigs.map_or(String::new(), |n| format!(", cosigned by {n} witnesses"))
            ),
            Err(e) => {
                failed += 1;
                println!("FAIL line {}: {e:#}", n + 1);
            }
        }
    }
    if checked == 0 {
        println!("FAIL {}: no responses", file.display());
        return Ok(ExitCode::from(1));
    }
    Ok(if failed == 0 {
        println!("OK {checked} responses");
        ExitCode::SUCCESS
    } else {
        println!("FAIL {failed} of {checked} responses");
        ExitCode::from(1)
    })
}

fn verify_response_line(
    line: &str,
    key: &ed25519_dalek::VerifyingKey,
    policy: Option<&Policy>,
) -> anyhow::Result<(attest::VerifiedResponse, Option<usize>)> {
    #[derive(serde::Deserialize)]
    struct Line {
        tokens: Vec<u32>,
        text: String,
        receipt: Option<ResponseReceipt>,
        prompt_tokens: Option<usize>,
        prompt_token_ids: Option<Vec<u32>>,
    }
    let l: Line = serde_json::from_str(line).context("not a response JSON object")?;
    let r = l
        .receipt
        .context("no receipt (was the run checkpointed?)")?;
    let v = attest::verify(&r, key, &l.tokens, &l.text)?;
    // The prompt the line claims must be the one the log signed with the output.
    if let Some(n) = l.prompt_tokens {
        anyhow::ensure!(
            n == v.request.prompt.len(),
            "prompt_tokens {n} differs from the signed prompt's {} tokens",
            v.request.prompt.len()
        );
    }
    if let Some(ids) = &l.prompt_token_ids {
        anyhow::ensure!(
            *ids == v.request.prompt,
            "prompt_token_ids differ from the signed prompt"
        );
    }
    let cosigs = match policy {
        Some(p) => Some(cosigned::require_quorum(
            &r.head,
            &[],
            p,
            "the receipt's head",
        )?),
        None => None,
    };
    Ok((v, cosigs))
}

/// The human summary of a verified directory.
fn summary(dir: &std::path::Path, a: &Audit, policy: Option<(&Policy, usize)>) -> String {
    let mut out = format!("checkpoint directory {}\n", dir.display());
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
    match a.log.newest() {
        None => out.push_str(&format!(
            "log: {} records, no signed head yet\n",
            a.log.tree.size()
        )),
        Some(h) => out.push_str(&format!(
            "log: {} records, {} signed heads (every signature, consistency proof and signed leaf valid); newest: {} size {} root {}; {} records after it (unsigned)\n",
            a.log.tree.size(),
            a.log.heads.len(),
            h.origin,
            h.size,
            to_hex(&h.root),
            a.log.unsigned()
        )),
    }
    if let Some((p, n)) = policy {
        out.push_str(&format!(
            "witnesses: the newest head is cosigned by {n} of the policy's {} witnesses ({} required)\n",
            p.witnesses.len(),
            p.quorum
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
            dir: Some(dir.to_path_buf()),
            response: None,
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
    fn responses_verify_offline_and_a_known_head_catches_a_rollback() {
        let keydir = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (_, done) = fixture::build_with_receipts(dir.path());
        let key = pubkey(keydir.path(), &fixture::key());
        let lines: Vec<String> = done
            .iter()
            .map(|(f, r)| {
                serde_json::json!({"request_id": f.request_id, "tokens": f.output, "text": f.text, "receipt": r})
                    .to_string()
            })
            .collect();
        let file = keydir.path().join("responses.jsonl");
        let respond = |body: &str, key: &PathBuf| {
            std::fs::write(&file, body).unwrap();
            run(VerifyArgs {
                dir: None,
                response: Some(file.clone()),
                key: key.clone(),
                policy: None,
                head: None,
            })
            .unwrap()
        };
        assert_eq!(respond(&lines.join("\n"), &key), ExitCode::SUCCESS);
        let edited = lines[1].replacen("\"text\":\"eight\"", "\"text\":\"eighT\"", 1);
        assert_ne!(edited, lines[1]);
        assert_eq!(respond(&edited, &key), ExitCode::from(1));
        let other = pubkey(keydir.path(), &fixture::other_key());
        assert_eq!(respond(&lines[0], &other), ExitCode::from(1));
        assert_eq!(respond("", &key), ExitCode::from(1));
        // The response line doubles as a known head: the directory holds it.
        let mut a = args(dir.path(), key.clone());
        a.head = Some(file.display().to_string());
        std::fs::write(&file, &lines[1]).unwrap();
        assert_eq!(run(a.clone()).unwrap(), ExitCode::SUCCESS);
        // Another directory signed by the same key does not hold that head.
        let old = tempfile::tempdir().unwrap();
        let mut store = crate::checkpoint::CheckpointStore::open(
            old.path(),
            fixture::key(),
            fixture::SPEC,
            fixture::MODEL,
        )
        .unwrap();
        store.accept(&fixture::request(7)).unwrap();
        store.finish(&[fixture::finished(7, "x")]).unwrap();
        drop(store);
        a.dir = Some(old.path().to_path_buf());
        assert_eq!(run(a).unwrap(), ExitCode::from(1));
    }

    /// `--policy`: the newest head needs K cosignatures from `cosignatures.log` (a directory) or
    /// attached to the receipt's head (a response); fewer fail, naming how many were found.
    #[test]
    fn policy_accepts_a_quorum_and_rejects_less() {
        use crate::checkpoint::witness::{cosigned, witness_verifier};
        use crate::checkpoint::{CheckpointStore, note};
        let keydir = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (_, done) = fixture::build_with_receipts(dir.path());
        let key = pubkey(keydir.path(), &fixture::key());
        let sks: Vec<ed25519_dalek::SigningKey> = (1..=3)
            .map(|i| ed25519_dalek::SigningKey::from_bytes(&[0x60 + i; 32]))
            .collect();
        let policy = |k: usize| {
            let p = keydir.path().join(format!("policy{k}"));
            let mut text = String::new();
            for (i, sk) in sks.iter().enumerate() {
                let vk = witness_verifier(&format!("w{i}"), &sk.verifying_key()).unwrap();
                text.push_str(&format!("witness {}\n", vk.to_text()));
            }
            std::fs::write(&p, format!("{text}quorum {k}\n")).unwrap();
            p
        };
        let with = |p: PathBuf| {
            let mut a = args(dir.path(), key.clone());
            a.policy = Some(p);
            run(a).unwrap()
        };
        // No cosignatures yet.
        assert_eq!(with(policy(2)), ExitCode::from(1));
        let store =
            CheckpointStore::open(dir.path(), fixture::key(), fixture::SPEC, fixture::MODEL)
                .unwrap();
        let newest = store.newest_head().unwrap().to_string();
        let receipt8 = store.receipt_for(done[1].0.request_id).unwrap().unwrap();
        drop(store);
        let body = note::parse(&newest).unwrap().body;
        let size: u64 = body.lines().nth(1).unwrap().parse().unwrap();
        let lines: Vec<String> = [0, 2]
            .iter()
            .map(|&i| note::cosign_line(&body, &format!("w{i}"), &sks[i], 1_764_000_000).unwrap())
            .collect();
        cosigned::append(dir.path(), size, &lines).unwrap();
        assert_eq!(with(policy(2)), ExitCode::SUCCESS);
        assert_eq!(with(policy(3)), ExitCode::from(1));
        let err = cosigned::check_log(
            dir.path(),
            &crate::checkpoint::audit(
                dir.path(),
                AuditOptions {
                    key: &fixture::key().verifying_key(),
                    policy: None,
                    anchor: None,
                },
            )
            .unwrap()
            .log,
            &Policy::load(&policy(3)).unwrap(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("has 2 valid cosignatures"),
            "{err}"
        );
        // A response whose receipt's head carries the cosignatures, re-issued the way the witness
        // client does; without them it fails the policy.
        let f = &done[1].0;
        let r = &receipt8;
        let mut cosigned_r = r.clone();
        assert_eq!(r.head, newest, "receipt 8 is against the newest head");
        cosigned_r.head = crate::checkpoint::witness::cosignatures::attach(
            &r.head,
            lines.iter().map(String::as_str),
        );
        let line = |r: &ResponseReceipt, prompt_tokens: usize| {
            serde_json::json!({"tokens": f.output, "text": f.text, "prompt_tokens": prompt_tokens, "receipt": r})
                .to_string()
        };
        let file = keydir.path().join("r.jsonl");
        let check = |body: String, p: Option<PathBuf>| {
            std::fs::write(&file, body).unwrap();
            run(VerifyArgs {
                dir: None,
                response: Some(file.clone()),
                key: key.clone(),
                policy: p,
                head: None,
            })
            .unwrap()
        };
        assert_eq!(
            check(line(&cosigned_r, 4), Some(policy(2))),
            ExitCode::SUCCESS
        );
        assert_eq!(
            check(line(&cosigned_r, 4), Some(policy(3))),
            ExitCode::from(1)
        );
        assert_eq!(check(line(r, 4), Some(policy(2))), ExitCode::from(1));
        assert_eq!(check(line(r, 4), None), ExitCode::SUCCESS);
        // The prompt the line claims must be the signed one (4 tokens in the fixture).
        assert_eq!(check(line(r, 5), None), ExitCode::from(1));
    }

    #[test]
    fn bad_head_argument_is_an_error_not_a_panic() {
        for bad in ["", "3", "x:00", "3:zz"] {
            assert!(parse_head(bad).is_err());
        }
    }
}
