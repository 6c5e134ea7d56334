//! NVRTC compilation of the `sov-kernels` units, once per process and (for attention) head shape.
//!
//! A unit is compiled for the device's virtual architecture (`compute_90` on an H200) and loaded as
//! a module; its functions are looked up once. The cache is process-wide, keyed by device ordinal
//! (cudarc contexts are the device's primary context, and a cached module keeps it alive), so every
//! backend opened on the same device in the process shares the compiled units.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, result, sys};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use sov_kernels::{HeadConfig, KernelId};

use super::device::driver_err;
use crate::backend::BackendError;

type UnitKey = (usize, KernelId, Option<HeadConfig>);

/// Compiled units of every device of the process.
static UNITS: OnceLock<Mutex<HashMap<UnitKey, Arc<Unit>>>> = OnceLock::new();

/// A compiled unit: its module (kept alive) and function handles by name.
struct Unit {
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Handle on the process-wide cache for one device.
pub(in crate::backend::cuda) struct ModuleCache {
    ctx: Arc<CudaContext>,
    arch: String,
}

impl ModuleCache {
    pub(super) fn new(ctx: Arc<CudaContext>, arch: String) -> Self {
        Self { ctx, arch }
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
            let key = (self.ctx.ordinal(), id, heads);
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
        let mut options = vec![format!("--gpu-architecture={}", self.arch)];
        options.extend(id.defines(heads));
        // Tuning knobs for benchmarks: extra defines of the CUDA-core decode-attention unit, e.g.
        // `SOV_DECODE_ATTENTION_DEFINES="-DWSTEPS=8 -DPREFETCH"`, and of the GEMV unit
        // (`SOV_GEMV_DEFINES="-DUNROLL=16"`).
        let knob = match id {
            KernelId::DecodeAttention => Some("SOV_DECODE_ATTENTION_DEFINES"),
            KernelId::Gemv => Some("SOV_GEMV_DEFINES"),
            _ => None,
        };
        if let Some(Ok(extra)) = knob.map(std::env::var) {
            options.extend(extra.split_whitespace().map(str::to_string));
        }
        let opts = CompileOptions {
            options,
            ..Default::default()
        };
        // Development knob: `SOV_KERNEL_SOURCE_DIR=kernels/cuda` compiles the `.cu` files of a
        // checkout instead of the embedded ones, so a kernel can be edited without rebuilding sov.
        let source = match std::env::var_os("SOV_KERNEL_SOURCE_DIR") {
            Some(dir) => id
                .source_from_dir(std::path::Path::new(&dir))
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
            let dynamic_shared = match id {
                KernelId::PrefillAttention => sov_kernels::prefill_shared_bytes(head_dim),
                KernelId::DecodeAttentionMma => sov_kernels::decode_mma_shared_bytes(head_dim),
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
            if let Some(percent) = super::attention::decode_carveout(name) {
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
