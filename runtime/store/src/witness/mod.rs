//! Witnessing the verifiable log, in the C2SP model: a witness keeps, per log, the newest tree
//! head it cosigned and cosigns a new one only when an RFC 6962 consistency proof shows it extends
//! that view (<https://c2sp.org/tlog-witness>, cosignatures per <https://c2sp.org/tlog-cosignature>).
//!
//! Design: bytes and decisions here, HTTP in the binary (`sov witness`, and the client side of
//! `sov generate|serve --witness`). One job per file:
//! - [`protocol`]: the `add-checkpoint` request body and the `text/x.tlog.size` reply (codec);
//! - [`checkpoint`]: the three lines every C2SP checkpoint starts with (origin, size, root);
//! - [`logs`]: which logs a witness accepts (origin or origin prefix, and the log's key);
//! - [`view`]: the witness's durable per-log view and the add-checkpoint decision;
//! - [`cosignatures`]: checking the cosignature lines a witness returns (the client side);
//! - [`cosigned`]: `cosignatures.log`, the cosignatures a run keeps next to its heads;
//! - [`receipts`]: cosigning snapshot receipt files in place (a library witness of the chain).

pub mod checkpoint;
pub mod cosignatures;
pub mod cosigned;
mod error;
pub mod logs;
pub mod protocol;
mod receipts;
pub mod view;

pub use error::AddError;
pub use receipts::{cosign, witness_verifier};
