//! Cosignatures per head and the quorum: which distinct trusted witness keys cosigned the head of
//! each tree size, appended to `cosignatures.log` as they arrive, and the newest size cosigned by
//! K of them, published in slot `bft_quorum_height` (saturated to u32) and to waiting readers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::checkpoint::note::VerifierKey;
use crate::checkpoint::witness::cosignatures::{self, Cosignature};
use crate::checkpoint::witness::cosigned;
use crate::scheduler::Slots;

/// One head's cosignatures.
struct HeadVotes {
    note: String,
    /// Witness key index -> its cosignature line.
    lines: BTreeMap<usize, String>,
}

#[derive(Default)]
struct State {
    heads: BTreeMap<u64, HeadVotes>,
    /// (size, note with the quorum's cosignatures attached).
    quorate: Option<(u64, String)>,
    slots: Option<Slots>,
}

/// The quorum bookkeeping of one run.
pub struct Tally {
    dir: PathBuf,
    keys: Vec<VerifierKey>,
    quorum: usize,
    state: Mutex<State>,
    changed: Condvar,
    height: Arc<AtomicU32>,
}

impl Tally {
    /// Counting cosignatures by `keys`, `quorum` of which make a head quorate.
    pub fn new(dir: &Path, keys: Vec<VerifierKey>, quorum: usize) -> Self {
        Self {
            dir: dir.to_path_buf(),
            keys,
            quorum,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            height: Arc::new(AtomicU32::new(0)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[VerifierKey] {
        &self.keys
    }

    /// The value slot `bft_quorum_height` should hold.
    pub fn quorum_height(&self) -> Arc<AtomicU32> {
        self.height.clone()
    }

    /// Write the quorate size into `slots` from now on.
    pub fn publish_to(&self, slots: Slots) {
        slots.set_bft_quorum_height(self.height.load(Ordering::Acquire));
        self.lock().slots = Some(slots);
    }

    /// Record verified cosignatures of the head of `size` (note `note`); returns whether the
    /// quorate head advanced. Appends the new ones to `cosignatures.log` (fsync).
    pub fn record(&self, size: u64, note: &str, cosigs: &[Cosignature]) -> std::io::Result<bool> {
        let mut s = self.lock();
        let votes = s.heads.entry(size).or_insert_with(|| HeadVotes {
            note: note.to_string(),
            lines: BTreeMap::new(),
        });
        let mut fresh = Vec::new();
        for c in cosigs {
            if votes.note == note && !votes.lines.contains_key(&c.witness) {
                votes.lines.insert(c.witness, c.line.clone());
                fresh.push(c.line.clone());
            }
        }
        if !fresh.is_empty() {
            cosigned::append(&self.dir, size, &fresh).map_err(std::io::Error::other)?;
        }
        let count = votes.lines.len();
        let attached = cosigned_note(note, &votes.lines.values().cloned().collect::<Vec<_>>());
        let advanced = count >= self.quorum && s.quorate.as_ref().is_none_or(|(q, _)| size > *q);
        if advanced {
            s.quorate = Some((size, attached));
            // Heads below the quorate one are no longer needed.
            s.heads = s.heads.split_off(&size);
            let h = u32::try_from(size).unwrap_or(u32::MAX);
            self.height.store(h, Ordering::Release);
            if let Some(slots) = &s.slots {
                slots.set_bft_quorum_height(h);
            }
            drop(s);
            self.changed.notify_all();
        }
        Ok(advanced)
    }

    /// The newest quorate head: (size, note with its cosignatures).
    pub fn quorate(&self) -> Option<(u64, String)> {
        self.lock().quorate.clone()
    }

    /// Wait until `deadline` for a quorate head of at least `size`.
    pub fn wait_quorate(&self, size: u64, deadline: Instant) -> bool {
        let mut s = self.lock();
        loop {
            if s.quorate.as_ref().is_some_and(|(q, _)| *q >= size) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// The cosigned note of a head: `note` with the cosignature `lines` attached.
fn cosigned_note(note: &str, lines: &[String]) -> String {
    cosignatures::attach(note, lines.iter().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::note;
    use crate::checkpoint::witness::{cosignatures, witness_verifier};
    use ed25519_dalek::SigningKey;

    #[test]
    fn k_of_n_distinct_keys_make_a_head_quorate() {
        let dir = tempfile::tempdir().unwrap();
        let sks: Vec<SigningKey> = (1..=3).map(|i| SigningKey::from_bytes(&[i; 32])).collect();
        let keys: Vec<VerifierKey> = sks
            .iter()
            .enumerate()
            .map(|(i, k)| witness_verifier(&format!("w{i}"), &k.verifying_key()).unwrap())
            .collect();
        let t = Tally::new(dir.path(), keys.clone(), 2);
        let body = "o\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n";
        let cp = note::sign(body, "o", &SigningKey::from_bytes(&[9; 32])).unwrap();
        let cosig = |i: usize| {
            let line = note::cosign_line(body, &format!("w{i}"), &sks[i], 7).unwrap();
            cosignatures::verified(&cp, &[line], &keys).unwrap()
        };
        assert!(!t.record(5, &cp, &cosig(0)).unwrap());
        // The same witness twice is one vote.
        assert!(!t.record(5, &cp, &cosig(0)).unwrap());
        assert_eq!(t.quorate(), None);
        assert!(t.record(5, &cp, &cosig(2)).unwrap());
        let (size, attached) = t.quorate().unwrap();
        assert_eq!(size, 5);
        let policy = crate::checkpoint::Policy {
            witnesses: keys,
            quorum: 2,
        };
        assert_eq!(
            policy
                .count_cosignatures(&note::parse(&attached).unwrap())
                .unwrap(),
            2
        );
        assert_eq!(t.quorum_height().load(Ordering::Acquire), 5);
        assert!(t.wait_quorate(5, Instant::now()));
        assert!(!t.wait_quorate(6, Instant::now()));
        let log = cosigned::read(dir.path()).unwrap();
        assert_eq!(log[&5].len(), 2);
    }
}
