//! The engine: continuous batching driven by the generated scheduler.
