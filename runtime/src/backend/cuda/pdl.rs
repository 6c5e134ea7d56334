//! Programmatic dependent launch (Hopper and later): a kernel launched with programmatic stream
//! serialization may be scheduled while the kernel before it on the stream is still running, once
//! that one executes `griddepcontrol.launch_dependents`; it then waits in `griddepcontrol.wait` for
//! the earlier grid to complete and flush before touching anything it wrote.
//!
//! Design: used for every kernel of a decode step (GEMVs, RMSNorm, RoPE + KV write, decode attention,
//! SiLU, gathers, argmax): each lets its successor be scheduled as soon as it starts, so a launch's
//! latency hides behind the kernel before it, and a GEMV's first weight loads (which do not depend
//! on the previous kernel) overlap that kernel's tail instead of starting after it drains. The kernels' side of the contract is in `common.cuh`
//! (`allow_dependents_early`, `wait_for_prerequisites`). Stream capture records the launch as a
//! programmatic edge, so the decode graphs keep the overlap. cudarc's launch builder has no launch
//! attributes, hence the direct `cuLaunchKernelEx` call.

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, LaunchConfig, sys};

use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::BackendError;

/// One kernel argument as `cuLaunchKernelEx` takes it: the address of the value.
pub(super) fn arg<T>(value: &T) -> *mut c_void {
    (value as *const T).cast_mut().cast()
}

impl CudaBackend {
    /// Launches `f` with `params` (one pointer per kernel argument, in order) on this backend's
    /// stream, with programmatic stream serialization when the device supports it (else an
    /// ordinary launch with the same arguments).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and types, every pointer in
    /// it must stay valid for the call, and the kernel must call `wait_for_prerequisites()` on
    /// every path before it reads memory that earlier work on the stream may still write, or
    /// writes memory that earlier work may still read or write. Before the wait it may only read
    /// data that no kernel still running before it writes: the weights, the step's inputs uploaded
    /// before its first kernel, and (decode attention) the cache rows of earlier steps.
    pub(super) unsafe fn launch_overlapping(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_ex(f, cfg, params, self.pdl, None) }
    }

    /// [`Self::launch_overlapping`] in thread-block clusters of `cluster` CTAs (each grid
    /// dimension a whole number of them; compute capability 9.0), co-scheduled so that a CTA may
    /// read the shared memory of the others in its cluster.
    ///
    /// # Safety
    /// As [`Self::launch_overlapping`].
    pub(super) unsafe fn launch_overlapping_in_clusters(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        cluster: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_ex(f, cfg, params, self.pdl, Some(cluster)) }
    }

    /// [`Self::launch_overlapping`] without the programmatic serialization: the kernel starts
    /// after the one before it has finished, so it may read anything earlier work wrote.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and types, and every
    /// pointer in it must stay valid for the call.
    pub(super) unsafe fn launch_serial(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's contract; without the attribute the launch is an ordinary one.
        unsafe { self.launch_ex(f, cfg, params, false, None) }
    }

    /// `cuLaunchKernelEx` of `f`, with programmatic stream serialization when `overlap` and in
    /// clusters of `cluster` CTAs when given.
    ///
    /// # Safety
    /// As [`Self::launch_overlapping`] when `overlap`, else as [`Self::launch_serial`].
    unsafe fn launch_ex(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        overlap: bool,
        cluster: Option<(u32, u32, u32)>,
    ) -> Result<(), BackendError> {
        self.ctx.bind_to_thread().map_err(driver_err)?;
        // SAFETY: an all-zero CUlaunchAttribute is a valid value (id 0 = ignore, zero padding); the
        // fields used are set below.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut count = 0;
        if overlap {
            let a = &mut attrs[count];
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            a.value.programmaticStreamSerializationAllowed = 1;
            count += 1;
        }
        if let Some((x, y, z)) = cluster {
            let a = &mut attrs[count];
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            a.value.clusterDim.x = x;
            a.value.clusterDim.y = y;
            a.value.clusterDim.z = z;
            count += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: count as u32,
        };
        // SAFETY: the config points at `attrs` (its first `count` set), alive for the call; the function belongs to a loaded
        // module of this context (bound above); `params` is the caller's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(driver_err)
    }
}
