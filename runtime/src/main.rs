//! The `sov` command-line tool; see [`sov::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    sov::cli::main_entry()
}
