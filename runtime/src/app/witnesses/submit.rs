//! One witness's loop: wait for a head newer than the last one this witness cosigned, send
//! `add-checkpoint` with a consistency proof from the size the witness holds, check the reply's
//! cosignatures and record them; on 409 take the witness's size and send again at once; on any
//! other failure wait (exponential backoff, `retry_min` doubling up to `retry_max`) and retry with
//! whatever head is newest then.

use std::time::Duration;

use super::config::WitnessConfig;
use super::feed::{Feed, Head};
use super::tally::Tally;
use crate::checkpoint::witness::cosignatures;
use crate::checkpoint::witness::protocol::{
    ADD_CHECKPOINT_PATH, AddCheckpoint, parse_cosignature_lines, parse_size_body,
};

/// What one exchange came to.
#[derive(Debug)]
pub enum Outcome {
    /// Cosigned: the verified cosignatures were recorded.
    Cosigned,
    /// 409: the witness holds this size.
    Conflict(u64),
    /// Anything else (network error, timeout, refusal, unverifiable reply).
    Failed(String),
}

/// Runs until the feed closes.
pub fn run(url: &str, feed: &Feed, tally: &Tally, config: &WitnessConfig) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("witness {url}: no async runtime: {e}");
            return;
        }
    };
    let client = match reqwest::Client::builder().timeout(config.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("witness {url}: no HTTP client: {e}");
            return;
        }
    };
    let endpoint = format!("{}{ADD_CHECKPOINT_PATH}", url.trim_end_matches('/'));
    // Size the witness holds for this log as far as we know (0: it never saw it).
    let mut old = 0u64;
    // Size of the newest head it cosigned.
    let mut done = 0u64;
    let mut backoff = config.retry_min;
    let mut conflicts = 0;
    loop {
        if feed.closed() {
            return; // finish() already waited for the quorum it wanted
        }
        let Some(head) = feed.wait_newer(done, Duration::from_millis(500)) else {
            if feed.closed() {
                return;
            }
            continue;
        };
        let outcome = rt.block_on(exchange(&client, &endpoint, feed, tally, &head, old));
        match outcome {
            Outcome::Cosigned => {
                old = head.size;
                done = head.size;
                backoff = config.retry_min;
                conflicts = 0;
            }
            Outcome::Conflict(size) if size <= head.size && conflicts < 3 => {
                tracing::debug!("witness {url} holds size {size}; re-sending from it");
                old = size;
                conflicts += 1;
            }
            Outcome::Conflict(size) => {
                tracing::warn!(
                    "witness {url} holds size {size}, which this log's head of {} cannot extend",
                    head.size
                );
                old = size.min(head.size);
                conflicts = 0;
                sleep(feed, &mut backoff, config);
            }
            Outcome::Failed(why) => {
                tracing::warn!("witness {url}: {why}; retrying in {backoff:?}");
                conflicts = 0;
                sleep(feed, &mut backoff, config);
            }
        }
    }
}

fn sleep(feed: &Feed, backoff: &mut Duration, config: &WitnessConfig) {
    let until = std::time::Instant::now() + *backoff;
    while std::time::Instant::now() < until && !feed.closed() {
        std::thread::sleep(Duration::from_millis(20).min(*backoff));
    }
    *backoff = (*backoff * 2).min(config.retry_max);
}

/// One `add-checkpoint` round trip for `head` from size `old`.
pub async fn exchange(
    client: &reqwest::Client,
    endpoint: &str,
    feed: &Feed,
    tally: &Tally,
    head: &Head,
    old: u64,
) -> Outcome {
    let Some(proof) = feed.consistency_proof(old, head.size) else {
        return Outcome::Failed(format!("no consistency proof from {old} to {}", head.size));
    };
    let body = AddCheckpoint {
        old,
        proof,
        checkpoint: head.note.to_string(),
    }
    .to_body();
    let resp = match client.post(endpoint).body(body).send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let status = resp.status().as_u16();
    let text = match resp.text().await {
        Ok(t) => t,
        Err(e) => return Outcome::Failed(format!("reading the reply: {e}")),
    };
    match status {
        200 => {
            let lines = match parse_cosignature_lines(&text) {
                Ok(l) => l,
                Err(e) => return Outcome::Failed(e),
            };
            match cosignatures::verified(&head.note, &lines, tally.keys()) {
                Ok(c) if c.is_empty() => {
                    Outcome::Failed("no cosignature by a trusted witness key in the reply".into())
                }
                Ok(c) => match tally.record(head.size, &head.note, &c) {
                    Ok(_) => Outcome::Cosigned,
                    Err(e) => Outcome::Failed(format!("storing cosignatures: {e}")),
                },
                Err(e) => Outcome::Failed(format!("reply does not verify: {e}")),
            }
        }
        409 => match parse_size_body(&text) {
            Some(size) => Outcome::Conflict(size),
            None => Outcome::Failed("409 without a size".into()),
        },
        s => Outcome::Failed(format!("HTTP {s}: {}", text.trim())),
    }
}
