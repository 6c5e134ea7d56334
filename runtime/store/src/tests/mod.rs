//! Whole-directory tests of the checkpoint store: tampering, forgeries of the log, torn writes,
//! response receipts and privacy, micro-benchmarks.

mod bench;
mod forgery;
mod receipts;
mod tamper;
mod torn;
