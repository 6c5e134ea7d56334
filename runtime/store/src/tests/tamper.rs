//! Tampering: every flipped byte, truncation, removed/reordered/foreign/forked receipt and rollback
//! is caught by the audit (`sov verify`) and refused when opening the store to resume.

use std::path::Path;

use crate::audit::{receipt_name, snapshot_name};
use crate::fixture::{self, MODEL, SPEC, build, files, key, other_key, restore};
use crate::receipt::{self, ReceiptBody};
use crate::{Anchor, AuditOptions, CheckpointError, CheckpointStore, audit};

fn check(dir: &Path) -> crate::Result<crate::Audit> {
    audit(
        dir,
        AuditOptions {
            key: &key().verifying_key(),
            policy: None,
            anchor: None,
        },
    )
}

/// Caught by the audit and refused by the store.
fn assert_refused(dir: &Path, case: &str) -> CheckpointError {
    let err = match check(dir) {
        Ok(a) => panic!("{case}: audit accepted (torn: {:?})", a.torn),
        Err(e) => e,
    };
    assert!(
        CheckpointStore::open(dir, key(), SPEC, MODEL).is_err(),
        "{case}: store opened"
    );
    err
}

#[test]
fn clean_directory_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let infos = build(dir.path());
    let a = check(dir.path()).unwrap();
    assert_eq!(a.chain.len(), 3);
    assert!(a.torn.is_clean());
    assert_eq!(a.head().unwrap().receipt.digest, infos[2].digest);
    assert_eq!(a.entries.len(), 3, "blocks 0..3 each stored once");
}

#[test]
fn every_flipped_byte_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    let total: usize = original.iter().map(|(_, b)| b.len()).sum();
    assert!(total < 64 * 1024, "fixture grew to {total} bytes");
    let mut cases = 0;
    for (name, bytes) in &original {
        let path = dir.path().join(name);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            std::fs::write(&path, &b).unwrap();
            assert_refused(dir.path(), &format!("{name} byte {i}"));
            cases += 1;
        }
        std::fs::write(&path, bytes).unwrap();
    }
    assert_eq!(cases, total);
    check(dir.path()).unwrap();
}

#[test]
fn every_truncation_is_caught_and_resume_never_uses_damaged_data() {
    let dir = tempfile::tempdir().unwrap();
    let infos = build(dir.path());
    let original = files(dir.path());
    for (name, bytes) in &original {
        for cut in 0..bytes.len() {
            restore(dir.path(), &original);
            std::fs::write(dir.path().join(name), &bytes[..cut]).unwrap();
            match check(dir.path()) {
                // Cutting committed data is an error.
                Err(_) => assert!(CheckpointStore::open(dir.path(), key(), SPEC, MODEL).is_err()),
                // Only the journal's uncommitted tail (the last marker, the request after it) may be
                // cut like a crash would; the audit reports it as torn, never as clean, and resume
                // still restores the newest checkpoint intact.
                Ok(a) => {
                    assert_eq!(name, "journal.log", "{name} cut at {cut} accepted");
                    let boundary = cut as u64 == a.journal.valid_len;
                    assert!(
                        !a.torn.is_clean() || boundary,
                        "journal cut at {cut} reported clean"
                    );
                    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
                    let r = store.latest_valid().unwrap().unwrap();
                    assert_eq!(r.receipt.digest, infos[2].digest);
                }
            }
        }
    }
}

#[test]
fn removed_receipts_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    for h in 1..=3 {
        restore(dir.path(), &original);
        std::fs::remove_file(dir.path().join(receipt_name(h))).unwrap();
        let e = assert_refused(dir.path(), &format!("receipt {h} removed"));
        assert!(
            e.to_string().contains(&format!("height {h}")) || h == 3,
            "{e}"
        );
    }
    // Removing the newest receipt and its snapshot: the journal's checkpoint marker still names it.
    restore(dir.path(), &original);
    std::fs::remove_file(dir.path().join(receipt_name(3))).unwrap();
    std::fs::remove_file(dir.path().join(snapshot_name(3))).unwrap();
    let e = assert_refused(dir.path(), "newest checkpoint removed");
    assert!(e.to_string().contains("rolled back"), "{e}");
}

#[test]
fn reordered_receipts_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    for (a, b) in [(1, 2), (2, 3), (1, 3)] {
        restore(dir.path(), &original);
        let (pa, pb) = (
            dir.path().join(receipt_name(a)),
            dir.path().join(receipt_name(b)),
        );
        let (ta, tb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
        std::fs::write(&pa, tb).unwrap();
        std::fs::write(&pb, ta).unwrap();
        let e = assert_refused(dir.path(), &format!("swap {a} {b}"));
        assert!(e.to_string().contains("reordered"), "{e}");
    }
}

/// Re-sign receipt `h`'s body (optionally altered) with `key`.
fn resign(
    dir: &Path,
    h: u64,
    key: &ed25519_dalek::SigningKey,
    alter: impl FnOnce(&mut ReceiptBody),
) -> String {
    let text = std::fs::read_to_string(dir.join(receipt_name(h))).unwrap();
    let (mut body, _) = receipt::parse_unverified(&text).unwrap();
    alter(&mut body);
    receipt::sign(&body, key).unwrap()
}

#[test]
fn receipt_signed_by_another_key_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    for h in 1..=3 {
        restore(dir.path(), &original);
        let forged = resign(dir.path(), h, &other_key(), |_| {});
        std::fs::write(dir.path().join(receipt_name(h)), forged).unwrap();
        let e = assert_refused(dir.path(), &format!("foreign key at {h}"));
        assert!(e.to_string().contains("another key"), "{e}");
    }
    // A whole chain by another key does not verify under ours.
    let other = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(other.path(), other_key(), SPEC, MODEL).unwrap();
    fixture::checkpoint(&mut store, 1);
    assert!(check(other.path()).is_err());
}

#[test]
fn forks_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = files(dir.path());
    // A second, validly signed receipt for height 2 beside the real one.
    let fork = resign(dir.path(), 2, &key(), |b| b.time_ms += 1);
    std::fs::write(dir.path().join("receipt-00000002-b.note"), &fork).unwrap();
    let e = assert_refused(dir.path(), "fork beside");
    assert!(e.to_string().contains("fork"), "{e}");
    // The fork replacing the real receipt 2: receipt 3 no longer links to it.
    restore(dir.path(), &original);
    std::fs::write(dir.path().join(receipt_name(2)), &fork).unwrap();
    let e = assert_refused(dir.path(), "fork in place");
    assert!(e.to_string().contains("chain link"), "{e}");
    // A fork of the newest receipt: no later link, but the journal recorded the real one.
    restore(dir.path(), &original);
    let fork3 = resign(dir.path(), 3, &key(), |b| b.time_ms += 1);
    std::fs::write(dir.path().join(receipt_name(3)), &fork3).unwrap();
    let e = assert_refused(dir.path(), "fork at head");
    assert!(e.to_string().contains("fork"), "{e}");
}

#[test]
fn rollback_is_caught_by_journal_or_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let infos = build(dir.path());
    let anchor = Anchor {
        height: infos[2].height,
        digest: infos[2].digest,
    };
    let mut slots = [0u32; 32];
    infos[2].mirror_into(&mut slots);
    assert_eq!(Anchor::from_slots(&slots), Some(anchor));

    // An older copy of the whole directory (taken after checkpoint 2) passes alone, but not against
    // the anchor the slots (or a witness) hold.
    let old = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(old.path(), key(), SPEC, MODEL).unwrap();
    store.accept(&fixture::request(7)).unwrap();
    store.accept(&fixture::request(8)).unwrap();
    fixture::checkpoint(&mut store, 1);
    fixture::checkpoint(&mut store, 2);
    drop(store);
    check(old.path()).unwrap();
    let opts = AuditOptions {
        key: &key().verifying_key(),
        policy: None,
        anchor: Some(anchor),
    };
    let e = audit(old.path(), opts).unwrap_err();
    assert!(e.to_string().contains("rollback"), "{e}");
    assert!(CheckpointStore::open_with(old.path(), key(), SPEC, MODEL, Some(anchor)).is_err());
    // A different head at the anchored height is a fork.
    let forked = Anchor {
        height: 2,
        digest: [9; 32],
    };
    assert!(CheckpointStore::open_with(dir.path(), key(), SPEC, MODEL, Some(forked)).is_err());
    CheckpointStore::open_with(dir.path(), key(), SPEC, MODEL, Some(anchor)).unwrap();
    // With witnesses slot 7 holds a log size: `locate` finds the receipt by its digest, and a
    // digest the (rolled-back) directory lacks stays an anchor the audit refuses.
    let by_size = Anchor {
        height: 57,
        digest: infos[1].digest,
    };
    assert_eq!(
        by_size.locate(dir.path()),
        Anchor {
            height: infos[1].height,
            digest: infos[1].digest
        }
    );
    assert_eq!(anchor.locate(dir.path()), anchor);
    let lost = Anchor {
        height: 57,
        ..anchor
    };
    assert_eq!(lost.locate(old.path()), lost);
    assert!(CheckpointStore::open_with(old.path(), key(), SPEC, MODEL, Some(lost)).is_err());
}
