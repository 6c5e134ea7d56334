//! Streaming a request's record as server-sent events in OpenAI's chunk format, from any point:
//! the start (first POST, reattach) or after a `Last-Event-ID`.
//!
//! Design: a tokio task per stream replays the registry record and then waits on its `watch`
//! (or the client going away); axum sends `: keep-alive` comments every 5 s meanwhile. Each
//! chunk's SSE `id` is the token index of its last token (one choice), or one index per choice
//! joined by commas (n > 1; -1: none yet), so a reconnect names exactly where it stopped. The
//! stream ends with `data: [DONE]`, or is cut without it when the server is shutting down (the
//! client retries with its id).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use tokio::sync::mpsc;

use super::params::Job;
use super::reader::ReaderGuard;
use super::registry::{Ending, Endpoint, Entry};
use super::render::{self, ChunkBody, Head};
use super::state::AppState;

/// Keep-alive comment interval.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Per-choice position: the index of the last token sent (-1: none yet).
pub type Cursor = Vec<i64>;

/// Parses `Last-Event-ID` for a request with `choices` choices (None: malformed).
pub fn parse_cursor(id: &str, choices: usize) -> Option<Cursor> {
    let v: Vec<i64> = id
        .split(',')
        .map(|p| p.trim().parse::<i64>().ok().filter(|&x| x >= -1))
        .collect::<Option<_>>()?;
    (v.len() == choices).then_some(v)
}

fn cursor_id(c: &Cursor) -> String {
    c.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The SSE response streaming `entry` after `cursor` (None: from the start, role chunks first).
pub fn respond(
    state: Arc<AppState>,
    entry: Arc<Entry>,
    job: Job,
    cursor: Option<Cursor>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(run(state, entry, job, cursor, tx));
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
        );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text(" keep-alive"))
}

async fn run(
    state: Arc<AppState>,
    entry: Arc<Entry>,
    job: Job,
    cursor: Option<Cursor>,
    tx: mpsc::Sender<Event>,
) {
    let _guard = ReaderGuard::new(entry.clone(), state.engine.clone());
    let codec = state.engine.codec().clone();
    let n = job.choices();
    let fresh = cursor.is_none();
    let mut cur: Cursor = cursor.unwrap_or_else(|| vec![-1; n]);
    let mut started = vec![!fresh; n];
    let mut finished = vec![false; n];
    let mut offsets = vec![0usize; n];
    let mut changed = entry.subscribe();
    let head_id = entry.id.clone();
    let model = state.info.model_name.clone();
    loop {
        changed.borrow_and_update();
        let mut events = Vec::new();
        let (all_done, lost) = {
            let data = entry.lock();
            let head = Head {
                id: &head_id,
                created: entry.created,
                model: &model,
            };
            for (i, c) in data.choices.iter().enumerate().take(n) {
                if !c.readable() || finished[i] {
                    continue;
                }
                if !started[i] {
                    started[i] = true;
                    let prompt = &job.prompts[i / job.n.max(1)].text;
                    if job.endpoint == Endpoint::Chat {
                        let v = render::chunk(
                            &head,
                            &job,
                            i,
                            ChunkBody::Role,
                            codec.as_ref(),
                            &mut offsets[i],
                        );
                        events.push(Event::default().data(v.to_string()));
                    } else if job.echo {
                        offsets[i] = prompt.chars().count();
                        let d = super::registry::Delta {
                            tokens: Vec::new(),
                            text: prompt.clone(),
                            logprobs: Vec::new(),
                            end: 0,
                        };
                        let v = render::chunk(
                            &head,
                            &job,
                            i,
                            ChunkBody::Delta(&d, prompt.clone(), &[]),
                            codec.as_ref(),
                            &mut 0,
                        );
                        events.push(Event::default().data(v.to_string()));
                    }
                }
                let mut start = 0usize;
                for d in &c.deltas {
                    let sent = (cur[i] + 1) as usize;
                    if d.end <= sent {
                        start = d.end;
                        continue;
                    }
                    let (text, lps) = if sent > start {
                        // The reconnect named a point inside this delta (after a resume).
                        let skip = sent - start;
                        let rest = d.tokens.get(skip..).unwrap_or(&[]);
                        (
                            codec.decode(rest).unwrap_or_default(),
                            d.logprobs.get(skip..).unwrap_or(&[]),
                        )
                    } else {
                        (d.text.clone(), &d.logprobs[..])
                    };
                    start = d.end;
                    cur[i] = d.end as i64 - 1;
                    let v = render::chunk(
                        &head,
                        &job,
                        i,
                        ChunkBody::Delta(d, text, lps),
                        codec.as_ref(),
                        &mut offsets[i],
                    );
                    events.push(Event::default().id(cursor_id(&cur)).data(v.to_string()));
                }
                if let Some(Ending::Done(_)) = &c.ending {
                    finished[i] = true;
                    let reason = render::reason_value(&c.ending);
                    let v = render::chunk(
                        &head,
                        &job,
                        i,
                        ChunkBody::Finish(reason),
                        codec.as_ref(),
                        &mut offsets[i],
                    );
                    events.push(Event::default().id(cursor_id(&cur)).data(v.to_string()));
                }
            }
            let all_done = finished.iter().all(|&f| f);
            if all_done && job.include_usage {
                let v = render::usage_chunk(&head, &job, &data);
                events.push(Event::default().data(v.to_string()));
            }
            let lost = data
                .choices
                .iter()
                .any(|c| matches!(c.ending, Some(Ending::Lost | Ending::Aborted)));
            (all_done, lost)
        };
        for e in events {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        if all_done {
            let _ = tx.send(Event::default().data("[DONE]")).await;
            return;
        }
        if lost {
            if state.engine.interrupted() {
                // Shutting down: cut the stream; the client retries with its id after a resume.
                return;
            }
            // Aborted by an earlier reader's disconnect while this one was attaching: go again
            // (same seed, same tokens); the cursor skips what this client already has.
            let (s, e) = (state.clone(), entry.clone());
            if super::worker::blocking(move || super::submit::restart_aborted(&s, &e))
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_parses_one_or_many_and_refuses_junk() {
        assert_eq!(parse_cursor("7", 1), Some(vec![7]));
        assert_eq!(parse_cursor("3,-1", 2), Some(vec![3, -1]));
        assert_eq!(parse_cursor("3", 2), None);
        assert_eq!(parse_cursor("x", 1), None);
        assert_eq!(parse_cursor("-2", 1), None);
        assert_eq!(cursor_id(&vec![3, -1]), "3,-1");
    }
}
