//! Forgeries the verifiable log must catch: journal records rewritten and re-sealed (their checksums
//! recomputed, so the framing passes), removed, duplicated or moved, signed heads removed, and the
//! whole tail after a signed head dropped (a rollback only a head known from outside can show).

use std::path::Path;

use crate::audit::audit_known;
use crate::fixture::{MODEL, SPEC, build, files, key, restore};
use crate::journal::{self, JOURNAL_FILE, JournalRecord};
use crate::tlog::{self, HEADS_FILE};
use crate::{AuditOptions, CheckpointStore};

fn check(dir: &Path, head: Option<&str>) -> crate::Result<crate::Audit> {
    audit_known(
        dir,
        AuditOptions {
            key: &key().verifying_key(),
            policy: None,
            anchor: None,
        },
        head,
    )
}

/// Caught by the audit and refused by the store's open (the `--resume` path); returns the message.
fn refused(dir: &Path, case: &str) -> String {
    let err = match check(dir, None) {
        Ok(_) => panic!("{case}: audit accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        CheckpointStore::open(dir, key(), SPEC, MODEL).is_err(),
        "{case}: store opened"
    );
    err
}

fn records(dir: &Path) -> Vec<JournalRecord> {
    journal::scan(dir)
        .unwrap()
        .records
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// Rewrite the journal as `records`, every record re-sealed with valid checksums.
fn reseal(dir: &Path, records: &[JournalRecord]) {
    let mut bytes = Vec::new();
    for r in records {
        bytes.extend(journal::encode_record(r).unwrap());
    }
    std::fs::write(dir.join(JOURNAL_FILE), bytes).unwrap();
}

fn index_of(records: &[JournalRecord], f: impl Fn(&JournalRecord) -> bool) -> usize {
    records.iter().position(f).unwrap()
}

fn finished_of(id: u64) -> impl Fn(&JournalRecord) -> bool {
    move |r| matches!(r, JournalRecord::Finished(f) if f.request_id == id)
}

fn accepted_of(id: u64) -> impl Fn(&JournalRecord) -> bool {
    move |r| matches!(r, JournalRecord::Accepted(a) if a.request_id == id)
}

#[test]
fn resealed_rewrites_of_records_are_caught_and_named() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    let base = records(dir.path());
    type Edit = Box<dyn Fn(&mut JournalRecord)>;
    let cases: Vec<(&str, usize, Edit)> = vec![
        (
            "finished text",
            index_of(&base, finished_of(7)),
            Box::new(|r| {
                if let JournalRecord::Finished(f) = r {
                    f.text.replace_range(0..1, "S");
                }
            }),
        ),
        (
            "finished tokens",
            index_of(&base, finished_of(8)),
            Box::new(|r| {
                if let JournalRecord::Finished(f) = r {
                    f.output[1] += 1;
                }
            }),
        ),
        (
            "accepted prompt",
            index_of(&base, accepted_of(7)),
            Box::new(|r| {
                if let JournalRecord::Accepted(a) = r {
                    a.prompt[0] = 99;
                }
            }),
        ),
        (
            "accepted sampling",
            index_of(&base, accepted_of(8)),
            Box::new(|r| {
                if let JournalRecord::Accepted(a) = r {
                    a.sampling.temperature = 1.5;
                }
            }),
        ),
    ];
    for (case, i, edit) in cases {
        restore(dir.path(), &original);
        let mut recs = base.clone();
        edit(&mut recs[i]);
        assert_ne!(recs[i], base[i], "{case}: edit did nothing");
        reseal(dir.path(), &recs);
        journal::scan(dir.path()).unwrap_or_else(|e| panic!("{case}: reseal failed: {e}"));
        let e = refused(dir.path(), case);
        assert!(
            e.contains(&format!("record {i} (")) && e.contains("rewritten"),
            "{case}: {e}"
        );
    }
}

#[test]
fn removed_duplicated_and_moved_records_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    let base = records(dir.path());
    let f7 = index_of(&base, finished_of(7));
    let a8 = index_of(&base, accepted_of(8));
    let a9 = index_of(&base, accepted_of(9));
    let mut cases: Vec<(&str, Vec<JournalRecord>, &str)> = Vec::new();
    let mut removed = base.clone();
    removed.remove(a8);
    cases.push(("removed", removed, "removed"));
    let mut duplicated = base.clone();
    duplicated.insert(f7 + 1, base[f7].clone());
    cases.push(("duplicated", duplicated, "inserted"));
    let mut moved = base.clone();
    let r = moved.remove(f7);
    moved.insert(f7 + 2, r);
    cases.push(("moved", moved, "moved"));
    // A duplicate in the unsigned tail is caught by the request rules.
    let mut tail_dup = base.clone();
    tail_dup.push(base[a9].clone());
    cases.push(("duplicated in the tail", tail_dup, "duplicated"));
    let mut tail_finish = base.clone();
    tail_finish.push(base[f7].clone());
    cases.push(("finished again in the tail", tail_finish, "duplicated"));
    for (case, recs, word) in cases {
        restore(dir.path(), &original);
        reseal(dir.path(), &recs);
        let e = refused(dir.path(), case);
        assert!(e.contains(word), "{case}: {e}");
    }
}

/// The journal and heads.log cut back to what they were at head `k` (1-based).
fn roll_back_to_head(dir: &Path, k: usize) {
    let heads = tlog::scan(dir).unwrap();
    let size = tlog::audit_log(&journal::scan(dir).unwrap(), &heads, &key().verifying_key())
        .unwrap()
        .heads[k - 1]
        .size as usize;
    let j = journal::scan(dir).unwrap();
    let jlen = j.records.get(size).map_or(j.valid_len, |(at, _)| *at);
    let hlen = heads.records.get(k).map_or(heads.valid_len, |(at, _)| *at);
    for (file, len) in [(JOURNAL_FILE, jlen), (HEADS_FILE, hlen)] {
        let b = std::fs::read(dir.join(file)).unwrap();
        std::fs::write(dir.join(file), &b[..len as usize]).unwrap();
    }
}

#[test]
fn removed_heads_are_caught_and_a_dropped_tail_needs_a_known_head() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    let a = check(dir.path(), None).unwrap();
    let n = a.log.heads.len();
    assert_eq!(n, 5, "two finishes and three checkpoints");
    assert_eq!(a.log.unsigned(), 1, "request 9 after the newest head");
    let newest = a.log.newest_note.clone().unwrap();
    // The newest head known from outside verifies; so does every earlier one.
    check(dir.path(), Some(&newest)).unwrap();
    // Signed heads removed while the journal keeps their records.
    for keep in 0..n {
        restore(dir.path(), &original);
        let heads = tlog::scan(dir.path()).unwrap();
        let cut = heads.records.get(keep).map_or(0, |(at, _)| *at) as usize;
        let b = std::fs::read(dir.path().join(HEADS_FILE)).unwrap();
        std::fs::write(dir.path().join(HEADS_FILE), &b[..cut]).unwrap();
        let e = refused(dir.path(), &format!("heads after {keep} removed"));
        assert!(e.contains("head"), "{keep}: {e}");
    }
    // The whole tail after head 2 dropped (journal and heads alike): internally consistent, so
    // only a head known from outside shows the rollback.
    restore(dir.path(), &original);
    // Receipts of checkpoints after head 2 would betray it too: drop them as a careful forger would.
    roll_back_to_head(dir.path(), 2);
    for h in 2..=3 {
        for f in [
            crate::audit::receipt_name(h),
            crate::audit::snapshot_name(h),
        ] {
            std::fs::remove_file(dir.path().join(f)).unwrap();
        }
    }
    let rolled = check(dir.path(), None).unwrap_or_else(|e| panic!("rolled-back dir: {e}"));
    assert_eq!(rolled.log.heads.len(), 2);
    let e = check(dir.path(), Some(&newest)).unwrap_err().to_string();
    assert!(e.contains("rollback"), "{e}");
    // A head of another run is refused, not mistaken for a rollback.
    let other = tempfile::tempdir().unwrap();
    let (_, done) = crate::fixture::build_texts(other.path(), ["other", "run"]);
    restore(dir.path(), &original);
    let e = check(dir.path(), Some(&done[0].1.head))
        .unwrap_err()
        .to_string();
    assert!(e.contains("another log") || e.contains("fork"), "{e}");
}
