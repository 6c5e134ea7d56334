//! Device buffers: a typed view over one untyped cudarc allocation.
//!
//! The Backend contract passes dtypes at run time, so a buffer is raw bytes plus its [`DType`] and
//! element count; kernels receive the raw device address.

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::backend::{DType, DeviceBuffer};

/// A flat, typed buffer in GPU memory.
pub struct CudaBuffer {
    pub(super) dtype: DType,
    pub(super) len: usize,
    /// `[max(len, 1) * dtype.size_bytes()]` bytes (a zero-length buffer still owns one element).
    pub(super) mem: CudaSlice<u8>,
}

impl CudaBuffer {
    /// Device address of element 0.
    pub(super) fn ptr(&self) -> u64 {
        let (ptr, _sync) = self.mem.device_ptr(self.mem.stream());
        ptr
    }

    /// Device address of element `elem`.
    pub(super) fn ptr_at(&self, elem: usize) -> u64 {
        self.ptr() + (elem * self.dtype.size_bytes()) as u64
    }

    /// Views the buffer's bytes as elements of `dtype` (as many whole ones as the bytes hold): for
    /// a buffer a kernel fills in a narrower type than it was made for, and back.
    pub(super) fn retype(&mut self, dtype: DType) {
        self.dtype = dtype;
        self.len = self.mem.len() / dtype.size_bytes();
    }
}

impl DeviceBuffer for CudaBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({:?}, {})", self.dtype, self.len)
    }
}
