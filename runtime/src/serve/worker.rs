//! Blocking work of a request handler (parsing with the tokenizer, journal writes that fsync)
//! run on tokio's blocking pool, so the async workers keep serving other connections.

use super::error::ApiError;

/// Runs blocking work (journal writes, tokenization) off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}
