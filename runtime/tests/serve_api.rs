//! `sov serve` end to end on the default model (CPU): completions and chat, streaming and not,
//! usage, stop strings, n > 1, seeded reproducibility, logprobs, reattach by `X-Request-Id`,
//! `Last-Event-ID`, and requests that survive SIGKILL and SIGTERM (`--resume`): a client retrying
//! by id reads exactly what an uninterrupted server sends.
//!
//! The client is a few lines of HTTP/1.1 over `TcpStream` (no async runtime in the tests). Skips,
//! printing why, when the default model is not in sov's cache.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::sov_process::sov;
use serde_json::{Value, json};

fn default_model_cached() -> bool {
    let cache = std::env::var_os("SOV_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("sov")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sov")));
    let found = cache
        .as_ref()
        .is_some_and(|c| c.join("SmolLM2-135M-Instruct.Q4_1.gguf").is_file());
    if !found {
        eprintln!(
            "SKIPPED: the default model is not in sov's cache ({cache:?}); CI fetches it first"
        );
    }
    found
}

fn cache_dir() -> PathBuf {
    std::env::var_os("SOV_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("sov")))
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/sov"))
}

/// A running `sov serve`.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(home: &Path, extra: &[&str]) -> Server {
        let mut cmd = sov(home);
        cmd.env("SOV_CACHE_DIR", cache_dir())
            .args([
                "serve",
                "--device",
                "cpu",
                "--port",
                "0",
                "--kv-memory-mb",
                "64",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Owned by the Server at once: its Drop kills and reaps the process on every path.
        let mut server = Server {
            child: cmd.spawn().expect("sov serve starts"),
            addr: String::new(),
        };
        let mut stderr = BufReader::new(server.child.stderr.take().unwrap());
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline && stderr.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(rest) = line.trim().split("serving on http://").nth(1) {
                server.addr = rest.to_string();
                std::thread::spawn(move || {
                    let mut sink = String::new();
                    while stderr.read_line(&mut sink).unwrap_or(0) > 0 {
                        if std::env::var_os("SOV_TEST_SERVER_LOG").is_some() {
                            eprint!("server: {sink}");
                        }
                        sink.clear();
                    }
                });
                return server;
            }
            eprint!("server: {line}");
            line.clear();
        }
        panic!("sov serve never printed its address");
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn sigterm(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "sov serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, headers (lowercase names), body.
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Reads a chunked body as plain bytes.
struct Chunked<R: BufRead> {
    r: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.r.read_line(&mut line)?;
            if line.trim().is_empty() {
                line.clear();
                self.r.read_line(&mut line)?;
            }
            let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let n = buf.len().min(self.left);
        let n = self.r.read(&mut buf[..n])?;
        if n == 0 {
            self.done = true;
        }
        self.left -= n;
        Ok(n)
    }
}

fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, Box<dyn BufRead>) {
    let mut s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut hs = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            hs.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let chunked = hs
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked {
            r,
            left: 0,
            done: false,
        }))
    } else {
        Box::new(r)
    };
    (status, hs, body)
}

fn call(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let (status, headers, mut r) = send(addr, method, path, headers, body);
    let mut body = String::new();
    let _ = r.read_to_string(&mut body);
    Resp {
        status,
        headers,
        body,
    }
}

fn post(addr: &str, path: &str, body: &Value) -> Resp {
    call(addr, "POST", path, &[], &body.to_string())
}

/// An SSE stream being read.
struct Events {
    r: Box<dyn BufRead>,
    headers: Vec<(String, String)>,
    status: u16,
}

/// One SSE event: its id and data.
#[derive(Debug, Clone)]
struct Ev {
    id: Option<String>,
    data: String,
}

impl Events {
    fn open(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Events {
        let (status, headers, r) = send(addr, method, path, headers, body);
        Events { r, headers, status }
    }

    /// The next event (None: the stream ended).
    fn next(&mut self) -> Option<Ev> {
        let mut id = None;
        let mut data = None;
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if let Some(data) = data.take() {
                    return Some(Ev { id, data });
                }
                continue;
            }
            if let Some(v) = l.strip_prefix("data:") {
                data = Some(v.trim_start().to_string());
            } else if let Some(v) = l.strip_prefix("id:") {
                id = Some(v.trim_start().to_string());
            }
        }
    }

    /// Every remaining event up to `[DONE]` (true if it came).
    fn rest(&mut self) -> (Vec<Ev>, bool) {
        let mut out = Vec::new();
        while let Some(e) = self.next() {
            if e.data == "[DONE]" {
                return (out, true);
            }
            out.push(e);
        }
        (out, false)
    }
}

/// Concatenated text of chunks (`text` or `delta.content`) for choice `index`.
fn text_of(events: &[Ev], index: u64) -> String {
    let mut s = String::new();
    for e in events {
        let v: Value = serde_json::from_str(&e.data).unwrap();
        for c in v["choices"].as_array().unwrap() {
            if c["index"].as_u64() == Some(index) {
                s.push_str(
                    c["text"]
                        .as_str()
                        .or(c["delta"]["content"].as_str())
                        .unwrap_or(""),
                );
            }
        }
    }
    s
}

fn completion(prompt: &str, max_tokens: u64) -> Value {
    json!({"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

#[test]
fn completions_chat_streaming_and_reattach() {
    if !default_model_cached() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let run = home.path().join("run");
    let srv = Server::start(home.path(), &["--run-dir", run.to_str().unwrap()]);
    let a = srv.addr.as_str();

    // Non-streaming completion: shape, usage, length.
    let r = post(
        a,
        "/v1/completions",
        &completion("The capital of France is", 12),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        prompt_tokens + 12
    );
    assert!(r.header("x-request-id").unwrap().starts_with("cmpl-"));

    // Streaming gives the same text, chunk by chunk, usage in a last chunk with empty choices.
    let mut body = completion("The capital of France is", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut ev = Events::open(a, "POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(ev.status, 200);
    let (events, done) = ev.rest();
    assert!(done, "stream ends with [DONE]");
    assert_eq!(text_of(&events, 0), text);
    let last: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"]["completion_tokens"], 12);

    // Stop strings: the output ends before the stop string, reason stop.
    let stop_at: String = text.chars().skip(3).take(3).collect();
    let mut body = completion("The capital of France is", 12);
    body["stop"] = json!([stop_at]);
    let v = post(a, "/v1/completions", &body).json();
    let stopped = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(stopped) && !stopped.contains(&stop_at),
        "{stopped:?} vs {text:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Chat, non-streaming and streaming (role delta first).
    let chat = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
                      "max_tokens": 10, "temperature": 0});
    let r = post(a, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let chat_text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let mut sbody = chat.clone();
    sbody["stream"] = json!(true);
    let (events, done) =
        Events::open(a, "POST", "/v1/chat/completions", &[], &sbody.to_string()).rest();
    assert!(done);
    let first: Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(text_of(&events, 0), chat_text);

    // n > 1 with a seed: n choices, reproducible per seed; choice i uses seed + i.
    let seeded = json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1.0,
                        "seed": 7, "n": 2});
    let v1 = post(a, "/v1/completions", &seeded).json();
    let v2 = post(a, "/v1/completions", &seeded).json();
    assert_eq!(v1["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v1["choices"][1]["index"], 1);
    assert_eq!(v1["choices"], v2["choices"], "same seed, same choices");
    let one =
        json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1.0, "seed": 8});
    let v3 = post(a, "/v1/completions", &one).json();
    assert_eq!(
        v3["choices"][0]["text"], v1["choices"][1]["text"],
        "choice 1 = seed + 1"
    );

    // Logprobs: completions' shape (greedy: the chosen token is the top one).
    let mut body = completion("The capital of France is", 5);
    body["logprobs"] = json!(2);
    let v = post(a, "/v1/completions", &body).json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let chosen = lp["token_logprobs"][0].as_f64().unwrap();
    let best = lp["top_logprobs"][0]
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_f64)
        .fold(f64::MIN, f64::max);
    assert!(chosen <= 0.0 && (chosen - best).abs() < 1e-4, "{lp}");
    assert_eq!(
        lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        v["choices"][0]["text"].as_str().unwrap()
    );
    // Chat's shape.
    let mut body = chat.clone();
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let v = post(a, "/v1/chat/completions", &body).json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    assert!(content[0]["bytes"].is_array());

    // Reattach by X-Request-Id: same text, no second generation (the status shows one request).
    let mut body = completion("Reattach me:", 16);
    body["stream"] = json!(true);
    let hdr = [("X-Request-Id", "my-req-1")];
    let mut ev = Events::open(a, "POST", "/v1/completions", &hdr, &body.to_string());
    assert_eq!(
        ev.headers
            .iter()
            .find(|(k, _)| k == "x-request-id")
            .map(|(_, v)| v.as_str()),
        Some("my-req-1")
    );
    let mut head = Vec::new();
    for _ in 0..3 {
        head.push(ev.next().unwrap());
    }
    drop(ev);
    let cut = head.last().unwrap().id.clone().unwrap();
    // Last-Event-ID: continue after the last event seen.
    let (tail, done) = Events::open(
        a,
        "GET",
        "/v1/requests/my-req-1",
        &[("Last-Event-ID", &cut)],
        "",
    )
    .rest();
    assert!(done);
    let (whole, done) = Events::open(a, "POST", "/v1/completions", &hdr, &body.to_string()).rest();
    assert!(done);
    let whole_text = text_of(&whole, 0);
    assert_eq!(
        format!("{}{}", text_of(&head, 0), text_of(&tail, 0)),
        whole_text
    );
    let mut plain = completion("Reattach me:", 16);
    plain["stream"] = json!(false);
    let v = call(a, "POST", "/v1/completions", &hdr, &plain.to_string()).json();
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), whole_text);
    assert_eq!(v["id"], "my-req-1");
    let alone = post(a, "/v1/completions", &completion("Reattach me:", 16)).json();
    assert_eq!(
        alone["choices"][0]["text"].as_str().unwrap(),
        whole_text,
        "uninterrupted text"
    );
    let st = call(a, "GET", "/v1/requests/my-req-1", &[], "").json();
    assert_eq!(st["status"], "finished");
    assert_eq!(st["choices"][0]["text"].as_str().unwrap(), whole_text);
    // The signed receipt of the delivered output: its leaf is in the run's log.
    let receipt = &st["choices"][0]["receipt"];
    assert!(receipt["leaf_index"].is_u64(), "{st}");
    assert!(
        receipt["head"]
            .as_str()
            .is_some_and(|h| h.contains("sov.run/")),
        "{st}"
    );
    assert_eq!(call(a, "GET", "/v1/requests/nope", &[], "").status, 404);

    // Errors in OpenAI's shape.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "other", "prompt": "x"}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "x", "temperature": 3}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "temperature");
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": "many"}),
    );
    assert_eq!(r.status, 422);
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 100000000}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("This model's maximum context length is")
    );
    let r = call(a, "POST", "/v1/completions", &[], "{not json");
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"].is_string());
    srv.kill();
}

/// Streams of `ids` (greedy and seeded), read to the end on `addr`; text per id.
fn bodies() -> Vec<(&'static str, Value)> {
    vec![
        (
            "crash-a",
            json!({"prompt": "The history of Rome", "max_tokens": 32, "temperature": 0, "stream": true}),
        ),
        (
            "crash-b",
            json!({"messages": [{"role": "user", "content": "Tell me about cats."}], "max_tokens": 32,
                           "temperature": 0.8, "seed": 3, "stream": true}),
        ),
        (
            "crash-c",
            json!({"prompt": "1, 2, 3,", "max_tokens": 24, "temperature": 0.7, "top_p": 0.9, "seed": 11,
                           "stream": true}),
        ),
    ]
}

fn path_of(body: &Value) -> &'static str {
    if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    }
}

/// Opens every stream of [`bodies`] at once (as the interrupted run does), reads them to the end.
fn full_texts(addr: &str) -> Vec<String> {
    let mut open: Vec<Events> = bodies()
        .iter()
        .map(|(id, b)| {
            Events::open(
                addr,
                "POST",
                path_of(b),
                &[("X-Request-Id", id)],
                &b.to_string(),
            )
        })
        .collect();
    open.iter_mut()
        .map(|e| {
            let (ev, done) = e.rest();
            assert!(done, "stream ends with [DONE]");
            text_of(&ev, 0)
        })
        .collect()
}

fn interrupted_then_resumed(kill: fn(Server)) {
    let home = tempfile::tempdir().unwrap();
    // The uninterrupted reference.
    let reference = {
        let run = home.path().join("ref");
        let srv = Server::start(home.path(), &["--run-dir", run.to_str().unwrap()]);
        let t = full_texts(&srv.addr);
        srv.kill();
        t
    };
    let run = home.path().join("run");
    let srv = Server::start(home.path(), &["--run-dir", run.to_str().unwrap()]);
    let mut open: Vec<Events> = bodies()
        .iter()
        .map(|(id, b)| {
            Events::open(
                &srv.addr,
                "POST",
                path_of(b),
                &[("X-Request-Id", id)],
                &b.to_string(),
            )
        })
        .collect();
    for e in &mut open {
        for _ in 0..3 {
            e.next();
        }
    }
    kill(srv);
    drop(open);
    let srv = Server::start(home.path(), &["--resume", run.to_str().unwrap()]);
    for (id, _) in bodies() {
        let st = call(&srv.addr, "GET", &format!("/v1/requests/{id}"), &[], "");
        assert_eq!(
            st.status, 200,
            "{id} is known after the resume: {}",
            st.body
        );
    }
    let resumed = full_texts(&srv.addr);
    assert_eq!(resumed, reference);
    srv.kill();
}

#[test]
fn requests_survive_sigkill() {
    if !default_model_cached() {
        return;
    }
    interrupted_then_resumed(Server::kill);
}

#[test]
fn requests_survive_sigterm() {
    if !default_model_cached() {
        return;
    }
    interrupted_then_resumed(|s| {
        let status = s.sigterm();
        assert!(status.success(), "SIGTERM exits 0: {status:?}");
    });
}
