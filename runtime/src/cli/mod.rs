//! Command-line subcommands of the `sov` binary.
