//! The witness's decisions over real signed sov heads: cosign a consistent head, refuse a fork and
//! a rollback with 409, a bad proof with 422, unknown logs and keys, and keep its view across a
//! restart and under concurrent requests.

use std::sync::Arc;

use ed25519_dalek::SigningKey;

use super::*;
use crate::head::{self, TreeHead, origin_for};
use crate::merkle::{Tree, leaf_hash};
use crate::witness::logs::LogKey;
use crate::witness::protocol::AddCheckpoint;

fn log_key() -> SigningKey {
    SigningKey::from_bytes(&[0x41; 32])
}

fn witness(dir: &Path) -> Witness {
    let logs = Logs(vec![LogKey {
        origin: "sov.run/*".into(),
        key: log_key().verifying_key(),
    }]);
    Witness::open(
        dir,
        "w.example/1",
        SigningKey::from_bytes(&[0x51; 32]),
        logs,
    )
    .unwrap()
}

fn tree(n: u32, salt: u8) -> Tree {
    Tree::from_leaves((0..n).map(|i| {
        let mut b = i.to_le_bytes().to_vec();
        if i > 0 {
            b.push(salt);
        }
        leaf_hash(&b)
    }))
}

/// The signed head note of the first `size` leaves of `t`.
fn note_of(t: &Tree, size: u64, key: &SigningKey) -> String {
    let h = TreeHead {
        origin: origin_for(&t.leaves()[0]),
        size,
        root: t.root(size).unwrap(),
        spec: [1; 32],
        model: [2; 32],
        checkpoint: None,
        backend: Some("cpu".into()),
        precision: Some("f32".into()),
        sampler: Some("draw-1".into()),
    };
    head::sign(&h, key).unwrap()
}

fn request(t: &Tree, old: u64, size: u64) -> Vec<u8> {
    AddCheckpoint {
        old,
        proof: t.consistency_proof(old, size).unwrap(),
        checkpoint: note_of(t, size, &log_key()),
    }
    .to_body()
    .into_bytes()
}

fn status(r: Result<String, AddError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(e) => e.status(),
    }
}

#[test]
fn cosigns_a_consistent_head_and_the_cosignature_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let w = witness(dir.path());
    let t = tree(9, 0);
    let line = w.add_checkpoint(&request(&t, 0, 5), 1_700_000_000).unwrap();
    let text = note_of(&t, 5, &log_key()) + &line;
    let n = note::parse(&text).unwrap();
    assert_eq!(
        n.verify_cosignature(&w.verifier()).unwrap(),
        Some(1_700_000_000)
    );
    // Extends with a proof from 5 to 9.
    let line = w.add_checkpoint(&request(&t, 5, 9), 1_700_000_001).unwrap();
    let n = note::parse(&(note_of(&t, 9, &log_key()) + &line)).unwrap();
    assert!(n.verify_cosignature(&w.verifier()).unwrap().is_some());
    assert_eq!(w.view(&origin_for(&t.leaves()[0])).unwrap().size, 9);
    // The same head again: cosigned again (equal sizes, equal roots).
    assert_eq!(status(w.add_checkpoint(&request(&t, 9, 9), 2)), 200);
    let mode = std::fs::metadata(dir.path().join(view_file(&origin_for(&t.leaves()[0]))))
        .unwrap()
        .permissions();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.mode() & 0o777, 0o600);
}

#[test]
fn refuses_forks_and_rollbacks_with_409_and_bad_proofs_with_422() {
    let dir = tempfile::tempdir().unwrap();
    let w = witness(dir.path());
    let t = tree(9, 0);
    let fork = tree(9, 7); // same first leaf (same origin), different history after it
    w.add_checkpoint(&request(&t, 0, 6), 1).unwrap();
    // Rollback: the log claims it was at 4 (the witness is at 6).
    match w.add_checkpoint(&request(&t, 4, 5), 2) {
        Err(AddError::Conflict { size }) => assert_eq!(size, 6),
        other => panic!("rollback not refused with 409: {other:?}"),
    }
    // A client that does not know the witness's size learns it with old 0.
    match w.add_checkpoint(&request(&t, 0, 9), 2) {
        Err(AddError::Conflict { size }) => assert_eq!(size, 6),
        other => panic!("{other:?}"),
    }
    // Fork of the same size: different root.
    assert_eq!(status(w.add_checkpoint(&request(&fork, 6, 6), 3)), 409);
    // Fork that grows: its own proof does not lead from the witness's root.
    assert_eq!(status(w.add_checkpoint(&request(&fork, 6, 9), 3)), 422);
    // old beyond the checkpoint: malformed.
    let beyond = AddCheckpoint {
        old: 6,
        proof: vec![],
        checkpoint: note_of(&t, 5, &log_key()),
    };
    assert_eq!(
        status(w.add_checkpoint(beyond.to_body().as_bytes(), 3)),
        400
    );
    // None of these moved the view.
    assert_eq!(w.view(&origin_for(&t.leaves()[0])).unwrap().size, 6);
    assert_eq!(status(w.add_checkpoint(&request(&t, 6, 9), 4)), 200);
}

#[test]
fn unknown_logs_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs(vec![LogKey {
        origin: "example.com/only".into(),
        key: log_key().verifying_key(),
    }]);
    let w = Witness::open(dir.path(), "w", SigningKey::from_bytes(&[3; 32]), logs).unwrap();
    let t = tree(3, 0);
    assert_eq!(status(w.add_checkpoint(&request(&t, 0, 3), 1)), 404);
    let w2 = {
        drop(w);
        witness(dir.path())
    };
    let other = SigningKey::from_bytes(&[0x42; 32]);
    let body = AddCheckpoint {
        old: 0,
        proof: vec![],
        checkpoint: note_of(&t, 3, &other),
    }
    .to_body();
    assert_eq!(status(w2.add_checkpoint(body.as_bytes(), 1)), 403);
    assert_eq!(status(w2.add_checkpoint(b"old 0\n\ngarbage", 1)), 400);
    // A non-empty proof with old 0 is malformed.
    let mut r = AddCheckpoint::parse(&request(&t, 0, 3)).unwrap();
    r.proof.push([0; 32]);
    assert_eq!(status(w2.add_checkpoint(r.to_body().as_bytes(), 1)), 400);
}

#[test]
fn survives_restart_with_its_view_intact() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(9, 0);
    let origin = origin_for(&t.leaves()[0]);
    {
        let w = witness(dir.path());
        w.add_checkpoint(&request(&t, 0, 7), 1).unwrap();
        // A second process cannot open the same state while this one holds it.
        assert!(
            Witness::open(
                dir.path(),
                "w2",
                SigningKey::from_bytes(&[9; 32]),
                Logs::default()
            )
            .is_err()
        );
    }
    // A leftover temp file of an interrupted write is discarded, the view kept.
    std::fs::write(dir.path().join(view_file(&origin) + ".tmp"), b"partial").unwrap();
    let w = witness(dir.path());
    assert_eq!(
        w.view(&origin),
        Some(View {
            size: 7,
            root: t.root(7).unwrap()
        })
    );
    assert_eq!(status(w.add_checkpoint(&request(&t, 0, 9), 1)), 409);
    assert_eq!(status(w.add_checkpoint(&request(&t, 7, 9), 1)), 200);
    // A view file edited by hand is refused at open, not trusted.
    drop(w);
    let path = dir.path().join(view_file(&origin));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&origin, "sov.run/ffffffffffffffff")).unwrap();
    assert!(
        Witness::open(
            dir.path(),
            "w",
            SigningKey::from_bytes(&[9; 32]),
            Logs::default()
        )
        .is_err()
    );
}

#[test]
fn concurrent_requests_from_one_view_advance_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let w = Arc::new(witness(dir.path()));
    let t = tree(40, 0);
    w.add_checkpoint(&request(&t, 0, 2), 1).unwrap();
    let handles: Vec<_> = (3..=20u64)
        .map(|size| {
            let (w, body) = (w.clone(), request(&t, 2, size));
            std::thread::spawn(move || status(w.add_checkpoint(&body, 5)))
        })
        .collect();
    let codes: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(codes.iter().filter(|&&c| c == 200).count(), 1, "{codes:?}");
    assert!(codes.iter().all(|&c| c == 200 || c == 409), "{codes:?}");
}
