//! Per-response receipts verify offline (no run directory, JSON round trip), and an edited
//! response, a receipt from another run, parts of receipts mixed across runs, or another key fail.
//! Also: run directories are private (0700, files 0600) and an exposed one is warned about.

use std::os::unix::fs::PermissionsExt;

use crate::attest::{self, ResponseReceipt};
use crate::fixture::{MODEL, SPEC, build_texts, build_with_receipts, key, other_key};
use crate::{AuditOptions, CheckpointStore, audit};

fn round_trip(r: &ResponseReceipt) -> ResponseReceipt {
    serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap()
}

#[test]
fn receipts_verify_offline_and_catch_edits_other_runs_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (_, done) = build_with_receipts(dir.path());
    let vk = key().verifying_key();
    for (f, r) in &done {
        let r = round_trip(r);
        let v = attest::verify(&r, &vk, &f.output, &f.text).unwrap();
        assert_eq!(v.request_id, f.request_id);
        assert_eq!((v.head.spec, v.head.model), (SPEC, MODEL));
        // One character of the text, one token: refused.
        let mut text = f.text.clone();
        text.replace_range(0..1, "X");
        assert!(attest::verify(&r, &vk, &f.output, &text).is_err());
        let mut tokens = f.output.clone();
        tokens[0] ^= 1;
        assert!(attest::verify(&r, &vk, &tokens, &f.text).is_err());
        // Another key.
        let e = attest::verify(&r, &other_key().verifying_key(), &f.output, &f.text);
        assert!(e.is_err());
        // Any edited field of the receipt.
        let mut edited = r.clone();
        edited.leaf_index += 1;
        assert!(attest::verify(&edited, &vk, &f.output, &f.text).is_err());
        let mut edited = r.clone();
        edited.head = edited.head.replacen('\n', "0\n", 2);
        assert!(attest::verify(&edited, &vk, &f.output, &f.text).is_err());
        if let Some(p) = r.proof.first() {
            let mut edited = r.clone();
            edited.proof[0] = p.replacen(&p[..1], if &p[..1] == "A" { "B" } else { "A" }, 1);
            assert!(attest::verify(&edited, &vk, &f.output, &f.text).is_err());
        }
    }
    // Another run (same key) answered differently: its receipts do not cover these responses, and
    // neither does a mix of its head with this run's leaf and proof.
    let other = tempfile::tempdir().unwrap();
    let (_, theirs) = build_texts(other.path(), ["seven!", "eight"]);
    let (f, mine) = &done[0];
    assert!(attest::verify(&theirs[0].1, &vk, &f.output, &f.text).is_err());
    let mut mixed = mine.clone();
    mixed.head = theirs[0].1.head.clone();
    assert!(attest::verify(&mixed, &vk, &f.output, &f.text).is_err());
    // The store's receipt for a request finished before a restart verifies against the newest head.
    let store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    for (f, _) in &done {
        let r = store.receipt_for(f.request_id).unwrap().unwrap();
        attest::verify(&r, &vk, &f.output, &f.text).unwrap();
        assert_eq!(Some(r.head.as_str()), store.newest_head());
    }
    assert!(store.receipt_for(9).unwrap().is_none(), "9 never finished");
    let all = store.signed_receipts().unwrap();
    assert_eq!(all.len(), 2);
    for (f, _) in &done {
        attest::verify(&all[&f.request_id], &vk, &f.output, &f.text).unwrap();
    }
}

/// The receipt proves the prompt and sampling parameters too: the request leaf it carries is the
/// signed `Accepted` record; any edit to it (a prompt token, the seed, the temperature), or the
/// request leaf of another request, fails.
#[test]
fn receipts_cover_the_prompt_and_sampling_parameters() {
    use crate::journal::{self, JournalRecord};
    use base64ct::{Base64, Encoding};
    let dir = tempfile::tempdir().unwrap();
    let (_, done) = build_with_receipts(dir.path());
    let vk = key().verifying_key();
    let (f, r) = &done[0];
    let v = attest::verify(r, &vk, &f.output, &f.text).unwrap();
    assert_eq!(v.request.request_id, f.request_id);
    assert_eq!(v.request, crate::fixture::request(f.request_id));
    let edit = |change: &dyn Fn(&mut crate::RequestRecord)| {
        let raw = Base64::decode_vec(&r.request).unwrap();
        let JournalRecord::Accepted(mut a) = journal::decode_body(&raw).unwrap() else {
            panic!("not an Accepted record");
        };
        change(&mut a);
        let mut e = r.clone();
        e.request =
            Base64::encode_string(&journal::encode_body(&JournalRecord::Accepted(a)).unwrap());
        attest::verify(&e, &vk, &f.output, &f.text)
    };
    assert!(edit(&|a| a.prompt[0] ^= 1).is_err(), "edited prompt token");
    assert!(
        edit(&|a| a.prompt.push(7)).is_err(),
        "appended prompt token"
    );
    assert!(edit(&|a| a.sampling.seed ^= 1).is_err(), "edited seed");
    assert!(
        edit(&|a| a.sampling.temperature += 0.5).is_err(),
        "edited temperature"
    );
    assert!(
        edit(&|_| {}).is_ok(),
        "unchanged record re-encodes to the signed bytes"
    );
    // The request leaf and proof of the other response: another request's.
    let mut swapped = r.clone();
    swapped.request = done[1].1.request.clone();
    swapped.request_index = done[1].1.request_index;
    swapped.request_proof = done[1].1.request_proof.clone();
    let e = attest::verify(&swapped, &vk, &f.output, &f.text).unwrap_err();
    assert!(e.to_string().contains("request leaf is request"), "{e}");
}

#[test]
fn run_directories_are_private_and_exposure_is_warned() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("runs").join("r1");
    build_with_receipts(&dir);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&root.path().join("runs")), 0o700);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(names.len() >= 9, "{names:?}");
    for p in &names {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    let opts = |k| AuditOptions {
        key: k,
        policy: None,
        anchor: None,
    };
    let vk = key().verifying_key();
    assert!(audit(&dir, opts(&vk)).unwrap().warnings.is_empty());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(&names[0], std::fs::Permissions::from_mode(0o644)).unwrap();
    let w = audit(&dir, opts(&vk)).unwrap().warnings;
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("chmod 700"), "{w:?}");
    let store = CheckpointStore::open(&dir, key(), SPEC, MODEL).unwrap();
    assert_eq!(store.warnings().len(), 2);
}

/// A `HeadSink` is told of the newest head when set (with every leaf it covers) and of each head
/// signed later (with the leaves it added): its own tree reproduces every signed root.
#[test]
fn head_sink_sees_every_head_with_its_leaves() {
    use std::sync::{Arc, Mutex};

    use crate::merkle::{Hash, Tree};
    use crate::{HeadSink, head, note};

    type Seen = Arc<Mutex<(Tree, Vec<(String, u64)>)>>;
    struct Rec(Seen);
    impl HeadSink for Rec {
        fn signed(&mut self, note: &str, size: u64, new_leaves: &[Hash]) {
            let mut g = self.0.lock().unwrap();
            for l in new_leaves {
                g.0.push(*l);
            }
            g.1.push((note.to_string(), size));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    build_with_receipts(dir.path());
    let seen: Seen = Arc::default();
    let mut store = CheckpointStore::open(dir.path(), key(), SPEC, MODEL).unwrap();
    store.set_head_sink(Box::new(Rec(seen.clone())));
    store.accept(&crate::fixture::request(20)).unwrap();
    store.finish(&[crate::fixture::finished(20, "x")]).unwrap();
    let g = seen.lock().unwrap();
    assert_eq!(g.1.len(), 2);
    for (text, size) in &g.1 {
        let h = head::TreeHead::parse(&note::parse(text).unwrap().body).unwrap();
        assert_eq!(h.size, *size);
        assert_eq!(g.0.root(*size).unwrap(), h.root);
    }
    assert_eq!(g.0.size(), store.signed_size());
}

/// A run reopened on another backend or precision than its heads name says so (the CLI prints
/// it at resume); reopened on the same one, or opened fresh, it says nothing. `newest_platform`
/// reads back what the heads name (none before the first head).
#[test]
fn a_resume_on_another_platform_is_named() {
    use crate::Platform;
    let on = |precision: &str| Platform {
        backend: Some("cuda".into()),
        precision: Some(precision.into()),
        sampler: Some("draw-1".into()),
    };
    let dir = tempfile::tempdir().unwrap();
    let open = |p: Platform| CheckpointStore::open_on(dir.path(), key(), SPEC, MODEL, None, p);
    let mut store = open(on("bf16-deterministic")).unwrap();
    let no_heads = crate::tlog::scan(dir.path()).unwrap();
    assert_eq!(
        crate::newest_platform(&no_heads).unwrap(),
        Platform::default()
    );
    assert_eq!(
        store.platform_change(),
        None,
        "a fresh run has nothing to compare"
    );
    store.accept(&crate::fixture::request(1)).unwrap();
    store.finish(&[crate::fixture::finished(1, "x")]).unwrap();
    drop(store);
    let same = open(on("bf16-deterministic")).unwrap();
    assert_eq!(same.platform_change(), None);
    drop(same);
    // The heads' newest platform, read back as resume and audit read it.
    let heads = crate::tlog::scan(dir.path()).unwrap();
    assert_eq!(
        crate::newest_platform(&heads).unwrap(),
        on("bf16-deterministic")
    );
    let other = open(on("bf16-deterministic-split256")).unwrap();
    let said = other.platform_change().expect("the change is named");
    assert!(
        said.contains("cuda/bf16-deterministic,")
            && said.contains("cuda/bf16-deterministic-split256"),
        "{said}"
    );
    drop(other);
    // Another draw rule for sampled tokens is named too.
    let redrawn = open(Platform {
        sampler: Some("draw-2".into()),
        ..on("bf16-deterministic")
    })
    .unwrap();
    let said = redrawn.platform_change().expect("the new rule is named");
    assert!(
        said.contains("drawn by draw-1") && said.contains("by draw-2"),
        "{said}"
    );
}
