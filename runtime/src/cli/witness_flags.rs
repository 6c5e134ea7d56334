//! The witness flags `sov generate` and `sov serve` share, turned into a typed
//! [`WitnessConfig`]: `--witness URL` (repeatable), `--witness-policy FILE` (whose keys count:
//! the same file `sov verify --policy` reads), `--quorum K` (default: the policy's).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::app::witnesses::WitnessConfig;
use crate::checkpoint::Policy;

/// Witness flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WitnessFlags {
    /// Submit every signed tree head to this C2SP tlog-witness (its submission prefix, e.g.
    /// http://127.0.0.1:7380). Repeatable.
    #[arg(long = "witness", value_name = "URL")]
    pub witness: Vec<String>,
    /// Witness keys whose cosignatures count, as a policy file (`witness <vkey>` lines and a
    /// `quorum K` line, the file `sov verify --policy` reads). Required with --witness.
    #[arg(long, value_name = "FILE")]
    pub witness_policy: Option<PathBuf>,
    /// Distinct trusted witnesses that must cosign a head (default: the policy's quorum).
    #[arg(long, value_name = "K")]
    pub quorum: Option<usize>,
    /// Seconds one witness request may take.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub witness_timeout: f64,
    /// Seconds `generate` waits for a quorum on each response's head (and on the last head at
    /// exit) before printing it without cosignatures.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub quorum_wait: f64,
}

impl WitnessFlags {
    /// The configuration, None without --witness.
    pub fn config(&self) -> anyhow::Result<Option<WitnessConfig>> {
        if self.witness.is_empty() {
            anyhow::ensure!(
                self.witness_policy.is_none() && self.quorum.is_none(),
                "--witness-policy and --quorum need --witness"
            );
            return Ok(None);
        }
        let path = self
            .witness_policy
            .as_ref()
            .context("--witness needs --witness-policy FILE (the witness keys that count)")?;
        let policy =
            Policy::load(path).with_context(|| format!("--witness-policy {}", path.display()))?;
        let quorum = self.quorum.unwrap_or(policy.quorum);
        anyhow::ensure!(
            quorum >= 1 && quorum <= policy.witnesses.len(),
            "--quorum {quorum}: must be between 1 and the {} witness keys of the policy",
            policy.witnesses.len()
        );
        let secs = |s: f64, what: &str| -> anyhow::Result<Duration> {
            Duration::try_from_secs_f64(s)
                .map_err(|_| anyhow::anyhow!("{what} {s}: not a duration"))
        };
        let mut c = WitnessConfig::new(self.witness.clone(), policy.witnesses, quorum);
        c.timeout = secs(self.witness_timeout, "--witness-timeout")?;
        c.quorum_wait = secs(self.quorum_wait, "--quorum-wait")?;
        Ok(Some(c))
    }
}
