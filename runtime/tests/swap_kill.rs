//! SIGKILL while sequences are swapped out, then `--resume`, through the `sov` binary: six
//! concurrent requests on a KV cache of 2048 tokens (`--kv-memory-mb 1` on `random:tiny`) that
//! they outgrow, so the engine swaps sequences out (to the host pool, or with `--swap-mb 0
//! --swap-file-mb 1` to the swap file in the run directory). Each trial kills `sov generate` once
//! a checkpoint has been written while a sequence is swapped out, checks from the engine's swap
//! log that a sequence was still swapped out when it died, resumes, and compares every request's
//! tokens and text with an uninterrupted run on a roomy cache (which never swaps): identical,
//! greedy and seeded. After a spilling trial the killed run's swap file must be gone.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::sov_process::{parse_generated, sov};

const PROMPTS: [&str; 6] = [
    "hello",
    "the quick brown fox",
    "abc",
    "swap me out",
    "a longer prompt than the rest of them",
    "z",
];
/// Debug lines of the engine's swap module (`swap_out: sequence N ...`, `swap_in: ...`).
const LOG: &str = "warn,sov::engine::swap=debug";
const SPILL_FILE: &str = "kv-swap.spill";

struct Mode {
    name: &'static str,
    sampling: &'static [&'static str],
}

const MODES: [Mode; 2] = [
    Mode {
        name: "greedy",
        sampling: &[],
    },
    Mode {
        name: "seeded",
        sampling: &["--temperature", "0.9", "--top-p", "0.95", "--seed", "7"],
    },
];

fn args(key: &Path, mode: &Mode, kv: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--log",
        LOG,
        "generate",
        "--model",
        "random:tiny",
        "--device",
        "cpu",
        "--max-tokens",
        "600",
        "--ignore-eos",
        "--json",
        "--key",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(key.display().to_string());
    a.extend(mode.sampling.iter().map(|s| s.to_string()));
    a.extend(kv.iter().map(|s| s.to_string()));
    a
}

fn with_prompts(cmd: &mut Command) -> &mut Command {
    for p in PROMPTS {
        cmd.args(["--prompt", p]);
    }
    cmd
}

/// Sequences swapped out and not back, after the swap log lines in `lines`.
fn outstanding(lines: &[String]) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for l in lines {
        let id = |tag: &str| {
            l.split(tag)
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|n| n.trim().parse::<u64>().ok())
        };
        if let Some(id) = id("swap_out: sequence ") {
            out.insert(id);
        } else if let Some(id) = id("swap_in: sequence ") {
            out.remove(&id);
        }
    }
    out
}

fn receipts(run_dir: &Path) -> usize {
    std::fs::read_dir(run_dir.join("checkpoints")).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("receipt-") && n.ends_with(".note")
            })
            .count()
    })
}

/// A running `sov generate` with every stderr line kept.
struct Watched {
    child: Child,
    run_dir: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    reader: JoinHandle<()>,
}

fn spawn(cmd: &mut Command) -> Watched {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let keep = lines.clone();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(rest) = line.trim().split("resume with --resume ").nth(1) {
                let _ = tx.send(PathBuf::from(rest));
            }
            keep.lock().unwrap().push(std::mem::take(&mut line));
        }
    });
    let run_dir = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("sov generate never printed its run directory");
    Watched {
        child,
        run_dir,
        lines,
        reader,
    }
}

struct Killed {
    run_dir: PathBuf,
    /// Sequences swapped out when the process died.
    swapped: BTreeSet<u64>,
    /// Receipts written while a sequence was swapped out, before the kill.
    receipts_while_swapped: usize,
    /// The swap file was in the run directory after the kill.
    spill_left: bool,
}

/// Starts `cmd`, kills it (SIGKILL) once the `nth` swap-out has happened and a checkpoint has
/// been written since while a sequence is still swapped out.
fn kill_while_swapped(cmd: &mut Command, nth: usize) -> Killed {
    let mut w = spawn(cmd);
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut mark: Option<usize> = None;
    loop {
        assert!(
            w.child.try_wait().unwrap().is_none(),
            "sov generate finished before it was killed while swapped out"
        );
        assert!(Instant::now() < give_up, "no swap-out happened");
        let (outs, now_out) = {
            let l = w.lines.lock().unwrap();
            let outs = l
                .iter()
                .filter(|l| l.contains("swap_out: sequence "))
                .count();
            (outs, !outstanding(&l).is_empty())
        };
        let r = receipts(&w.run_dir);
        match mark {
            _ if !now_out => mark = None,
            None if outs >= nth => mark = Some(r),
            Some(m) if r > m => break,
            _ => {}
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    let at_kill = receipts(&w.run_dir);
    let _ = w.child.kill();
    let _ = w.child.wait();
    w.reader.join().unwrap();
    let lines = w.lines.lock().unwrap();
    Killed {
        spill_left: w.run_dir.join(SPILL_FILE).exists(),
        swapped: outstanding(&lines),
        receipts_while_swapped: at_kill - mark.unwrap_or(at_kill),
        run_dir: w.run_dir,
    }
}

#[test]
fn sigkill_while_sequences_are_swapped_out_then_resume_gives_the_uninterrupted_outputs() {
    let root = tempfile::tempdir().unwrap();
    let keys = root.path().join("keys");
    let out = sov(root.path())
        .args(["keygen", "--out"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(out.status.success(), "keygen: {out:?}");
    let key = keys.join("checkpoint.key");
    // (name, KV options, kill at the nth swap-out)
    let setups: [(&str, &[&str], usize); 3] = [
        ("host", &["--kv-memory-mb", "1"], 1),
        ("host-later", &["--kv-memory-mb", "1"], 2),
        (
            "file",
            &[
                "--kv-memory-mb",
                "1",
                "--swap-mb",
                "0",
                "--swap-file-mb",
                "1",
            ],
            1,
        ),
    ];
    for mode in &MODES {
        // The anchor: an uninterrupted run on the default (roomy) cache, which never swaps.
        let home = root.path().join(format!("ref-{}", mode.name));
        let out = with_prompts(sov(&home).args(args(&key, mode, &[])))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "reference run failed: {err}");
        assert!(
            !err.contains("swap_out"),
            "the reference run swapped: {err}"
        );
        let want = parse_generated(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(want.len(), PROMPTS.len());

        for (name, kv, nth) in setups {
            let home = root.path().join(format!("{}-{name}", mode.name));
            let k = kill_while_swapped(with_prompts(sov(&home).args(args(&key, mode, kv))), nth);
            let trial = format!("{} {name}", mode.name);
            assert!(
                !k.swapped.is_empty(),
                "{trial}: no sequence was swapped out when the process died"
            );
            assert!(k.receipts_while_swapped > 0, "{trial}");
            if name == "file" {
                assert!(k.spill_left, "{trial}: the killed run had spilled nothing");
            }
            let out = sov(&home)
                .args(args(&key, mode, kv))
                .arg("--resume")
                .arg(&k.run_dir)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{trial}: resume failed: {err}");
            let got = parse_generated(&String::from_utf8_lossy(&out.stdout));
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>(),
                "{trial}: requests lost or invented"
            );
            for (id, w) in &want {
                assert_eq!(
                    &got[id], w,
                    "{trial}: request {id} differs from the uninterrupted run"
                );
            }
            assert!(
                !k.run_dir.join(SPILL_FILE).exists(),
                "{trial}: a swap file is left in the run directory"
            );
            println!(
                "{trial}: killed with sequences {:?} swapped out, {} checkpoint(s) taken while swapped",
                k.swapped, k.receipts_while_swapped
            );
        }
    }
}
