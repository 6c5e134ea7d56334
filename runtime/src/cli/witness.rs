//! `sov witness --key KEY --state DIR --log ORIGIN=VKEY_FILE [--host H] [--port P] [--name N]`:
//! a C2SP tlog-witness (<https://c2sp.org/tlog-witness>) serving `POST /add-checkpoint`.
//!
//! Design: the decision and the durable view are the store's [`Witness`] (one mutex around the
//! check-and-persist); this file is the HTTP edge only (axum, as `sov serve`): the body (at most
//! [`MAX_BODY`] bytes) goes to [`Witness::add_checkpoint`] on a blocking thread (it fsyncs), the
//! reply is 200 with the cosignature line, 409 with the witness's size as `text/x.tlog.size`, or
//! the status the spec gives each refusal (400, 403 bad signature, 404 unknown origin, 422 bad
//! proof). Logs are configured with `--log` (repeatable); an origin ending in `*` accepts every
//! origin with that prefix, so `--log 'sov.run/*=checkpoint.pub'` accepts every run signed by that
//! key (each run is its own log). On start it prints its verifier key (what a witness policy lists)
//! and its address, and writes the key to `DIR/witness.vkey`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::checkpoint::keys;
use crate::checkpoint::witness::AddError;
use crate::checkpoint::witness::logs::{LogKey, Logs};
use crate::checkpoint::witness::protocol::{ADD_CHECKPOINT_PATH, SIZE_CONTENT_TYPE, size_body};
use crate::checkpoint::witness::view::Witness;

/// Most bytes of an `add-checkpoint` body (63 proof lines and a checkpoint fit in a few KB).
pub const MAX_BODY: usize = 64 * 1024;

/// Arguments of `sov witness`.
#[derive(clap::Args, Debug, Clone)]
pub struct WitnessArgs {
    /// The witness's PKCS#8 PEM Ed25519 private key (e.g. from `sov keygen --out DIR`).
    #[arg(long)]
    pub key: PathBuf,
    /// Directory holding the witness's view of each log (created 0700).
    #[arg(long)]
    pub state: PathBuf,
    /// A log to witness: ORIGIN=VKEY_FILE (ORIGIN may end in `*`: a prefix). Repeatable.
    #[arg(long = "log", required = true, value_name = "ORIGIN=VKEY_FILE")]
    pub logs: Vec<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to bind (0: any free one; the address is printed).
    #[arg(long, default_value_t = 7380)]
    pub port: u16,
    /// The witness's key name in its cosignatures (a schema-less URL by convention).
    #[arg(long, default_value = "sov.witness/local")]
    pub name: String,
}

/// Runs `sov witness`.
pub fn run(args: WitnessArgs) -> anyhow::Result<ExitCode> {
    let shutdown = super::settings::shutdown_flag()?;
    let key = keys::load_private(&args.key)?;
    let logs = args
        .logs
        .iter()
        .map(|a| LogKey::from_arg(a))
        .collect::<Result<Vec<_>, _>>()?;
    let witness = Arc::new(
        Witness::open(&args.state, &args.name, key, Logs(logs))
            .with_context(|| format!("opening the witness state {}", args.state.display()))?,
    );
    let vkey = witness.verifier().to_text();
    let vkey_path = args.state.join("witness.vkey");
    std::fs::write(&vkey_path, format!("{vkey}\n"))
        .with_context(|| format!("writing {}", vkey_path.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sov-witness")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr().context("reading the bound address")?;
        println!("verifier key: {vkey}");
        println!("witness listening on http://{bound}");
        let app = axum::Router::new()
            .route(ADD_CHECKPOINT_PATH, post(add_checkpoint))
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(witness);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !shutdown.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .context("serving")?;
        Ok(ExitCode::SUCCESS)
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn add_checkpoint(State(w): State<Arc<Witness>>, body: Bytes) -> Response {
    let result = tokio::task::spawn_blocking(move || w.add_checkpoint(&body, unix_now())).await;
    match result {
        Ok(Ok(lines)) => (StatusCode::OK, lines).into_response(),
        Ok(Err(AddError::Conflict { size })) => (
            StatusCode::CONFLICT,
            [(header::CONTENT_TYPE, SIZE_CONTENT_TYPE)],
            size_body(size),
        )
            .into_response(),
        Ok(Err(e)) => {
            let status =
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if status.is_server_error() {
                tracing::error!("add-checkpoint: {e}");
            }
            (status, format!("{e}\n")).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
