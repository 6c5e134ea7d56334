//! The loader's error type: every variant names the file and the problem, so a user can act on it.
//!
//! Design: one `thiserror` enum for the whole loader (HF folders, GGUF, tokenizer, default-model
//! fetch); no loader code panics on file contents.

use std::path::PathBuf;

/// Why a model could not be found, fetched or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file the model needs does not exist.
    #[error("{path}: file not found")]
    Missing {
        /// The missing file.
        path: PathBuf,
    },

    /// Reading a file failed (other than "not found").
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A file ends before a structure it declares.
    #[error("{path}: truncated: {what} needs bytes up to {needed} but the file has {len}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The structure being read (a header, a tensor's data, ...).
        what: String,
        /// Byte offset the structure would end at.
        needed: u64,
        /// Actual file length in bytes.
        len: u64,
    },

    /// A tensor's shape does not match the model config.
    #[error("{path}: tensor {tensor}: shape {actual:?}, expected {expected:?}")]
    Shape {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Shape found in the file (`[element count]` when the data length disagrees with it).
        actual: Vec<usize>,
        /// Shape the config implies.
        expected: Vec<usize>,
    },

    /// A tensor is stored in an element type the loader cannot read.
    #[error("{path}: tensor {tensor}: unsupported dtype {dtype}")]
    Dtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The element type as the file names it.
        dtype: String,
    },

    /// A tensor the model needs is not in the file.
    #[error("{path}: missing tensor {tensor}")]
    MissingTensor {
        /// The file searched.
        path: PathBuf,
        /// Name of the absent tensor.
        tensor: String,
    },

    /// Config or file metadata is missing, malformed or unsupported.
    #[error("{path}: bad metadata: {message}")]
    Metadata {
        /// The file the metadata is in.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// The tokenizer could not be built from its file.
    #[error("{path}: tokenizer: {message}")]
    Tokenizer {
        /// The tokenizer file (or the GGUF holding the vocabulary).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// The chat template failed to compile or render.
    #[error("chat template: {message}")]
    Template {
        /// The template engine's error.
        message: String,
    },

    /// Encoding or decoding text with a loaded tokenizer failed.
    #[error("tokenizer: {message}")]
    Tokenize {
        /// The tokenizer's error.
        message: String,
    },

    /// The model argument is neither a path nor a known model name.
    #[error("unknown model {spec:?}: not a file or folder, and not a known model name ({known})")]
    UnknownModel {
        /// The argument as given.
        spec: String,
        /// The known model names, comma-separated.
        known: String,
    },

    /// Fetching the default model into the cache failed.
    #[error(
        "fetching the default model failed: {reason}\nto fetch it by hand, run:\n    {command}\nthen run sov again"
    )]
    Fetch {
        /// What went wrong.
        reason: String,
        /// A shell command that fetches the model by hand.
        command: String,
    },
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
