//! Witnesses end to end: three `sov witness` processes on loopback (ephemeral ports), one killed,
//! and a `sov generate --witness x3 --quorum 2` on the default model: every response's receipt
//! carries two cosignatures and passes `sov verify --response --policy`, the run directory passes
//! `sov verify --policy` (quorum 2) and fails it with quorum 3 naming how many were found, slot
//! `bft_quorum_height` holds the cosigned log size, and a restarted witness keeps its view (it
//! answers an `old 0` submission of the run's head with 409 and the size it cosigned).
//! Plus the loopback round-trip figure (ignored: `-- --ignored --nocapture`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::sov_process::sov;

struct Witness {
    child: Child,
    url: String,
    vkey: String,
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(home: &Path, dir: &Path) {
    let out = sov(home)
        .args(["keygen", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start_witness(home: &Path, i: usize, log_pub: &Path) -> Witness {
    let kdir = home.join(format!("wkey{i}"));
    if !kdir.join("checkpoint.key").exists() {
        keygen(home, &kdir);
    }
    let mut child = sov(home)
        .arg("witness")
        .arg("--key")
        .arg(kdir.join("checkpoint.key"))
        .arg("--state")
        .arg(home.join(format!("wstate{i}")))
        .arg("--log")
        .arg(format!("sov.run/*={}", log_pub.display()))
        .args(["--port", "0", "--name", &format!("w{i}.test/witness")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut vkey, mut url) = (String::new(), String::new());
    let mut line = String::new();
    while url.is_empty() && out.read_line(&mut line).unwrap() > 0 {
        if let Some(v) = line.trim().strip_prefix("verifier key: ") {
            vkey = v.to_string();
        }
        if let Some(u) = line.trim().strip_prefix("witness listening on ") {
            url = u.to_string();
        }
        line.clear();
    }
    assert!(
        !url.is_empty() && !vkey.is_empty(),
        "witness {i} did not start"
    );
    Witness { child, url, vkey }
}

fn policy(home: &Path, witnesses: &[&str], quorum: usize, name: &str) -> PathBuf {
    let p = home.join(name);
    let mut text: String = witnesses.iter().map(|v| format!("witness {v}\n")).collect();
    text.push_str(&format!("quorum {quorum}\n"));
    std::fs::write(&p, text).unwrap();
    p
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn two_of_three_witnesses_cosign_with_one_down() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let logkeys = home.join("logkey");
    keygen(home, &logkeys);
    let log_pub = logkeys.join("checkpoint.pub");
    let mut ws: Vec<Witness> = (0..3).map(|i| start_witness(home, i, &log_pub)).collect();
    let vkeys: Vec<String> = ws.iter().map(|w| w.vkey.clone()).collect();
    let vk: Vec<&str> = vkeys.iter().map(String::as_str).collect();
    let p2 = policy(home, &vk, 2, "policy2");
    let p3 = policy(home, &vk, 3, "policy3");
    let urls: Vec<String> = ws.iter().map(|w| w.url.clone()).collect();
    // Witness 2 goes down before the run.
    let _ = ws[2].child.kill();
    let _ = ws[2].child.wait();

    let run_dir = home.join("run");
    let mut generate = sov(home);
    generate
        .args(["generate", "--device", "cpu", "--max-tokens", "8", "--json"])
        .args([
            "--prompt",
            "The capital of France is",
            "--prompt",
            "1, 2, 3,",
        ])
        .arg("--key")
        .arg(logkeys.join("checkpoint.key"))
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("--witness-policy")
        .arg(&p2)
        .args([
            "--quorum",
            "2",
            "--witness-timeout",
            "1",
            "--quorum-wait",
            "20",
        ]);
    for u in &urls {
        generate.args(["--witness", u]);
    }
    let out = generate.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("cosigned by the quorum"), "{stderr}");
    let responses = home.join("responses.jsonl");
    std::fs::write(&responses, &out.stdout).unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let head = v["receipt"]["head"].as_str().unwrap();
        assert_eq!(head.matches('\u{2014}').count(), 3, "{head}");
    }

    let verify = |extra: &[&std::ffi::OsStr]| {
        let mut c = sov(home);
        c.arg("verify").arg("--key").arg(&log_pub).args(extra);
        run(&mut c)
    };
    let (ok, text) = verify(&[
        "--response".as_ref(),
        responses.as_os_str(),
        "--policy".as_ref(),
        p2.as_os_str(),
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("cosigned by 2 witnesses"), "{text}");
    let (ok, text) = verify(&[
        "--response".as_ref(),
        responses.as_os_str(),
        "--policy".as_ref(),
        p3.as_os_str(),
    ]);
    assert!(!ok && text.contains("has 2 valid cosignatures"), "{text}");
    let (ok, text) = verify(&[run_dir.as_os_str(), "--policy".as_ref(), p2.as_os_str()]);
    assert!(ok, "{text}");
    let (ok, text) = verify(&[run_dir.as_os_str(), "--policy".as_ref(), p3.as_os_str()]);
    assert!(!ok && text.contains("has 2 valid cosignatures"), "{text}");

    // The slot holds the newest cosigned log size (the newest head's, after the exit wait).
    let notes = std::fs::read_to_string(run_dir.join("checkpoints/cosignatures.log")).unwrap();
    let newest: u64 = notes
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .max()
        .unwrap();
    let mut slots = sov(home);
    slots
        .args(["slots", "get", "bft_quorum_height", "--run"])
        .arg(&run_dir);
    let (ok, text) = run(&mut slots);
    assert!(ok, "{text}");
    assert_eq!(text.trim(), newest.to_string(), "{text}");

    // A restarted witness keeps its view: the head it cosigned, from old 0, is a 409 with its size.
    let _ = ws[0].child.kill();
    let _ = ws[0].child.wait();
    ws[0] = start_witness(home, 0, &log_pub);
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let head = v["receipt"]["head"].as_str().unwrap();
    let signed_only: String = {
        // The log's own note: body, blank line, the log's signature line (the first).
        let (body, sigs) = head.split_once("\n\n").unwrap();
        format!("{body}\n\n{}\n", sigs.lines().next().unwrap())
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (status, body) = rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/add-checkpoint", ws[0].url))
            .body(format!("old 0\n\n{signed_only}"))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    assert_eq!(status, 409, "{body}");
    assert!(
        body.trim().parse::<u64>().unwrap() >= newest.min(1),
        "{body}"
    );
}

/// Loopback round trip of `add-checkpoint` (median of 200 calls), each a new consistent head.
#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn witness_round_trip_figures() {
    use sov_store::head::{self, TreeHead, origin_for};
    use sov_store::merkle::{Tree, leaf_hash};
    use sov_store::witness::protocol::AddCheckpoint;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let logkeys = home.join("logkey");
    keygen(home, &logkeys);
    let w = start_witness(home, 0, &logkeys.join("checkpoint.pub"));
    let sk = sov_store::keys::load_private(&logkeys.join("checkpoint.key")).unwrap();
    let n = 200u64;
    let tree = Tree::from_leaves((0..=n).map(|i| leaf_hash(&i.to_le_bytes())));
    let note = |size: u64| {
        head::sign(
            &TreeHead {
                origin: origin_for(&tree.leaves()[0]),
                size,
                root: tree.root(size).unwrap(),
                spec: [1; 32],
                model: [2; 32],
                checkpoint: None,
                backend: Some("cpu".into()),
                precision: Some("f32".into()),
                sampler: Some("draw-1".into()),
            },
            &sk,
        )
        .unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let mut times = Vec::new();
    for size in 1..=n {
        let body = AddCheckpoint {
            old: size - 1,
            proof: tree.consistency_proof(size - 1, size).unwrap(),
            checkpoint: note(size),
        }
        .to_body();
        let t = std::time::Instant::now();
        let status = rt.block_on(async {
            client
                .post(format!("{}/add-checkpoint", w.url))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
        });
        times.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(status.as_u16(), 200);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "witness add-checkpoint round trip on loopback, {n} calls (keep-alive, fsync per call): median {:.0} us, p90 {:.0} us, min {:.0} us",
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        times[0]
    );
}
