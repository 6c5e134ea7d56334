//! Every kernel the CUDA backend names in its source is one the runtime loads.
//!
//! The backend compiles a kernel unit and keeps only the functions `KernelId::functions()` lists,
//! so a kernel defined in a `.cu` file and named by the backend but missing from that list builds,
//! compiles under NVRTC and fails only on a GPU ("kernel ... not found"). This reads the sources
//! as text (no GPU): the `__global__` functions of `kernels/cuda/*.cu`, and the string literals of
//! `runtime/src/backend/cuda/*.rs` equal to one of them; each such literal must be listed by the
//! unit (a `KernelId`) that defines it. Names the backend builds at run time (`format!`) are not literals and are
//! checked by `kernels/tests/nvrtc_compile.rs` through the list itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use sov_kernels::KernelId;

/// The `__global__` function names of one CUDA source.
fn kernels_defined(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in src.match_indices("__global__ void") {
        let mut rest = src[i + "__global__ void".len()..].trim_start();
        if let Some(after) = rest.strip_prefix("__launch_bounds__") {
            // Skip the bounds' parenthesised arguments.
            let close = after.find(')').expect("__launch_bounds__ closes");
            rest = after[close + 1..].trim_start();
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(!name.is_empty(), "a __global__ function without a name");
        names.push(name);
    }
    names
}

/// The contents of every string literal of a Rust source made of identifier characters.
fn identifier_literals(src: &str) -> BTreeSet<String> {
    src.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.extend(files(&path, ext));
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
    out
}

#[test]
fn every_kernel_the_backend_names_is_loaded() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // kernel name -> the file that defines it
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    for cu in files(&root.join("../kernels/cuda"), "cu") {
        let file = cu.file_name().unwrap().to_string_lossy().to_string();
        for name in kernels_defined(&fs::read_to_string(&cu).expect("read .cu")) {
            defined.insert(name, file.clone());
        }
    }
    assert!(defined.len() > 50, "found only {} kernels", defined.len());
    let loaded: BTreeMap<&str, BTreeSet<&str>> = KernelId::ALL
        .iter()
        .map(|id| (id.file_name(), id.functions().iter().copied().collect()))
        .collect();
    let mut missing = Vec::new();
    for rs in files(&root.join("src/backend/cuda"), "rs") {
        for lit in identifier_literals(&fs::read_to_string(&rs).expect("read .rs")) {
            // Files outside KernelId (kv_gather.cu, compiled by the staging pool itself) load
            // their function by name directly.
            let Some(file) = defined.get(&lit) else {
                continue;
            };
            if loaded
                .get(file.as_str())
                .is_some_and(|f| !f.contains(lit.as_str()))
            {
                missing.push(format!("{lit} ({file}, named in {})", rs.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "kernels named by the backend but not in KernelId::functions(): {missing:?}"
    );
}

#[test]
fn the_scanner_finds_bounded_and_plain_kernels() {
    let src = "extern \"C\" __global__ void __launch_bounds__(1024, 2)\nfoo_bar(int x) {}\n\
               extern \"C\" __global__ void baz(float* y) {}";
    assert_eq!(kernels_defined(src), ["foo_bar", "baz"]);
    let lits = identifier_literals("f(\"rms_x\", \"a b\", \"\"); g(\"k2\")");
    assert_eq!(lits, ["k2", "rms_x"].map(String::from).into());
}
