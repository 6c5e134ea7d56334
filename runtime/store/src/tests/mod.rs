//! Whole-directory tests of the checkpoint store: tampering, torn writes, a micro-benchmark.

mod bench;
mod tamper;
mod torn;
