//! Which implementation serves each small deterministic product, decided once per process
//! (`det_gemv` times the candidates; the backend holds the record).
//!
//! Design: a map behind a mutex, keyed by [`ProductDims`]; a leaf the backend struct can hold
//! without importing the code that fills it.

use std::collections::HashMap;
use std::sync::Mutex;

use sov_kernels::DetGemvKernel;

use super::product_dims::ProductDims;
use crate::backend::BackendError;

/// Which implementation serves a small deterministic product: `None` for cuBLASLt, else the
/// kernel.
pub(super) type SmallPick = Option<DetGemvKernel>;

/// The per-process picks, by product size.
#[derive(Default)]
pub(super) struct SmallPicks(Mutex<HashMap<ProductDims, SmallPick>>);

impl SmallPicks {
    pub(super) fn get(&self, dims: ProductDims) -> Result<Option<SmallPick>, BackendError> {
        Ok(self.lock()?.get(&dims).copied())
    }

    pub(super) fn set(&self, dims: ProductDims, pick: SmallPick) -> Result<(), BackendError> {
        self.lock()?.insert(dims, pick);
        Ok(())
    }

    fn lock(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<ProductDims, SmallPick>>, BackendError> {
        self.0
            .lock()
            .map_err(|_| BackendError::Device("deterministic pick lock poisoned".into()))
    }
}
