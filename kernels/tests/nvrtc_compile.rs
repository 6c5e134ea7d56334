//! Compiles every kernel unit with NVRTC for sm_90 (and every head configuration the attention
//! units support), so a syntax or type error in a `.cu` file fails here rather than on the GPU
//! machine. Needs only the NVRTC library, not a GPU; skips with a printed reason when it is absent.

use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use sov_kernels::{DEFAULT_DECODE_MMA_STAGES, HeadConfig, KernelId, KvElement};

fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the shared library can be opened; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn compile(id: KernelId, heads: Option<HeadConfig>) {
    compile_with(id, heads, &[]);
}

fn compile_with(id: KernelId, heads: Option<HeadConfig>, extra: &[&str]) {
    compile_for("compute_90", id, heads, extra);
}

fn compile_for(arch: &str, id: KernelId, heads: Option<HeadConfig>, extra: &[&str]) {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(id.defines(heads, DEFAULT_DECODE_MMA_STAGES));
    options.extend(extra.iter().map(|s| s.to_string()));
    let opts = CompileOptions {
        options,
        ..Default::default()
    };
    let ptx = match compile_ptx_with_opts(id.source(), opts) {
        Ok(ptx) => ptx.to_src(),
        Err(e) => panic!(
            "{} for {arch} ({heads:?} {extra:?}) failed to compile: {e:?}",
            id.file_name()
        ),
    };
    // Every kernel the runtime looks up by name is defined (a renamed kernel fails here).
    for name in id.functions() {
        let defined = ptx
            .lines()
            .any(|l| l.contains(".entry") && l.contains(&format!("{name}(")));
        assert!(
            defined,
            "{} for {arch} defines no kernel `{name}`",
            id.file_name()
        );
    }
}

#[test]
fn every_unit_compiles_for_sm90() {
    if !nvrtc_present() {
        println!("skipping: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 NVRTC)");
        return;
    }
    for id in KernelId::ALL {
        if id.needs_heads() {
            for head_dim in [16, 32, 64, 128, 256] {
                for (group, kv) in [
                    (1, KvElement::Bf16),
                    (2, KvElement::Bf16),
                    (3, KvElement::Bf16),
                    (4, KvElement::Bf16),
                    (5, KvElement::Bf16),
                    (6, KvElement::Bf16),
                    (7, KvElement::Bf16),
                    (8, KvElement::Bf16),
                    (4, KvElement::F32),
                    (1, KvElement::E4m3),
                    (3, KvElement::E4m3),
                    (4, KvElement::E4m3),
                    (8, KvElement::E4m3),
                ] {
                    let heads = Some(HeadConfig {
                        head_dim,
                        group,
                        kv,
                    });
                    if id.supports(heads) {
                        compile(id, heads);
                    }
                }
            }
        } else {
            compile(id, None);
        }
    }
    // The decode-attention tuning variants (sov's `KernelBuild::decode_attention_defines`).
    let heads = Some(HeadConfig {
        head_dim: 128,
        group: 4,
        kv: KvElement::Bf16,
    });
    for extra in [
        &["-DREG_LOADS", "-DWSTEPS=8"][..],
        &["-DREG_LOADS"],
        &["-DREG_LOADS", "-DPREFETCH"],
        &["-DSTAGES=4", "-DMIN_BLOCKS=2"],
    ] {
        compile_with(KernelId::DecodeAttention, heads, extra);
    }
    // The tensor-core decode unit at every ring depth sov's tuning accepts.
    for stages in sov_kernels::DECODE_MMA_STAGES {
        let mut options = vec!["--gpu-architecture=compute_90".to_string()];
        options.extend(KernelId::DecodeAttentionMma.defines(heads, stages));
        let opts = CompileOptions {
            options,
            ..Default::default()
        };
        if let Err(e) = compile_ptx_with_opts(KernelId::DecodeAttentionMma.source(), opts) {
            panic!("decode_attention_mma.cu with STAGES={stages} failed to compile: {e:?}");
        }
    }
}

/// Ampere (A100, compute 8.0) is the oldest architecture the kernels target: the tensor-core decode
/// kernel needs mma.sync bf16, ldmatrix and cp.async (sm_80), and the programmatic-launch
/// instructions of sm_90 must compile away there.
#[test]
fn every_unit_compiles_for_sm80() {
    if !nvrtc_present() {
        println!("skipping: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 NVRTC)");
        return;
    }
    let heads = Some(HeadConfig {
        head_dim: 128,
        group: 4,
        kv: KvElement::Bf16,
    });
    for id in KernelId::ALL {
        compile_for(
            "compute_80",
            id,
            id.needs_heads().then_some(heads).flatten(),
            &[],
        );
    }
}
