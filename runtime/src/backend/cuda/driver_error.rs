//! The CUDA driver's errors as the backend's: out of memory stays its own variant
//! ([`BackendError::OutOfMemory`]), everything else carries the driver's code.
//!
//! Design: a leaf every launch site imports, so none of them needs the backend struct for it.

use cudarc::driver::{DriverError, sys};

use crate::backend::BackendError;

/// Maps a driver error to the backend's error type.
pub(super) fn driver_err(e: DriverError) -> BackendError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        BackendError::OutOfMemory { bytes: 0 }
    } else {
        BackendError::Device(format!("CUDA driver: {e:?}"))
    }
}
