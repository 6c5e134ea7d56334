//! Whole-directory tests of the checkpoint store: tampering, torn writes, resume.

mod bench;
pub(crate) mod fixture;
mod overhead;
mod resume;
mod tamper;
mod torn;
