//! Exact resume after SIGKILL, through the `sov` binary: for greedy and seeded sampling with four
//! concurrent requests, kill `sov generate` at random points (half of the trials aimed at the
//! window where a checkpoint is being written), restart it with `--resume RUN_DIR`, and compare
//! every request's final tokens and text with an uninterrupted run: identical, and none lost.
//! After each resume `sov verify` must accept the run's receipt chain.
//!
//! Kill points are drawn from a fixed seed (override with `SOV_KILL_SEED`), so a failure
//! reproduces. The model is `random:tiny` on the CPU: fast enough for 20+ trials in CI.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::sov_process::{Generated, parse_generated, sov, spawn_generate};

const TRIALS_PER_MODE: usize = 10;
const PROMPTS: [&str; 4] = ["hello", "the quick brown fox", "abc", "resume me exactly"];

/// Request id -> (tokens, text, finish reason).
type Outputs = BTreeMap<u64, Generated>;

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
        sampling: &["--temperature", "0.9", "--top-p", "0.95", "--seed", "11"],
    },
];

/// A small deterministic generator for kill points (splitmix64).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Env {
    root: tempfile::TempDir,
    key: PathBuf,
    public: PathBuf,
}

impl Env {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let keys = root.path().join("keys");
        let out = sov(root.path())
            .args(["keygen", "--out"])
            .arg(&keys)
            .output()
            .unwrap();
        assert!(out.status.success(), "keygen: {out:?}");
        Env {
            key: keys.join("checkpoint.key"),
            public: keys.join("checkpoint.pub"),
            root,
        }
    }

    fn state(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
}

fn generate_args(env: &Env, mode: &Mode) -> Vec<String> {
    let mut a: Vec<String> = [
        "generate",
        "--model",
        "random:tiny",
        "--device",
        "cpu",
        "--max-tokens",
        "900",
        "--ignore-eos",
        "--json",
        "--key",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(env.key.display().to_string());
    a.extend(mode.sampling.iter().map(|s| s.to_string()));
    a
}

/// The uninterrupted run and how long it took.
fn reference(env: &Env, mode: &Mode) -> (Outputs, Duration) {
    let home = env.state(&format!("ref-{}", mode.name));
    let t0 = Instant::now();
    let mut cmd = sov(&home);
    cmd.args(generate_args(env, mode));
    for p in PROMPTS {
        cmd.args(["--prompt", p]);
    }
    let out = cmd.output().unwrap();
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "reference run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outputs = parse_generated(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(outputs.len(), PROMPTS.len());
    (outputs, took)
}

/// Whether a checkpoint is being written right now: a snapshot without its receipt, or a
/// temporary receipt file.
fn checkpoint_in_flight(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.iter().any(|n| {
        n.ends_with(".tmp")
            || n.strip_prefix("snapshot-")
                .and_then(|r| r.strip_suffix(".snap"))
                .is_some_and(|h| !names.contains(&format!("receipt-{h}.note")))
    })
}

#[derive(Default, Debug)]
struct Tally {
    trials: usize,
    aimed_at_checkpoint: usize,
    hit_checkpoint_window: usize,
    torn_recovered: usize,
    before_first_checkpoint: usize,
    finished_before_kill: usize,
}

/// One trial: start, kill, resume, compare. Returns what the resume reported on stderr.
fn trial(
    env: &Env,
    mode: &Mode,
    want: &Outputs,
    budget: Duration,
    draw: &mut Draw,
    tally: &mut Tally,
    n: usize,
) {
    let home = env.state(&format!("{}-{n}", mode.name));
    let mut cmd = sov(&home);
    cmd.args(generate_args(env, mode));
    for p in PROMPTS {
        cmd.args(["--prompt", p]);
    }
    let (mut child, run_dir) = spawn_generate(&mut cmd, Stdio::null());
    let ckpt = run_dir.join("checkpoints");
    let aim = n.is_multiple_of(2);
    let deadline = Instant::now() + Duration::from_micros(draw.below(budget.as_micros() as u64));
    if aim {
        // Aim at the k-th checkpoint's write window.
        tally.aimed_at_checkpoint += 1;
        let give_up = Instant::now() + budget * 2;
        let skip = draw.below(6);
        let mut seen = 0;
        let mut was = false;
        loop {
            let now_in = checkpoint_in_flight(&ckpt);
            if now_in && !was {
                seen += 1;
                if seen > skip {
                    tally.hit_checkpoint_window += 1;
                    break;
                }
            }
            was = now_in;
            if Instant::now() > give_up || child.try_wait().unwrap().is_some() {
                break;
            }
            std::hint::spin_loop();
        }
    } else {
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if child.try_wait().unwrap().is_some() {
        tally.finished_before_kill += 1;
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    if !ckpt.join("receipt-00000001.note").exists() {
        tally.before_first_checkpoint += 1;
    }

    let out = sov(&home)
        .args(generate_args(env, mode))
        .arg("--resume")
        .arg(&run_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trial {n} ({}): resume failed: {err}",
        mode.name
    );
    if err.contains("recovered from an interrupted checkpoint") {
        tally.torn_recovered += 1;
    }
    let got = parse_generated(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "trial {n} ({}): requests lost or invented; stderr: {err}",
        mode.name
    );
    for (id, w) in want {
        assert_eq!(
            &got[id], w,
            "trial {n} ({}): request {id} differs from the uninterrupted run",
            mode.name
        );
    }
    let verify = sov(&home)
        .arg("verify")
        .arg(&run_dir)
        .arg("--key")
        .arg(&env.public)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "trial {n}: sov verify after resume: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    tally.trials += 1;
}

#[test]
fn sigkill_at_random_points_then_resume_gives_the_uninterrupted_outputs() {
    let seed = std::env::var("SOV_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_u64);
    println!("kill points from seed {seed} (SOV_KILL_SEED)");
    let env = Env::new();
    let mut draw = Draw(seed);
    let mut tally = Tally::default();
    for mode in &MODES {
        let (want, took) = reference(&env, mode);
        println!(
            "{}: uninterrupted run {:.0} ms",
            mode.name,
            took.as_secs_f64() * 1e3
        );
        for n in 0..TRIALS_PER_MODE {
            trial(&env, mode, &want, took, &mut draw, &mut tally, n);
        }
    }
    println!("{tally:?}");
    assert_eq!(tally.trials, 2 * TRIALS_PER_MODE);
    assert!(
        tally.hit_checkpoint_window > 0,
        "no trial was killed while a checkpoint was being written: {tally:?}"
    );
}
