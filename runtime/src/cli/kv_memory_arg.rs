//! `--kv-memory-mb`: the KV cache's size in MiB, or `auto` (a share of the GPU memory left free
//! once the model and its scratch are loaded, [`KvBudget::FreeDeviceMemory`]).
//!
//! Design: parsed once into a typed value (clap calls [`FromStr`]); [`KvMemoryArg::budget`] turns
//! it into the engine's [`KvBudget`], so no command converts MiB itself.

use std::fmt;
use std::str::FromStr;

use crate::app::start::{KV_AUTO_FRACTION, KvBudget};

/// The value of `--kv-memory-mb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvMemoryArg {
    /// This many MiB.
    Mib(usize),
    /// [`KV_AUTO_FRACTION`] of the device memory free after loading (GPUs only).
    Auto,
}

impl KvMemoryArg {
    /// The engine's budget for this value.
    pub fn budget(self) -> KvBudget {
        match self {
            // `from_str` refused sizes whose bytes overflow.
            KvMemoryArg::Mib(mib) => KvBudget::Bytes(mib << 20),
            KvMemoryArg::Auto => KvBudget::FreeDeviceMemory(KV_AUTO_FRACTION),
        }
    }
}

impl FromStr for KvMemoryArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(KvMemoryArg::Auto);
        }
        let mib: usize = s
            .parse()
            .map_err(|_| format!("expected a size in MiB or `auto`, got `{s}`"))?;
        if mib == 0 {
            return Err("the KV cache needs at least 1 MiB".into());
        }
        if mib.checked_mul(1 << 20).is_none() {
            return Err(format!(
                "{mib} MiB is more bytes than this machine can address"
            ));
        }
        Ok(KvMemoryArg::Mib(mib))
    }
}

impl fmt::Display for KvMemoryArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvMemoryArg::Mib(mib) => write!(f, "{mib}"),
            KvMemoryArg::Auto => f.write_str("auto"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_auto_and_refuses_the_rest() {
        assert_eq!("1024".parse(), Ok(KvMemoryArg::Mib(1024)));
        assert_eq!(" auto ".parse(), Ok(KvMemoryArg::Auto));
        assert_eq!("AUTO".parse(), Ok(KvMemoryArg::Auto));
        for bad in ["", "0", "-5", "1.5", "12gb", "autox"] {
            assert!(bad.parse::<KvMemoryArg>().is_err(), "{bad:?} accepted");
        }
        let huge = (usize::MAX >> 19).to_string();
        assert!(huge.parse::<KvMemoryArg>().is_err());
        assert_eq!(KvMemoryArg::Mib(3).budget(), KvBudget::Bytes(3 << 20));
        assert_eq!(
            KvMemoryArg::Auto.budget(),
            KvBudget::FreeDeviceMemory(KV_AUTO_FRACTION)
        );
        assert_eq!(KvMemoryArg::Auto.to_string(), "auto");
        assert_eq!(KvMemoryArg::Mib(64).to_string(), "64");
    }
}
