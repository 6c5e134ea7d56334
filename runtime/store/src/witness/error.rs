//! Why a witness refuses an `add-checkpoint` request, each reason with the HTTP status the C2SP
//! tlog-witness protocol gives it.

/// A refused `add-checkpoint` request.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The body is not an `add-checkpoint` request, or `old` exceeds the checkpoint's size (400).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// No configured log has this origin (404).
    #[error("unknown log origin {0:?}")]
    UnknownLog(String),
    /// No signature on the checkpoint verifies under the configured key of its log (403).
    #[error("no signature by a trusted key of log {0:?}")]
    Forbidden(String),
    /// `old` is not the size of the witness's view, or a checkpoint of that size has another root
    /// (409, the body carries the witness's size).
    #[error("the witness's view of the log has size {size}")]
    Conflict {
        /// Size of the newest checkpoint the witness cosigned for this origin (0: none).
        size: u64,
    },
    /// The consistency proof does not verify from the witness's view to the checkpoint (422).
    #[error("consistency proof does not verify: {0}")]
    BadProof(String),
    /// The witness could not persist its view (500); nothing was cosigned.
    #[error("witness state: {0}")]
    State(String),
}

impl AddError {
    /// The HTTP status code the protocol assigns.
    pub fn status(&self) -> u16 {
        match self {
            Self::Malformed(_) => 400,
            Self::Forbidden(_) => 403,
            Self::UnknownLog(_) => 404,
            Self::Conflict { .. } => 409,
            Self::BadProof(_) => 422,
            Self::State(_) => 500,
        }
    }
}
