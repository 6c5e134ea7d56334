//! `sov serve`: load a model, start one engine (checkpoints on by default, as `generate`) and
//! serve the OpenAI-compatible HTTP API on it (see [`crate::serve`]). SIGINT/SIGTERM stop taking
//! requests (503), let the engine checkpoint, close the connections and exit 0;
//! `--resume RUN_DIR` rebuilds the request registry from the journal and continues every
//! unfinished request.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use super::model_args::{ModelArgs, StartExtras};
use crate::app::SovDirs;
use crate::app::start::Started;
use crate::serve::metrics::ServerMetrics;
use crate::serve::registry::Registry;
use crate::serve::router::{self, DEFAULT_MAX_BODY};
use crate::serve::{AppState, Phase, PhaseKind, ServerInfo};

/// Arguments of `sov serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Which model to load and how.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to bind (0: any free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "SOV_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Continue the run in this run directory: every unfinished request goes on, and clients
    /// retrying with their request ids get their outputs.
    #[arg(long, conflicts_with = "run_dir")]
    pub resume: Option<PathBuf>,
    /// The model id clients name (default: the model's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most bytes of a request body (larger: 413).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,
    /// Most requests waiting for the engine; more get 429 (default: unbounded).
    #[arg(long)]
    pub max_waiting: Option<usize>,
    /// Witnesses cosigning the run's signed heads.
    #[command(flatten)]
    pub witnesses: super::witness_flags::WitnessFlags,
}

/// Runs `sov serve`.
pub fn run(args: ServeArgs, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    let shutdown = super::settings::shutdown_flag()?;
    let started = args.model.start_with(
        dirs,
        StartExtras {
            trace: false,
            resume: args.resume.clone(),
            shutdown: Some(shutdown.clone()),
            checkpoint_by_default: true,
            ephemeral: false,
            witnesses: args.witnesses.config()?,
            deterministic_order: crate::app::run_platform::resume_order(args.resume.as_deref())?,
            kv_e4m3: crate::app::run_platform::resume_kv_e4m3(args.resume.as_deref())?,
        },
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sov-serve")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve(args, started, shutdown))
}

async fn serve(
    args: ServeArgs,
    started: Started,
    shutdown: Arc<AtomicBool>,
) -> anyhow::Result<ExitCode> {
    let Started {
        engine,
        chat_template,
        checkpoints,
        battery: _battery,
        ..
    } = started;
    let engine = Arc::new(engine);
    let info = ServerInfo {
        model_name: args
            .served_model_name
            .clone()
            .or_else(|| args.model.model.clone())
            .unwrap_or_else(|| crate::loader::DEFAULT_MODEL.to_string()),
        context_len: engine.limits().context_len,
        created: crate::serve::submit::unix_now(),
        chat_template,
        max_waiting: args.max_waiting,
    };
    let metrics = Arc::new(ServerMetrics::default());
    let state = Arc::new(AppState {
        engine: engine.clone(),
        registry: Arc::new(Registry::default()),
        info,
        api_key: args.api_key.clone(),
        phase: Arc::new(Phase::new(PhaseKind::Loading)),
        metrics,
        receipts: checkpoints.as_ref().map(|c| c.book.clone()),
        witnesses: checkpoints.as_ref().and_then(|c| c.witnesses.clone()),
    });
    if args.resume.is_some() {
        let c = checkpoints.as_ref().context("--resume needs checkpoints")?;
        crate::serve::resume::rebuild(&state, &c.book)
            .context("rebuilding the request registry")?;
    }
    let addr = SocketAddr::new(args.host, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr().context("reading the bound address")?;
    state.phase.set(PhaseKind::Ready);
    if let Some(c) = &checkpoints {
        eprintln!(
            "sov: requests are journaled in {}; after a crash continue with `sov serve --resume {}`",
            c.dir.display(),
            c.dir.parent().unwrap_or(&c.dir).display()
        );
    }
    if args.model.device() != crate::app::start::Device::Cpu {
        eprintln!(
            "sov: note: on a GPU a request's tokens can depend on which requests share its batch \
             (the kernels are not batch-invariant yet), so a retried or resumed request may differ \
             from an uninterrupted run; on the CPU it is exact"
        );
    }
    eprintln!("sov: serving on http://{bound}");
    let app = router::build(state.clone(), args.max_body_bytes);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(watch_shutdown(state.clone(), shutdown, stop_tx));
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_rx.await;
    });
    server.await.context("serving")?;
    watcher.abort();
    let interrupted = engine.interrupted();
    drop(state);
    if interrupted {
        eprintln!(
            "sov: interrupted: checkpoint height {}; continue with `sov serve --resume RUN_DIR` and the same model options",
            engine.slots().bft_quorum_height()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// On SIGINT/SIGTERM: refuse new requests, wait for the engine's checkpoint, then stop the server
/// (open streams are cut when their requests' channels close).
async fn watch_shutdown(
    state: Arc<AppState>,
    flag: Arc<AtomicBool>,
    stop: tokio::sync::oneshot::Sender<()>,
) {
    while !flag.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    state.phase.set(PhaseKind::Draining);
    tracing::info!("shutting down: waiting for the engine's checkpoint");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !state.engine.interrupted() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
}
