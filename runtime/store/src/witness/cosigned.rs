//! `cosignatures.log`: the witnesses' cosignatures of a run's tree heads, kept next to
//! `heads.log` in the checkpoint directory (append-only, 0600, one fsync per append).
//!
//! Format: one line per cosignature, `<tree size> <note signature line>`, e.g.
//! `42 — sov.witness/1 <base64>`. Heads' sizes strictly grow, so a size names one head of the
//! run; a verifier appends the lines of a size to that head's note and checks them under its
//! policy (a line that does not verify is an error, not a missing vote).

use std::collections::BTreeMap;
use std::path::Path;

use super::checkpoint::parse_decimal;
use crate::error::{CheckpointError, Result};
use crate::fsutil;
use crate::policy::Policy;
use crate::tlog::LogAudit;

/// File name in the checkpoint directory.
pub const COSIGNATURES_FILE: &str = "cosignatures.log";

/// Append cosignature `lines` (newline-terminated note signature lines) of the head of `size`.
pub fn append(dir: &Path, size: u64, lines: &[String]) -> Result<()> {
    let mut text = String::new();
    for l in lines {
        if !l.ends_with('\n') || l[..l.len() - 1].contains('\n') {
            return Err(CheckpointError::Usage(
                "a cosignature line must be one newline-terminated line".into(),
            ));
        }
        text.push_str(&format!("{size} {l}"));
    }
    let path = dir.join(COSIGNATURES_FILE);
    let mut f = fsutil::open_append(&path)?;
    fsutil::append_sync(&mut f, &path, text.as_bytes())
}

/// Parse the file's text: signature lines by head size. Never panics.
pub fn parse(text: &str) -> Result<BTreeMap<u64, Vec<String>>> {
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    if text.is_empty() {
        return Ok(out);
    }
    let bad = |n: usize, what: &str| {
        CheckpointError::corrupt(COSIGNATURES_FILE, None, format!("line {}: {what}", n + 1))
    };
    let body = text
        .strip_suffix('\n')
        .ok_or_else(|| bad(text.lines().count().saturating_sub(1), "no final newline"))?;
    for (n, line) in body.split('\n').enumerate() {
        let (size, sig) = line
            .split_once(' ')
            .ok_or_else(|| bad(n, "expected `<size> <signature line>`"))?;
        let size = parse_decimal(size).ok_or_else(|| bad(n, "size is not a decimal"))?;
        let sig = format!("{sig}\n");
        crate::note::parse(&format!("x\n\n{sig}")).map_err(|e| bad(n, &e.to_string()))?;
        out.entry(size).or_default().push(sig);
    }
    Ok(out)
}

/// Read the file in `dir` (absent: none).
pub fn read(dir: &Path) -> Result<BTreeMap<u64, Vec<String>>> {
    let path = dir.join(COSIGNATURES_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(CheckpointError::io(&path, e)),
    }
}

/// How many of `policy`'s witnesses validly cosigned head note `note` (its own signature lines
/// and `extra` lines both count); an error when fewer than its quorum, naming how many were found.
pub fn require_quorum(note: &str, extra: &[String], policy: &Policy, what: &str) -> Result<usize> {
    let text = super::cosignatures::attach(note, extra.iter().map(String::as_str));
    let n = policy.count_cosignatures(&crate::note::parse(&text)?)?;
    if n < policy.quorum {
        return Err(CheckpointError::Usage(format!(
            "{what} has {n} valid cosignature{} by the policy's witnesses, {} required",
            if n == 1 { "" } else { "s" },
            policy.quorum
        )));
    }
    Ok(n)
}

/// Check a verified log's newest head against `policy` with the cosignatures kept in `dir`
/// (every line of the file must name the size of one of the log's heads); returns the count.
pub fn check_log(dir: &Path, log: &LogAudit, policy: &Policy) -> Result<usize> {
    let kept = read(dir)?;
    for size in kept.keys() {
        if !log.heads.iter().any(|h| h.size == *size) {
            return Err(CheckpointError::corrupt(
                COSIGNATURES_FILE,
                None,
                format!("cosignatures of a head of size {size}, which this log never signed"),
            ));
        }
    }
    let (Some(head), Some(note)) = (log.newest(), log.newest_note.as_deref()) else {
        return Err(CheckpointError::Usage(
            "the log has no signed head to be cosigned".into(),
        ));
    };
    let lines = kept.get(&head.size).cloned().unwrap_or_default();
    require_quorum(
        note,
        &lines,
        policy,
        &format!("the newest head (log size {})", head.size),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn append_read_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let sk = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
        let l1 = crate::note::cosign_line("a\n", "w1", &sk, 1).unwrap();
        let l2 = crate::note::cosign_line("b\n", "w1", &sk, 2).unwrap();
        append(dir.path(), 3, std::slice::from_ref(&l1)).unwrap();
        append(dir.path(), 9, std::slice::from_ref(&l2)).unwrap();
        let got = read(dir.path()).unwrap();
        assert_eq!(got[&3], vec![l1.clone()]);
        assert_eq!(got[&9], vec![l2]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(COSIGNATURES_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(append(dir.path(), 1, &["two\nlines\n".into()]).is_err());
        for bad in [
            "3 x\n".to_string(),
            "03 ".to_string() + &l1,
            "3".into(),
            format!("3 {}", l1.trim_end()),
        ] {
            assert!(parse(&bad).is_err(), "accepted {bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(text in "([0-9]{0,3} ?(\u{2014} [a-z]{0,3} [A-Za-z0-9+/=]{0,100})?\n?){0,4}") {
            let _ = parse(&text);
        }
    }
}
