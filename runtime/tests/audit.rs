//! `sov audit` end to end on the tiny random model (CPU): a run it generated reproduces token for
//! token; a journal whose delivered outputs came from another seed is flagged; another machine
//! spec is refused.

use std::path::Path;
use std::process::{Command, Output};

use sov_store::journal::{self, Journal, JournalRecord};

fn sov(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sov"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .arg("--config-dir")
        .arg(state.join("config"))
        .output()
        .expect("run sov")
}

fn generate(run: &Path, seed: &str, state: &Path) {
    let out = sov(
        &[
            "generate",
            "--model",
            "random:tiny",
            "--run-dir",
            run.to_str().unwrap(),
            "--prompt",
            "abc",
            "--prompt",
            "hello there",
            "--max-tokens",
            "12",
            "--temperature",
            "0.8",
            "--seed",
            seed,
            "--json",
        ],
        state,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn audit(run: &Path, extra: &[&str], state: &Path) -> (bool, String) {
    let mut args = vec!["audit", run.to_str().unwrap(), "--model", "random:tiny"];
    args.extend_from_slice(extra);
    let out = sov(&args, state);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn audit_reproduces_a_run_and_flags_outputs_another_seed_produced() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let (run7, run8) = (tmp.path().join("seed7"), tmp.path().join("seed8"));
    generate(&run7, "7", &state);
    generate(&run8, "8", &state);
    let (ok, text) = audit(&run7, &[], &state);
    assert!(ok, "{text}");
    assert!(text.contains("2 of 2 reproduced"), "{text}");

    // A run whose journal claims seed 7 but delivered what seed 8 produced.
    let forged = tmp.path().join("forged");
    let cp = forged.join("checkpoints");
    std::fs::create_dir_all(&cp).unwrap();
    let scan7 = journal::scan(&run7.join("checkpoints")).unwrap();
    let scan8 = journal::scan(&run8.join("checkpoints")).unwrap();
    let mut j = Journal::new(&cp, 0);
    for (_, r) in &scan7.records {
        if !matches!(r, JournalRecord::Finished(_)) {
            j.append(r).unwrap();
        }
    }
    for f in scan8.finished() {
        j.append(&JournalRecord::Finished(f.clone())).unwrap();
    }
    let (ok, text) = audit(&forged, &[], &state);
    assert!(!ok, "{text}");
    assert!(text.contains("DIFFERS"), "{text}");
    assert!(text.contains("0 of 2 reproduced"), "{text}");

    // Another machine spec than the run's is refused before anything runs.
    let (ok, text) = audit(&run7, &["--machine", "laptop"], &state);
    assert!(!ok && text.contains("machine spec"), "{text}");
}
