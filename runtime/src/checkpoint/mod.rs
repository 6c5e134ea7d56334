//! WORM checkpoints: content-addressed KV blocks, rkyv snapshots, signed receipts.
