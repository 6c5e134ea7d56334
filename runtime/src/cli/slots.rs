//! `sov slots get [NAME]` and `sov slots set NAME VALUE`: read and steer a running engine through
//! its slot file (the live control surface). Without `--run`/`--file` the newest run
//! directory (sov's state directory, `current-run`) is used.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::app::SovDirs;
use crate::app::run_dir::{current_run_dir, slot_path};
use crate::app::slot_file::open_slots;
use crate::scheduler::{SLOT_FIELDS, SlotWriter};

/// `sov slots ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SlotsCommand {
    /// Print one field, or every field with its offset.
    Get {
        /// Field to print (default: every field).
        name: Option<String>,
        /// Which engine's slots.
        #[command(flatten)]
        target: Target,
    },
    /// Write a field (numbers in decimal or 0x hex, enum variants by name, bytes as hex). The
    /// engine reads it at its next step.
    Set {
        /// Field to write.
        name: String,
        /// The new value.
        value: String,
        /// Which engine's slots.
        #[command(flatten)]
        target: Target,
    },
}

/// Which engine's slots.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Run directory of the engine (default: the newest run).
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// The slot file itself.
    #[arg(long, conflicts_with = "run")]
    pub file: Option<PathBuf>,
}

impl Target {
    fn path(&self, dirs: &SovDirs) -> anyhow::Result<PathBuf> {
        Ok(match (&self.file, &self.run) {
            (Some(f), _) => f.clone(),
            (None, Some(r)) => slot_path(r),
            (None, None) => slot_path(&current_run_dir(&dirs.state)?),
        })
    }
}

/// Runs a `sov slots` subcommand.
pub fn run(cmd: SlotsCommand, dirs: &SovDirs) -> anyhow::Result<ExitCode> {
    match cmd {
        SlotsCommand::Get { name, target } => {
            let slots = open_slots(&target.path(dirs)?)?;
            match name {
                Some(n) => println!(
                    "{}",
                    slots.get_by_name(&n).map_err(|e| anyhow::anyhow!("{e}"))?
                ),
                None => {
                    for f in SLOT_FIELDS {
                        let value = slots.get_by_name(f.name).unwrap_or_default();
                        println!("{:>2} {:<24} {}", f.offset, f.name, value);
                    }
                }
            }
        }
        SlotsCommand::Set {
            name,
            value,
            target,
        } => {
            let slots = open_slots(&target.path(dirs)?)?;
            if let Some(f) = SLOT_FIELDS.iter().find(|f| f.name == name)
                && f.writer == SlotWriter::Runtime
                && name != "speculative_draft_len"
            {
                eprintln!("sov: note: the engine rewrites `{name}` itself; the value may not stay");
            }
            slots
                .set_by_name(&name, &value)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{name} = {}", slots.get_by_name(&name).unwrap_or_default());
        }
    }
    Ok(ExitCode::SUCCESS)
}
