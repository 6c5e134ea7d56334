//! Running the `sov` binary from integration tests: isolated state and config directories, and
//! starting a `sov generate` whose run directory is read from its stderr.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `sov` with its state and config directories inside `home` (nothing touches the user's).
pub fn sov(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sov"));
    c.env("SOV_STATE_DIR", home.join("state"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("HOME", home)
        .env_remove("SOV_POWER_SUPPLY_DIR");
    c
}

/// Spawns `cmd` (a `sov generate`), waits until it has accepted (journaled) every request and
/// printed its run directory, and keeps draining its stderr so it never blocks on the pipe.
pub fn spawn_generate(cmd: &mut Command, stdout: Stdio) -> (Child, PathBuf) {
    let mut child = cmd.stdout(stdout).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some(rest) = line.trim().split("resume with --resume ").nth(1) {
            let dir = PathBuf::from(rest);
            std::thread::spawn(move || {
                let mut sink = String::new();
                while stderr.read_line(&mut sink).unwrap_or(0) > 0 {
                    sink.clear();
                }
            });
            return (child, dir);
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("sov generate never printed its run directory");
}

/// One request's result from `sov generate --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Generated token ids.
    pub tokens: Vec<u64>,
    /// Their text.
    pub text: String,
    /// Why it stopped (`stop`, `length`, ...).
    pub finish_reason: String,
}

/// The results of `sov generate --json` (one JSON object a line) by request id.
///
/// # Panics
/// On a line that is not such an object (a test failure with the line shown).
pub fn parse_generated(stdout: &str) -> std::collections::BTreeMap<u64, Generated> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            let field = |k: &str| {
                v[k].as_str()
                    .unwrap_or_else(|| panic!("no {k} in {l}"))
                    .to_string()
            };
            let tokens = v["tokens"]
                .as_array()
                .unwrap_or_else(|| panic!("no tokens in {l}"))
                .iter()
                .map(|t| t.as_u64().expect("token id"))
                .collect();
            let id = v["request_id"].as_u64().expect("request_id");
            let g = Generated {
                tokens,
                text: field("text"),
                finish_reason: field("finish_reason"),
            };
            (id, g)
        })
        .collect()
}
