//! A `sov serve` child process for the tests: default model on the CPU, port 0 (its address read
//! from stderr), state and config in a temporary directory, killed on drop. One runs at a time in
//! this test binary ([`Server::start`] holds a lock), so the tests do not fight over the CPU.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

const SOV: &str = env!("CARGO_BIN_EXE_sov");

static BUSY: AtomicBool = AtomicBool::new(false);

/// This test binary's one running server slot, released on drop (Send, unlike a mutex guard, so a
/// `Server` can be shared with spawned tasks).
struct Turn;

impl Turn {
    fn take() -> Turn {
        while BUSY
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// A running `sov serve`.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its run directory (slot file, checkpoints).
    pub run_dir: PathBuf,
    /// The API key it requires, if any.
    pub key: Option<String>,
    /// A client for it.
    pub http: reqwest::Client,
    stderr: Arc<Mutex<String>>,
    _home: tempfile::TempDir,
    _turn: Turn,
}

/// The default model's path in sov's cache, or None (with a printed reason: the caller skips).
pub fn default_model() -> Option<PathBuf> {
    let found = sov::app::SovDirs::from_process_env()
        .ok()
        .and_then(|d| sov::loader::cached_default_model(&d.cache));
    if found.is_none() {
        eprintln!("SKIP: SmolLM2-135M is not in sov's cache (run `sov generate --chat hi` once)");
    }
    found
}

impl Server {
    /// Starts `sov serve` on the default model with `extra` arguments; None when the model is not
    /// cached (the reason is printed).
    pub fn start(key: Option<&str>, extra: &[&str]) -> Option<Server> {
        let model = default_model()?;
        let turn = Turn::take();
        let home = tempfile::tempdir().expect("temp dir");
        let run_dir = home.path().join("run");
        let mut cmd = Command::new(SOV);
        cmd.arg("serve")
            .arg("--model")
            .arg(&model)
            .args(["--device", "cpu", "--port", "0", "--served-model-name"])
            .arg(MODEL)
            .arg("--run-dir")
            .arg(&run_dir)
            .args(extra)
            .env("SOV_STATE_DIR", home.path().join("state"))
            .env("SOV_CONFIG_DIR", home.path().join("config"))
            .env_remove("SOV_API_KEY")
            .env_remove("SOV_POWER_SUPPLY_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(k) = key {
            cmd.arg("--api-key").arg(k);
        }
        let mut child = cmd.spawn().expect("sov serve starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr"));
        let log = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while lines.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(addr) = line.trim().strip_prefix("sov: serving on ") {
                    let _ = tx.send(addr.to_string());
                }
                if let Ok(mut l) = log.lock() {
                    l.push_str(&line);
                }
                line.clear();
            }
        });
        let Ok(base) = rx.recv_timeout(Duration::from_secs(180)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sov serve never said where it serves; stderr:\n{}",
                stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        };
        Some(Server {
            child,
            base,
            run_dir,
            key: key.map(String::from),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(300))
                .build()
                .expect("client"),
            stderr,
            _home: home,
            _turn: turn,
        })
    }

    /// What the server printed on stderr so far (for failure messages).
    pub fn log(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the API key (when the server has one).
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// POST `body` as JSON; the status and the parsed body (Null when not JSON).
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let res = self
            .req(reqwest::Method::POST, path)
            .json(body)
            .send()
            .await
            .expect("request sent");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// POSTs a `/v1/completions` body of `len` bytes over a raw connection, reading the answer
    /// while still writing (a server that refuses by `Content-Length` answers and hangs up before
    /// taking the body, which an ordinary client reports as a send error); the status and the
    /// parsed body.
    pub async fn post_huge(&self, len: usize) -> (u16, Value) {
        let addr = self.base.trim_start_matches("http://").to_string();
        let auth = self
            .key
            .as_ref()
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n{auth}\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\
             Connection: close\r\n\r\n"
        );
        let answer = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .expect("timeout");
            let mut wr = stream.try_clone().expect("clone");
            std::thread::spawn(move || {
                let chunk = vec![b' '; 1 << 16];
                let mut left = len;
                let mut ok = wr.write_all(head.as_bytes()).is_ok();
                while ok && left > 0 {
                    let n = left.min(chunk.len());
                    ok = wr.write_all(&chunk[..n]).is_ok();
                    left -= n;
                }
            });
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
            answer
        })
        .await
        .expect("reader thread");
        let text = String::from_utf8_lossy(&answer);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b.trim()).ok())
            .unwrap_or(Value::Null);
        (status, body)
    }

    /// GET; the status and the body text.
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let res = self
            .req(reqwest::Method::GET, path)
            .send()
            .await
            .expect("request sent");
        (res.status().as_u16(), res.text().await.unwrap_or_default())
    }

    /// `/metrics`, parsed.
    pub async fn metrics(&self) -> super::prom::Scrape {
        let (status, text) = self.get_text("/metrics").await;
        assert_eq!(status, 200, "/metrics: {text}");
        super::prom::Scrape::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// Series `name` (with `labels`) once it reads `want`, or its value after 3 s. The server
    /// counts a request when its pump thread has seen the end, which may be just after the client
    /// has read the last byte, and engine counters are published after each engine step, so a
    /// scrape right after a response may lag by a moment.
    pub async fn settled(&self, name: &str, labels: &[(&str, &str)], want: f64) -> Option<f64> {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.metrics().await.value(name, labels);
            if v == Some(want) || t0.elapsed() > Duration::from_secs(3) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A streamed `/v1/completions`: the concatenated text of choice 0.
    pub async fn stream_completion(&self, body: &Value) -> String {
        let mut body = body.clone();
        body["stream"] = Value::Bool(true);
        let res = self
            .req(reqwest::Method::POST, "/v1/completions")
            .json(&body)
            .send()
            .await
            .expect("request sent");
        assert_eq!(res.status().as_u16(), 200, "stream refused");
        let mut text = String::new();
        let mut sse = Sse::default();
        let mut res = res;
        while let Some(chunk) = res.chunk().await.expect("stream reads") {
            for event in sse.feed(&chunk) {
                if event == "[DONE]" {
                    return text;
                }
                let v: Value = serde_json::from_str(&event).expect("event is JSON");
                if let Some(t) = v["choices"][0]["text"].as_str() {
                    text.push_str(t);
                }
            }
        }
        panic!("the stream ended without [DONE]; so far: {text:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The model id the test servers are started with.
pub const MODEL: &str = "smollm2";

/// A server-sent-events splitter: bytes in, the `data:` payloads of complete events out.
#[derive(Default)]
pub struct Sse {
    buf: Vec<u8>,
}

impl Sse {
    /// Feeds `bytes`; returns the data of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = find(&self.buf, b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
