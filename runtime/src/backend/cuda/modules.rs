//! NVRTC compilation of the `sov-kernels` units, once per process and (for attention) head shape.
//!
//! A unit is compiled for the device's virtual architecture (`compute_90` on an H200) and loaded as
//! a module; its functions are looked up once. The cache is process-wide, keyed by device ordinal
//! (cudarc contexts are the device's primary context, and a cached module keeps it alive) and by
//! the values of the backend's [`KernelBuild`] (ring depth, extra defines, source directory,
//! carveouts), so every backend opened on the same device with the same kernel tuning shares the
//! compiled units, and one with other values compiles its own. Nothing here reads the
//! environment: the tuning arrives from [`super::CudaTuning`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use sov_kernels::{HeadConfig, KernelId};

use super::driver_error::driver_err;
use super::tuning::KernelBuild;
use crate::backend::BackendError;

/// (device ordinal, index of the kernel tuning in [`BUILDS`], unit, head configuration).
type UnitKey = (usize, usize, KernelId, Option<HeadConfig>);

/// Compiled units of every device of the process.
static UNITS: OnceLock<Mutex<HashMap<UnitKey, Arc<Unit>>>> = OnceLock::new();

/// Every distinct kernel tuning a backend of the process was opened with; a tuning's index here
/// stands for its values in [`UnitKey`] (so a lookup hashes four integers, not the defines).
static BUILDS: OnceLock<Mutex<Vec<KernelBuild>>> = OnceLock::new();

/// The index of `build` in [`BUILDS`], added if new.
fn build_index(build: &KernelBuild) -> Result<usize, BackendError> {
    let mut builds = BUILDS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .map_err(|_| BackendError::Device("kernel tuning registry lock poisoned".into()))?;
    Ok(match builds.iter().position(|b| b == build) {
        Some(i) => i,
        None => {
            builds.push(build.clone());
            builds.len() - 1
        }
    })
}

/// A compiled unit: its module (kept alive) and function handles by name.
struct Unit {
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Handle on the process-wide cache for one device and kernel tuning.
pub(in crate::backend::cuda) struct ModuleCache {
    ctx: Arc<CudaContext>,
    arch: String,
    build: KernelBuild,
    /// `build`'s index in [`BUILDS`].
    build_index: usize,
}

impl ModuleCache {
    pub(super) fn new(
        ctx: Arc<CudaContext>,
        arch: String,
        build: KernelBuild,
    ) -> Result<Self, BackendError> {
        let build_index = build_index(&build)?;
        Ok(Self {
            ctx,
            arch,
            build,
            build_index,
        })
    }

    /// The function `name` of unit `id` (compiled for `heads` when the unit needs it).
    pub(super) fn function(
        &self,
        id: KernelId,
        heads: Option<HeadConfig>,
        name: &str,
    ) -> Result<CudaFunction, BackendError> {
        let heads = if id.needs_heads() { heads } else { None };
        let unit = {
            let mut units = UNITS
                .get_or_init(|| Mutex::new(HashMap::new()))
                .lock()
                .map_err(|_| BackendError::Device("kernel cache lock poisoned".into()))?;
            let key = (self.ctx.ordinal(), self.build_index, id, heads);
            match units.get(&key) {
                Some(u) => u.clone(),
                None => {
                    let u = Arc::new(self.compile(id, heads)?);
                    units.insert(key, u.clone());
                    u
                }
            }
        };
        unit.functions.get(name).cloned().ok_or_else(|| {
            BackendError::Device(format!("kernel {name} not found in {}", id.file_name()))
        })
    }

    fn compile(&self, id: KernelId, heads: Option<HeadConfig>) -> Result<Unit, BackendError> {
        if id.needs_heads() {
            let h = heads.ok_or_else(|| {
                BackendError::Device(format!("{} needs a head configuration", id.file_name()))
            })?;
            h.validate()
                .map_err(|e| BackendError::Unsupported(e.to_string()))?;
        }
        let build = &self.build;
        let mut options = vec![format!("--gpu-architecture={}", self.arch)];
        options.extend(id.defines(heads, build.decode_stages));
        // Kernel-development options: extra defines of the CUDA-core decode-attention unit (e.g.
        // `-DWSTEPS=8 -DPREFETCH`) and of the GEMV unit (`-DUNROLL=16`).
        match id {
            KernelId::DecodeAttention => options.extend(build.decode_attention_defines.clone()),
            KernelId::Gemv => options.extend(build.gemv_defines.clone()),
            _ => {}
        }
        let opts = CompileOptions {
            options,
            ..Default::default()
        };
        // A checkout's `kernels/cuda` instead of the embedded sources, so a kernel can be edited
        // without rebuilding sov.
        let source = match &build.source_dir {
            Some(dir) => id
                .source_from_dir(dir)
                .map_err(|e| BackendError::Device(e.to_string()))?,
            None => id.source(),
        };
        let ptx = compile_ptx_with_opts(source, opts).map_err(|e| {
            BackendError::Device(format!("NVRTC failed on {}: {e:?}", id.file_name()))
        })?;
        let module = self.ctx.load_module(ptx).map_err(driver_err)?;
        let mut functions = HashMap::new();
        for &name in id.functions() {
            let f = module.load_function(name).map_err(driver_err)?;
            let head_dim = heads.map(|h| h.head_dim).unwrap_or(0);
            let kv = heads.map(|h| h.kv).unwrap_or_default();
            let dynamic_shared = match id {
                KernelId::PrefillAttention => sov_kernels::prefill_shared_bytes(head_dim),
                KernelId::PrefillAttentionMma => {
                    sov_kernels::prefill_mma_shared_bytes(head_dim, kv)
                }
                KernelId::DecodeAttentionMma => {
                    sov_kernels::decode_mma_shared_bytes(head_dim, build.decode_stages, kv)
                }
                KernelId::Gemv => sov_kernels::DET_GEMV_KERNELS
                    .iter()
                    .find(|d| d.name == name)
                    .map_or(0, |d| d.shared_bytes(sov_kernels::DET_GEMV_MAX_ROWS)),
                _ => 0,
            };
            if dynamic_shared > 0 {
                let bytes = i32::try_from(dynamic_shared).map_err(|_| {
                    BackendError::Unsupported(format!("{dynamic_shared} bytes of shared memory"))
                })?;
                // SAFETY: `f` is a live function of a loaded module; the attribute only raises the
                // dynamic shared-memory limit to what the launch will request.
                unsafe {
                    result::function::set_function_attribute(
                        f.cu_function(),
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes,
                    )
                }
                .map_err(driver_err)?;
            }
            if let Some(percent) = build.decode_carveout.of(name) {
                // SAFETY: `f` is a live function of a loaded module; the carveout is a hint for the
                // split of the SM's memory between L1 and shared memory (0..=100 percent).
                unsafe {
                    result::function::set_function_attribute(
                        f.cu_function(),
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                        percent,
                    )
                }
                .map_err(driver_err)?;
            }
            functions.insert(name, f);
        }
        Ok(Unit {
            _module: module,
            functions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_kernel_tunings_share_compiled_units_and_others_do_not() {
        let default = KernelBuild::default();
        let index = build_index(&default).unwrap();
        assert_eq!(build_index(&default.clone()).unwrap(), index);
        let deeper = KernelBuild {
            decode_stages: 3,
            ..Default::default()
        };
        let defines = KernelBuild {
            gemv_defines: vec!["-DUNROLL=4".into()],
            ..Default::default()
        };
        let (d, g) = (
            build_index(&deeper).unwrap(),
            build_index(&defines).unwrap(),
        );
        assert!(d != index && g != index && d != g, "{index} {d} {g}");
        assert_eq!(build_index(&deeper).unwrap(), d);
    }
}
