//! Settings every subcommand shares, read once at the edge: sov's directories and the log filter,
//! each a flag with an environment fallback (`SOV_CACHE_DIR`, `SOV_STATE_DIR`, `SOV_CONFIG_DIR`,
//! `SOV_LOG`), turned into the typed [`SovDirs`] the layers below are given; and the SIGINT/SIGTERM
//! flag the long-running commands (`generate`, `serve`) checkpoint and stop on.
//!
//! Design: clap's `env` fallback, so `--help` shows each variable next to its flag; the XDG
//! fallbacks are resolved by [`SovDirs::from_env`], the only other reader of the environment.

use std::path::PathBuf;

use anyhow::Context;

use crate::app::{DirOverrides, SovDirs};

/// Flags accepted by every subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct GlobalArgs {
    /// sov's cache directory, where downloaded models live (default: $XDG_CACHE_HOME/sov, else
    /// ~/.cache/sov).
    #[arg(long, global = true, env = "SOV_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// sov's state directory, where run directories live (default: $XDG_STATE_HOME/sov, else
    /// ~/.local/state/sov).
    #[arg(long, global = true, env = "SOV_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// sov's config directory, where its default signing key lives (default:
    /// $XDG_CONFIG_HOME/sov, else ~/.config/sov).
    #[arg(long, global = true, env = "SOV_CONFIG_DIR", value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// Log filter in `tracing` env-filter syntax, e.g. `info` or `sov=debug` (logs go to stderr).
    #[arg(
        long,
        global = true,
        env = "SOV_LOG",
        default_value = "warn",
        value_name = "FILTER"
    )]
    pub log: String,
}

impl GlobalArgs {
    /// The directories these flags (and the XDG rules) name.
    pub fn dirs(&self) -> anyhow::Result<SovDirs> {
        SovDirs::from_env(DirOverrides {
            cache: self.cache_dir.clone(),
            state: self.state_dir.clone(),
            config: self.config_dir.clone(),
        })
        .context("resolving sov's directories")
    }

    /// Installs the stderr logger with the `--log` filter.
    pub fn init_logging(&self) -> anyhow::Result<()> {
        let filter = tracing_subscriber::EnvFilter::try_new(&self.log)
            .with_context(|| format!("--log {:?}: not a log filter", self.log))?;
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
        Ok(())
    }
}

/// SIGINT and SIGTERM raise the returned flag; a second one exits at once.
pub fn shutdown_flag() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for (sig, code) in [(SIGINT, 130), (SIGTERM, 143)] {
        signal_hook::flag::register_conditional_shutdown(sig, code, flag.clone())
            .context("installing the signal handler")?;
        signal_hook::flag::register(sig, flag.clone()).context("installing the signal handler")?;
    }
    Ok(flag)
}
