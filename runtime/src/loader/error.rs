//! The loader's error type: every variant names the file and the problem, so a user can act on it.
//!
//! Design: one `thiserror` enum for the whole loader (HF folders, GGUF, tokenizer, default-model
//! fetch); no loader code panics on file contents.

use std::path::PathBuf;

/// Why a model could not be found, fetched or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: file not found")]
    Missing { path: PathBuf },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: truncated: {what} needs bytes up to {needed} but the file has {len}")]
    Truncated {
        path: PathBuf,
        what: String,
        needed: u64,
        len: u64,
    },

    #[error("{path}: tensor {tensor}: shape {actual:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },

    #[error("{path}: tensor {tensor}: unsupported dtype {dtype}")]
    Dtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },

    #[error("{path}: missing tensor {tensor}")]
    MissingTensor { path: PathBuf, tensor: String },

    #[error("{path}: bad metadata: {message}")]
    Metadata { path: PathBuf, message: String },

    #[error("{path}: tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },

    #[error("chat template: {message}")]
    Template { message: String },

    #[error("tokenizer: {message}")]
    Tokenize { message: String },

    #[error("unknown model {spec:?}: not a file or folder, and not a known model name ({known})")]
    UnknownModel { spec: String, known: String },

    #[error(
        "fetching the default model failed: {reason}\nto fetch it by hand, run:\n    {command}\nthen run sov again"
    )]
    Fetch { reason: String, command: String },
}

impl LoadError {
    /// An I/O error on `path`, turning "not found" into [`LoadError::Missing`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            LoadError::Missing { path }
        } else {
            LoadError::Io { path, source }
        }
    }

    /// Bad metadata in `path`.
    pub fn metadata(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        LoadError::Metadata {
            path: path.into(),
            message: message.into(),
        }
    }
}
