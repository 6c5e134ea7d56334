//! The scheduler generated from `specs/runtime.toml` and the machines written against it.
