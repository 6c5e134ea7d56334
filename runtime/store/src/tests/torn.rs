//! Torn writes: a crash at any point of a checkpoint (its signed tree head included) leaves a
//! directory that opens, resumes from the previous (or, once the receipt is durable, the new)
//! checkpoint, keeps journaled requests, and accepts the next checkpoint; nothing committed is
//! touched.

use std::collections::BTreeMap;
use std::path::Path;

use crate::audit::{receipt_name, snapshot_name};
use crate::fixture::{self, MODEL, SPEC, files, key, request, restore};
use crate::{AuditOptions, CheckpointStore, audit};

type Files = BTreeMap<String, Vec<u8>>;

/// Directory states before (A: checkpoints 1, 2 and request 9 journaled) and after checkpoint 3 (B).
fn before_after(dir: &Path) -> (Files, Files) {
    let mut store = CheckpointStore::open(dir, key(), SPEC, MODEL).unwrap();
    store.accept(&request(7)).unwrap();
    store.accept(&request(8)).unwrap();
    fixture::checkpoint(&mut store, 1);
    fixture::checkpoint(&mut store, 2);
    store.accept(&request(9)).unwrap();
    let a: Files = files(dir).into_iter().collect();
    fixture::checkpoint(&mut store, 3);
    let b: Files = files(dir).into_iter().collect();
    (a, b)
}

/// Every state a crash during checkpoint 3 can leave, with the height resume must restore.
fn crash_states(a: &Files, b: &Files) -> Vec<(String, Files, u64)> {
    let mut out = Vec::new();
    let grow = |name: &str, len: usize| -> Vec<u8> { b[name][..len].to_vec() };
    // 1. segment partly appended (index untouched).
    for len in a["blocks.seg"].len()..=b["blocks.seg"].len() {
        let mut s = a.clone();
        s.insert("blocks.seg".into(), grow("blocks.seg", len));
        out.push((format!("segment at {len}"), s, 2));
    }
    // 2. segment done, index partly appended.
    for len in a["blocks.idx"].len()..=b["blocks.idx"].len() {
        let mut s = a.clone();
        s.insert("blocks.seg".into(), b["blocks.seg"].clone());
        s.insert("blocks.idx".into(), grow("blocks.idx", len));
        out.push((format!("index at {len}"), s, 2));
    }
    let mut blocks_done = a.clone();
    blocks_done.insert("blocks.seg".into(), b["blocks.seg"].clone());
    blocks_done.insert("blocks.idx".into(), b["blocks.idx"].clone());
    // 3. snapshot temp file partly written.
    let snap = snapshot_name(3);
    for len in [0, 1, b[&snap].len() / 2, b[&snap].len()] {
        let mut s = blocks_done.clone();
        s.insert(format!("{snap}.tmp"), grow(&snap, len));
        out.push((format!("snapshot tmp at {len}"), s, 2));
    }
    // 4. snapshot renamed; receipt temp partly written.
    let rec = receipt_name(3);
    for len in [None, Some(0), Some(b[&rec].len() / 2), Some(b[&rec].len())] {
        let mut s = blocks_done.clone();
        s.insert(snap.clone(), b[&snap].clone());
        if let Some(len) = len {
            s.insert(format!("{rec}.tmp"), grow(&rec, len));
        }
        out.push((format!("receipt tmp at {len:?}"), s, 2));
    }
    // 5. receipt durable; journal marker partly appended (no new head yet).
    for len in a["journal.log"].len()..=b["journal.log"].len() {
        let mut s = b.clone();
        s.insert("journal.log".into(), grow("journal.log", len));
        s.insert("heads.log".into(), a["heads.log"].clone());
        out.push((format!("journal at {len}"), s, 3));
    }
    // 6. marker durable; the signed head over it partly appended.
    for len in a["heads.log"].len()..=b["heads.log"].len() {
        let mut s = b.clone();
        s.insert("heads.log".into(), grow("heads.log", len));
        out.push((format!("heads at {len}"), s, 3));
    }
    out
}

#[test]
fn crash_at_any_point_of_a_checkpoint_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = before_after(dir.path());
    let states = crash_states(&a, &b);
    assert!(states.len() > 100, "only {} crash states", states.len());
    for (case, state, height) in states {
        let listed: Vec<(String, Vec<u8>)> = state.clone().into_iter().collect();
        restore(dir.path(), &listed);
        let mut store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL)
            .unwrap_or_else(|e| panic!("{case}: refused: {e}"));
        let r = store
            .latest_valid()
            .unwrap()
            .unwrap_or_else(|| panic!("{case}: nothing restored"));
        assert_eq!(r.receipt.height, height, "{case}");
        assert_eq!(r.snapshot, fixture::snapshot_at(height as u8), "{case}");
        for seq in &r.snapshot.sequences {
            for h in &seq.blocks {
                assert_eq!(crate::block_hash(&r.blocks[h]), *h, "{case}");
            }
        }
        let pending: Vec<u64> = r.pending.iter().map(|p| p.request_id).collect();
        assert_eq!(
            pending,
            if height == 2 { vec![9] } else { vec![] },
            "{case}"
        );
        // Committed files are untouched by recovery.
        for (name, bytes) in &a {
            let now = std::fs::read(dir.path().join(name)).unwrap();
            assert!(
                now.starts_with(bytes),
                "{case}: {name} lost committed bytes"
            );
        }
        // The engine carries on: the next checkpoint commits and the directory verifies clean.
        let info = fixture::checkpoint(&mut store, 3);
        assert_eq!(info.height, height + 1, "{case}");
        let audit = audit(
            dir.path(),
            AuditOptions {
                key: &key().verifying_key(),
                policy: None,
                anchor: None,
            },
        )
        .unwrap_or_else(|e| panic!("{case}: after recovery: {e}"));
        assert!(audit.torn.is_clean(), "{case}: {:?}", audit.torn);
    }
}

#[test]
fn crash_before_the_first_checkpoint_keeps_journaled_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    store.accept(&request(1)).unwrap();
    store.accept(&request(2)).unwrap();
    drop(store);
    // Torn third record.
    let mut j = std::fs::read(dir.path().join("journal.log")).unwrap();
    j.extend_from_slice(b"SOVJ\x10");
    std::fs::write(dir.path().join("journal.log"), j).unwrap();
    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    assert!(store.latest_valid().unwrap().is_none());
    let ids: Vec<u64> = store
        .pending_without_checkpoint()
        .unwrap()
        .iter()
        .map(|r| r.request_id)
        .collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(store.recovered().len(), 1);
}
