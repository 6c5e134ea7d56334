//! The witness client of `sov generate|serve --witness URL ... --quorum K`: every signed tree head
//! of the run's log is submitted to each witness (C2SP tlog-witness `add-checkpoint`), the
//! cosignatures that come back are checked and kept in `cosignatures.log`, slot
//! `bft_quorum_height` holds the newest log size cosigned by K of the N witnesses, and receipts
//! are re-issued against the newest quorate head with its cosignatures attached.
//!
//! Design: nothing here runs on the engine's step path. The store tells a [`feed::Feed`] of each
//! head (a few hashes copied under a mutex, see `HeadSink`); one thread per witness (each with
//! its own single-threaded tokio runtime and reqwest client) waits on the feed, always takes the
//! newest head (older unsent heads are skipped: a bounded queue of one), builds the consistency
//! proof from the witness's size from its own copy of the tree, retries with exponential backoff
//! and a timeout per request, and on 409 re-sends from the size the witness names. [`tally`]
//! counts distinct trusted witness keys per head size.
//! - [`config`]: [`WitnessConfig`], the typed settings;
//! - [`feed`]: the heads and leaves the store hands over;
//! - [`submit`]: one witness's loop;
//! - [`tally`]: cosignatures per head, quorum, the slot and `cosignatures.log`.

pub mod config;
pub mod feed;
pub mod submit;
pub mod tally;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::checkpoint::attest::ResponseReceipt;
use crate::scheduler::Slots;

pub use config::WitnessConfig;
use feed::Feed;
use tally::Tally;

/// The running witness client of one run.
pub struct Witnesses {
    quorum_wait: Duration,
    feed: Arc<Feed>,
    tally: Arc<Tally>,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Witnesses {
    /// Start one submitting thread per witness URL; cosignatures go to `dir/cosignatures.log`.
    pub fn start(config: WitnessConfig, dir: &Path) -> std::io::Result<Self> {
        let feed = Arc::new(Feed::default());
        let tally = Arc::new(Tally::new(dir, config.keys.clone(), config.quorum));
        let quorum_wait = config.quorum_wait;
        let config = Arc::new(config);
        let mut threads = Vec::new();
        for (i, url) in config.urls.iter().enumerate() {
            let (feed, tally, config, url) =
                (feed.clone(), tally.clone(), config.clone(), url.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("sov-witness-{i}"))
                    .spawn(move || submit::run(&url, &feed, &tally, &config))?,
            );
        }
        Ok(Self {
            quorum_wait,
            feed,
            tally,
            threads: std::sync::Mutex::new(threads),
        })
    }

    /// What the store tells of each signed head.
    pub fn sink(&self) -> Box<dyn crate::checkpoint::HeadSink> {
        Box::new(feed::FeedSink(self.feed.clone()))
    }

    /// The value slot `bft_quorum_height` should hold (the engine's checkpoint action reads it).
    pub fn quorum_height(&self) -> Arc<AtomicU32> {
        self.tally.quorum_height()
    }

    /// Keep `slots`' `bft_quorum_height` at the newest quorate log size from now on.
    pub fn publish_to(&self, slots: Slots) {
        self.tally.publish_to(slots);
    }

    /// Newest log size cosigned by the quorum (0: none yet).
    pub fn quorate_size(&self) -> u64 {
        self.tally.quorate().map_or(0, |(size, _)| size)
    }

    /// Wait up to `timeout` for a quorate head of at least `size` leaves; whether one came.
    pub fn wait_quorate(&self, size: u64, timeout: Duration) -> bool {
        self.tally.wait_quorate(size, Instant::now() + timeout)
    }

    /// `receipt` re-issued against the newest quorate head (its note with the cosignatures
    /// attached) when that head covers its leaf; else `receipt` unchanged.
    pub fn upgrade(&self, receipt: ResponseReceipt) -> ResponseReceipt {
        let Some((size, note)) = self.tally.quorate() else {
            return receipt;
        };
        if receipt.leaf_index >= size {
            return receipt;
        }
        self.feed.reissue(&receipt, size, &note).unwrap_or(receipt)
    }

    /// [`Self::upgrade`] after waiting up to the configured quorum wait for a quorate head that
    /// covers the receipt's leaf (what `sov generate` prints).
    pub fn cosigned(&self, receipt: ResponseReceipt) -> ResponseReceipt {
        self.wait_quorate(receipt.leaf_index + 1, self.quorum_wait);
        self.upgrade(receipt)
    }

    /// How long a front end waits for a quorum.
    pub fn quorum_wait(&self) -> Duration {
        self.quorum_wait
    }

    /// Wait up to `timeout` for the newest head to be quorate, then stop the threads.
    pub fn finish(&self, timeout: Duration) -> bool {
        let newest = self.feed.newest_size();
        let ok = newest == 0 || self.wait_quorate(newest, timeout);
        self.feed.close();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        ok
    }
}

impl Drop for Witnesses {
    fn drop(&mut self) {
        self.feed.close();
    }
}
