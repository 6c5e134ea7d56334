//! The witness client's settings, typed (the command line fills them from its flags).

use std::time::Duration;

use crate::checkpoint::note::VerifierKey;

/// Where to submit heads and whose cosignatures count.
#[derive(Debug, Clone)]
pub struct WitnessConfig {
    /// Each witness's submission prefix (`http://host:port`; `/add-checkpoint` is appended).
    pub urls: Vec<String>,
    /// Trusted witness keys (type 0x04 verifier keys, e.g. from a witness policy file); a
    /// cosignature by any other key is ignored.
    pub keys: Vec<VerifierKey>,
    /// Distinct trusted keys that must cosign a head for it to count (K of N).
    pub quorum: usize,
    /// Limit on one request (connect, send, reply).
    pub timeout: Duration,
    /// First wait after a failed request; doubled per failure up to `retry_max`.
    pub retry_min: Duration,
    /// Longest wait between retries.
    pub retry_max: Duration,
    /// How long a front end waits for a quorum before handing out a receipt without one.
    pub quorum_wait: Duration,
}

impl WitnessConfig {
    /// Defaults for the timing: 5 s per request, retries from 100 ms up to 10 s, 10 s quorum wait.
    pub fn new(urls: Vec<String>, keys: Vec<VerifierKey>, quorum: usize) -> Self {
        Self {
            urls,
            keys,
            quorum,
            timeout: Duration::from_secs(5),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            quorum_wait: Duration::from_secs(10),
        }
    }
}
