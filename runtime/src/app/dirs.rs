//! sov's three directories, resolved once at start-up and passed down: the cache (downloaded
//! models), the state directory (run directories, the `current-run` pointer) and the config
//! directory (the default signing key).
//!
//! Design: the XDG base-directory rules. Each directory is its explicit override when given (the
//! command line's `--cache-dir`, `--state-dir`, `--config-dir`, which fall back to `SOV_CACHE_DIR`,
//! `SOV_STATE_DIR`, `SOV_CONFIG_DIR`), else `$XDG_*_HOME/sov`, else the XDG default under `$HOME`.
//! [`SovDirs::resolve`] is pure (it is given the environment); [`SovDirs::from_env`] is the one
//! place that reads the process environment for it. Nothing below the application layer reads
//! these variables.

use std::ffi::OsString;
use std::path::PathBuf;

/// Directories given explicitly (flags or `SOV_*_DIR`); `None`: use the XDG default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirOverrides {
    /// Downloaded models (`SOV_CACHE_DIR`).
    pub cache: Option<PathBuf>,
    /// Run directories (`SOV_STATE_DIR`).
    pub state: Option<PathBuf>,
    /// The default signing key (`SOV_CONFIG_DIR`).
    pub config: Option<PathBuf>,
}

impl DirOverrides {
    /// The overrides from `SOV_CACHE_DIR`, `SOV_STATE_DIR` and `SOV_CONFIG_DIR` (empty values are
    /// unset), for callers without a command line (tests, library users).
    pub fn from_env() -> Self {
        let get = |name: &str| non_empty(std::env::var_os(name)).map(PathBuf::from);
        Self {
            cache: get("SOV_CACHE_DIR"),
            state: get("SOV_STATE_DIR"),
            config: get("SOV_CONFIG_DIR"),
        }
    }
}

/// sov's directories (none is created here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SovDirs {
    /// Downloaded models: `$XDG_CACHE_HOME/sov`, else `~/.cache/sov`.
    pub cache: PathBuf,
    /// Run directories: `$XDG_STATE_HOME/sov`, else `~/.local/state/sov`.
    pub state: PathBuf,
    /// The default signing key: `$XDG_CONFIG_HOME/sov`, else `~/.config/sov`.
    pub config: PathBuf,
}

/// No home to put a directory under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no {which} directory: HOME is not set; pass --{which}-dir or set SOV_{upper}_DIR")]
pub struct NoHome {
    which: &'static str,
    upper: &'static str,
}

fn non_empty(v: Option<OsString>) -> Option<OsString> {
    v.filter(|v| !v.is_empty())
}

impl SovDirs {
    /// Each directory from `overrides`, else from `env` (`XDG_*_HOME`, `HOME`).
    pub fn resolve(
        overrides: DirOverrides,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, NoHome> {
        let var = |name: &str| non_empty(env(name)).map(PathBuf::from);
        let home = var("HOME");
        let pick = |given: Option<PathBuf>,
                    xdg: &str,
                    under_home: &str,
                    which: &'static str,
                    upper: &'static str| {
            if let Some(d) = given {
                return Ok(d);
            }
            if let Some(d) = var(xdg) {
                return Ok(d.join("sov"));
            }
            home.as_ref()
                .map(|h| h.join(under_home).join("sov"))
                .ok_or(NoHome { which, upper })
        };
        Ok(Self {
            cache: pick(
                overrides.cache,
                "XDG_CACHE_HOME",
                ".cache",
                "cache",
                "CACHE",
            )?,
            state: pick(
                overrides.state,
                "XDG_STATE_HOME",
                ".local/state",
                "state",
                "STATE",
            )?,
            config: pick(
                overrides.config,
                "XDG_CONFIG_HOME",
                ".config",
                "config",
                "CONFIG",
            )?,
        })
    }

    /// [`Self::resolve`] against the process environment.
    pub fn from_env(overrides: DirOverrides) -> Result<Self, NoHome> {
        Self::resolve(overrides, |name| std::env::var_os(name))
    }

    /// The directories a process without a command line uses (tests, library users): the
    /// `SOV_*_DIR` overrides, then the XDG rules, all from the process environment.
    pub fn from_process_env() -> Result<Self, NoHome> {
        Self::from_env(DirOverrides::from_env())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.into())
    }

    #[test]
    fn overrides_then_xdg_then_home() {
        let given = DirOverrides {
            cache: Some("/c".into()),
            state: None,
            config: None,
        };
        let d = SovDirs::resolve(given, env(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")])).unwrap();
        assert_eq!(d.cache, PathBuf::from("/c"));
        assert_eq!(d.state, PathBuf::from("/x/sov"));
        assert_eq!(d.config, PathBuf::from("/h/.config/sov"));
        let d = SovDirs::resolve(DirOverrides::default(), env(&[("HOME", "/h")])).unwrap();
        assert_eq!(d.cache, PathBuf::from("/h/.cache/sov"));
        assert_eq!(d.state, PathBuf::from("/h/.local/state/sov"));
    }

    #[test]
    fn empty_values_are_unset_and_no_home_is_a_clear_error() {
        let err = SovDirs::resolve(
            DirOverrides::default(),
            env(&[("XDG_CACHE_HOME", ""), ("HOME", "")]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no cache directory: HOME is not set; pass --cache-dir or set SOV_CACHE_DIR"
        );
    }
}
