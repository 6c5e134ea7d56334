//! The request registry: every request the server accepted, by its external id (`X-Request-Id` or
//! an assigned `cmpl-…`/`chatcmpl-…`), with each choice's output so far and how it ended.
//!
//! Design: an append-only record per choice (the engine's output events, in order) behind one
//! mutex per request, and a `watch` counter that moves on every change. Any number of readers (the
//! first POST, a reattaching POST, a `Last-Event-ID` reconnect, `GET /v1/requests/{id}`) replay the
//! record from any point and then wait on the counter, so a reattached client sees exactly what
//! the first one saw. Pump threads (one per engine request) are the only writers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::engine::output::Logprobs;

/// Which endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completion,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// What the server journals with each engine request (`Request.tag`), so a resumed server can
/// rebuild its registry: the external id, the choice index, when it was created, which endpoint,
/// and the original body (the response's shape depends on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tag {
    /// The external request id.
    pub id: String,
    /// Which choice of the request this engine request is.
    pub choice: usize,
    /// Choices in the request (prompts times `n`).
    pub choices: usize,
    /// Unix seconds of acceptance (the response's `created`).
    pub created: u64,
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The request body as received.
    pub body: serde_json::Value,
}

impl Tag {
    /// Serialized for `Request.tag`.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parsed from `Request.tag` bytes (None: not a server tag).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// One output event of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// New tokens.
    pub tokens: Vec<u32>,
    /// New text.
    pub text: String,
    /// Logprobs of the new tokens (when asked for).
    pub logprobs: Vec<Logprobs>,
    /// Tokens of this choice up to and including this event.
    pub end: usize,
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// Finished with this OpenAI finish reason (`stop`, `length`, `abort`, `error`).
    Done(String),
    /// Aborted because its client went away; a retry submits it again.
    Aborted,
    /// The engine stopped (shutdown) before it finished; a resumed server continues it.
    Lost,
}

/// One choice's record.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// The engine request id, when known.
    pub engine_id: Option<u64>,
    /// Tokens in this choice's prompt.
    pub prompt_tokens: usize,
    /// Output events in order.
    pub deltas: Vec<Delta>,
    /// Set when the choice ended.
    pub ending: Option<Ending>,
    /// Resumed mid-generation: the tokens from before the checkpoint are not in `deltas`; the
    /// whole output is known only when it finishes (then `deltas` is replaced by it).
    pub prefix_unknown: bool,
    /// The signed receipt of the finished output (`sov verify --response` checks it), once
    /// taken from the engine.
    pub receipt: Option<serde_json::Value>,
}

impl Choice {
    /// Tokens delivered so far.
    pub fn tokens(&self) -> usize {
        self.deltas.last().map_or(0, |d| d.end)
    }

    /// The whole text so far.
    pub fn text(&self) -> String {
        self.deltas.iter().map(|d| d.text.as_str()).collect()
    }

    /// Whether a reader can show what it has (finished, or streaming with a known prefix).
    pub fn readable(&self) -> bool {
        !self.prefix_unknown || self.ending.is_some()
    }
}

/// A request's mutable part.
#[derive(Debug, Default)]
pub struct EntryData {
    /// Per choice.
    pub choices: Vec<Choice>,
    /// Readers currently streaming this request (a disconnect with none left aborts it).
    pub readers: usize,
}

impl EntryData {
    /// True when every choice ended with a finish reason.
    pub fn done(&self) -> bool {
        self.choices
            .iter()
            .all(|c| matches!(c.ending, Some(Ending::Done(_))))
    }
}

/// One accepted request.
#[derive(Debug)]
pub struct Entry {
    /// External id.
    pub id: String,
    /// Endpoint it came in on.
    pub endpoint: Endpoint,
    /// Unix seconds of acceptance.
    pub created: u64,
    /// The body as received.
    pub body: serde_json::Value,
    data: Mutex<EntryData>,
    changed: watch::Sender<u64>,
}

impl Entry {
    /// A request with `choices` empty choices.
    pub fn new(
        id: String,
        endpoint: Endpoint,
        created: u64,
        body: serde_json::Value,
        choices: usize,
    ) -> Self {
        Entry {
            id,
            endpoint,
            created,
            body,
            data: Mutex::new(EntryData {
                choices: vec![Choice::default(); choices],
                readers: 0,
            }),
            changed: watch::channel(0).0,
        }
    }

    /// Locks the mutable part (a poisoned lock is taken over: the data stays consistent because
    /// every writer finishes its update before it could panic).
    pub fn lock(&self) -> MutexGuard<'_, EntryData> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` and wakes every reader.
    pub fn update(&self, f: impl FnOnce(&mut EntryData)) {
        f(&mut self.lock());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that changes with every update.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Every accepted request by external id, and engine ids back to (external id, choice).
#[derive(Debug, Default)]
pub struct Registry {
    by_id: Mutex<HashMap<String, Arc<Entry>>>,
    by_engine: Mutex<HashMap<u64, (String, usize)>>,
}

impl Registry {
    /// The request with this external id.
    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Inserts `entry` unless its id is taken; returns the entry now registered under the id and
    /// whether it is the one given.
    pub fn insert(&self, entry: Entry) -> (Arc<Entry>, bool) {
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get(&entry.id) {
            return (e.clone(), false);
        }
        let e = Arc::new(entry);
        map.insert(e.id.clone(), e.clone());
        (e, true)
    }

    /// Removes a request (its submission failed).
    pub fn remove(&self, id: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Records that engine request `engine_id` is choice `choice` of request `id`.
    pub fn link(&self, engine_id: u64, id: &str, choice: usize) {
        self.by_engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(engine_id, (id.to_string(), choice));
    }

    /// Calls `f` on every request.
    pub fn for_each(&self, mut f: impl FnMut(&Arc<Entry>)) {
        let entries: Vec<Arc<Entry>> = self
            .by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for e in &entries {
            f(e);
        }
    }

    /// Requests held.
    pub fn len(&self) -> usize {
        self.by_id.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when no request is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_round_trips_and_ids_are_unique() {
        let t = Tag {
            id: "abc".into(),
            choice: 1,
            choices: 2,
            created: 5,
            endpoint: Endpoint::Chat,
            body: serde_json::json!({"n": 2}),
        };
        assert_eq!(Tag::from_bytes(&t.to_bytes()), Some(t));
        assert_eq!(Tag::from_bytes(b"not json"), None);
        let r = Registry::default();
        let mk = || {
            Entry::new(
                "x".into(),
                Endpoint::Completion,
                0,
                serde_json::Value::Null,
                1,
            )
        };
        assert!(r.insert(mk()).1);
        assert!(!r.insert(mk()).1);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn updates_wake_readers_and_done_needs_every_choice() {
        let e = Entry::new(
            "x".into(),
            Endpoint::Completion,
            0,
            serde_json::Value::Null,
            2,
        );
        let rx = e.subscribe();
        e.update(|d| {
            d.choices[0].deltas.push(Delta {
                tokens: vec![1, 2],
                text: "ab".into(),
                logprobs: vec![],
                end: 2,
            });
            d.choices[0].ending = Some(Ending::Done("length".into()));
        });
        assert!(rx.has_changed().unwrap_or(false));
        assert!(!e.lock().done());
        e.update(|d| d.choices[1].ending = Some(Ending::Done("stop".into())));
        assert!(e.lock().done());
        assert_eq!(e.lock().choices[0].text(), "ab");
        assert_eq!(e.lock().choices[0].tokens(), 2);
    }
}
