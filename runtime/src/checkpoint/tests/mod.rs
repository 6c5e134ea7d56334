//! Whole-directory tests of the checkpoint store: tampering, torn writes, resume.

mod fixture;
mod tamper;
mod torn;
