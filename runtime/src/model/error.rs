//! Errors of model construction and of the forward pass.

use crate::backend::BackendError;

/// Why a model could not be built or a forward pass could not run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor the architecture needs is absent from the weights.
    #[error("missing tensor `{name}`")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor has a shape the configuration does not allow.
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    WrongShape {
        /// The tensor's name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape found in the weights.
        got: Vec<usize>,
    },
    /// The configuration is inconsistent (e.g. heads that do not divide).
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// The batch handed to `forward` cannot run (empty chunk, token id out of range, block table
    /// too short, position beyond the model's context, ...).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A backend operation failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}
