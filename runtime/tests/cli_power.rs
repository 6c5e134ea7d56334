//! Power and interruption events through the `sov` binary: SIGTERM and SIGINT checkpoint and exit
//! 0, and `--resume` then finishes every request exactly as an uninterrupted run; a low battery
//! (a fake `/sys/class/power_supply` tree) checkpoints at once; a tampered checkpoint directory is
//! refused by `--resume` with the problem named; a resume on another platform (tensor-parallel
//! ranks) says that it cannot continue the run exactly.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::sov_process::{sov, spawn_generate};

/// Everything but the prompts (a resume takes them from its journal).
const ARGS: [&str; 9] = [
    "generate",
    "--model",
    "random:tiny",
    "--device",
    "cpu",
    "--max-tokens",
    "1500",
    "--ignore-eos",
    "--json",
];
const PROMPTS: [&str; 6] = ["--prompt", "one", "--prompt", "two", "--prompt", "three"];

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Request id -> the whole JSON line minus timing fields.
fn outputs(stdout: &[u8]) -> Vec<(u64, serde_json::Value, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["request_id"].as_u64().unwrap(),
                v["tokens"].clone(),
                v["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Starts a generation of [`PROMPTS`], waits until its requests are accepted.
fn start(home: &Path) -> (std::process::Child, PathBuf) {
    spawn_generate(sov(home).args(ARGS).args(PROMPTS), Stdio::piped())
}

/// A generation of [`PROMPTS`] stopped by SIGTERM 300 ms after its requests were accepted; its
/// run directory.
fn interrupted(home: &Path) -> PathBuf {
    let (child, run_dir) = start(home);
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait_with_output().unwrap();
    run_dir
}

fn signal_then_resume(signal: &str) {
    let home = tempfile::tempdir().unwrap();
    let want = run_ok(
        sov(home.path())
            .args(ARGS)
            .args(PROMPTS)
            .args(["--checkpoint", "off"]),
    );
    let (child, run_dir) = start(home.path());
    std::thread::sleep(Duration::from_millis(150));
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{signal}: sov generate should checkpoint and exit 0, got {:?}",
        out.status
    );
    let receipts = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("receipt-"))
        .count();
    assert!(receipts >= 1, "{signal}: no checkpoint was written");
    let resumed = run_ok(sov(home.path()).args(ARGS).arg("--resume").arg(&run_dir));
    assert_eq!(
        outputs(&resumed.stdout),
        outputs(&want.stdout),
        "{signal}: resumed outputs differ from the uninterrupted run"
    );
}

#[test]
fn sigterm_checkpoints_exits_zero_and_resumes_exactly() {
    signal_then_resume("TERM");
}

#[test]
fn sigint_checkpoints_exits_zero_and_resumes_exactly() {
    signal_then_resume("INT");
}

#[test]
fn low_battery_checkpoints_at_once() {
    let home = tempfile::tempdir().unwrap();
    let bat = home.path().join("power_supply/BAT0");
    std::fs::create_dir_all(&bat).unwrap();
    std::fs::write(bat.join("type"), "Battery\n").unwrap();
    std::fs::write(bat.join("capacity"), "4\n").unwrap();
    std::fs::write(bat.join("status"), "Discharging\n").unwrap();
    // 20 tokens: far fewer decode steps than checkpoint_every (64), so only the battery can
    // have caused a checkpoint.
    let short_run = |name: &str| {
        let run_dir = home.path().join(name);
        run_ok(
            sov(home.path())
                .env("SOV_POWER_SUPPLY_DIR", home.path().join("power_supply"))
                .args(["generate", "--model", "random:tiny", "--device", "cpu"])
                .args(["--max-tokens", "20", "--ignore-eos", "--prompt", "x"])
                .arg("--run-dir")
                .arg(&run_dir),
        );
        run_dir
    };
    assert!(
        short_run("run")
            .join("checkpoints/receipt-00000001.note")
            .exists(),
        "low battery did not checkpoint"
    );
    // Above the threshold (or charging) nothing fires.
    std::fs::write(bat.join("status"), "Charging\n").unwrap();
    let run_dir2 = short_run("run2");
    assert!(!run_dir2.join("checkpoints/receipt-00000001.note").exists());
}

#[test]
fn resume_refuses_a_tampered_or_foreign_directory() {
    let home = tempfile::tempdir().unwrap();
    let run_dir = interrupted(home.path());
    let ckpt = run_dir.join("checkpoints");
    let snap = std::fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .max()
        .expect("a snapshot");
    let mut bytes = std::fs::read(&snap).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&snap, &bytes).unwrap();
    let out = sov(home.path())
        .args(ARGS)
        .arg("--resume")
        .arg(&run_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a flipped snapshot byte was accepted"
    );
    assert!(
        err.contains(&*snap.file_name().unwrap().to_string_lossy()),
        "the error should name the file: {err}"
    );
    // Undo the flip: resuming with another key is refused too.
    bytes[at] ^= 0x01;
    std::fs::write(&snap, &bytes).unwrap();
    let keys = home.path().join("other");
    run_ok(sov(home.path()).args(["keygen", "--out"]).arg(&keys));
    let out = sov(home.path())
        .args(ARGS)
        .arg("--key")
        .arg(keys.join("checkpoint.key"))
        .arg("--resume")
        .arg(&run_dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a foreign key's resume was accepted");
    // And with the right key it resumes.
    run_ok(sov(home.path()).args(ARGS).arg("--resume").arg(&run_dir));
}

#[test]
fn resume_on_another_platform_says_so() {
    let home = tempfile::tempdir().unwrap();
    let run_dir = interrupted(home.path());
    // Two tensor-parallel ranks sum in another order: the heads name `cpu-tp2`.
    let out = run_ok(
        sov(home.path())
            .args(ARGS)
            .args(["--tensor-parallel", "2", "--resume"])
            .arg(&run_dir),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ran on cpu/f32, it continues on cpu-tp2/f32"),
        "the platform change should be named: {err}"
    );
}
