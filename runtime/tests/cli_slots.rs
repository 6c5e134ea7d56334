//! `sov slots get/set` against a running `sov generate` process: suspending through the slot file
//! stops token generation, setting speculative_draft_len switches the machine to draft/verify at
//! its next step, resuming (which restores the suspend's checkpoint) finishes the request. Runs on the default model (skips, saying why, when
//! it is not in sov's cache: a random tiny model finishes before a second process can steer it).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SOV: &str = env!("CARGO_BIN_EXE_sov");

fn slots(run: &Path, args: &[&str]) -> String {
    let out = Command::new(SOV)
        .arg("slots")
        .args(args)
        .arg("--run")
        .arg(run)
        .output()
        .expect("sov slots runs");
    assert!(
        out.status.success(),
        "sov slots {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn slots_set_steers_a_running_generate() {
    if sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| sov::loader::cached_default_model(&d.cache))
        .is_none()
    {
        eprintln!("SKIP: SmolLM2-135M is not in sov's cache (run `sov generate --chat hi` once)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let trace = dir.path().join("trace.jsonl");
    let child = Command::new(SOV)
        .args([
            "generate",
            "--prompt",
            "one two three four five six seven eight nine ten",
            "--max-tokens",
            "160",
            "--ignore-eos",
            "--json",
        ])
        .arg("--run-dir")
        .arg(&run)
        .arg("--trace")
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sov generate starts");
    wait_for("the request to run", || {
        run.join("slots").exists() && slots(&run, &["get", "batch_size"]) == "1"
    });
    slots(&run, &["set", "power_state", "suspend"]);
    // The suspend interrupt clears power_state back to active once it has run.
    wait_for("the suspend interrupt", || {
        slots(&run, &["get", "power_state"]) == "active"
    });
    // The suspend checkpoints (after clearing power_state). The chain height in the slots moves
    // to 1 when the checkpoint is handed over; with the asynchronous checkpoint writer (the KV
    // blocks mode) the receipt reaches the disk a little later, so wait for both.
    let height = || -> u32 { slots(&run, &["get", "bft_quorum_height"]).parse().unwrap() };
    let receipt = |h: u32| run.join(format!("checkpoints/receipt-{h:08}.note"));
    wait_for("the suspend checkpoint's receipt on disk", || {
        let h = height();
        h >= 1 && receipt(h).exists()
    });
    let listing = slots(&run, &["get"]);
    assert!(listing.contains("kv_blocks_used"), "{listing}");
    // Suspended: the decode counter stands still.
    let before = slots(&run, &["get", "tokens_generated"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        slots(&run, &["get", "tokens_generated"]),
        before,
        "a suspended engine kept decoding"
    );
    slots(&run, &["set", "speculative_draft_len", "3"]);
    slots(&run, &["set", "power_state", "resume"]);
    let out = child.wait_with_output().expect("sov generate finishes");
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(json["tokens"].as_array().map(Vec::len), Some(160));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let suspend = lines
        .iter()
        .position(|e| e["cause"] == "interrupt:suspend")
        .expect("suspend in the trace");
    let resume = lines
        .iter()
        .position(|e| e["cause"] == "interrupt:resume")
        .expect("resume in the trace");
    assert!(suspend < resume);
    let has = |e: &serde_json::Value, a: &str| {
        e["actions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|x| x == a))
    };
    assert!(
        lines[..suspend].iter().all(|e| !has(e, "draft")),
        "no speculation before the slot was set"
    );
    assert!(
        lines[resume..]
            .iter()
            .any(|e| has(e, "draft") && has(e, "verify")),
        "speculation after the slot was set"
    );
}
