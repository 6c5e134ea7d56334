//! The dependency directions of the `sov` crate, checked on its source: each layer may name only
//! the layers below it. A `use crate::engine::...` (or any `crate::engine::` path) in the backend,
//! say, fails this test with the file and line.
//!
//! Layers, top to bottom: `cli` -> `serve` -> `app` -> `runner` (the model bound to the engine's
//! `ForwardModel`) -> `engine` and `model` -> `backend`, with `loader`,
//! `scheduler` (generated from `specs/`) and the checkpoint store beside them. The store is its own
//! crate (`runtime/store`, `sov-store`), so the compiler already keeps it from importing `sov`; this
//! test also checks that its manifest does not depend on `sov`. Test code (`#[cfg(test)]` modules
//! and everything after a file's first `#[cfg(test)]`) is not checked: tests may wire layers
//! together.

mod common;

use std::path::{Path, PathBuf};

use common::source::{code_lines, is_test_file, rust_files, test_module_files};

/// (module directory under `runtime/src`, modules of the crate it must never name, why).
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "backend",
        &["model", "engine", "runner", "app", "serve", "cli"],
        "backends know nothing of models or engines",
    ),
    (
        "model",
        &["engine", "runner", "app", "serve", "cli"],
        "the model does not schedule",
    ),
    (
        "engine",
        &["runner", "app", "serve", "cli"],
        "the loop knows no command line and drives any ForwardModel",
    ),
    (
        "runner",
        &["app", "serve", "cli"],
        "the runner binds a model to the engine, nothing above",
    ),
    (
        "loader",
        &["model", "engine", "runner", "app", "serve", "cli"],
        "loading produces the data the model reads, and knows no loop",
    ),
    (
        "scheduler",
        &["engine", "runner", "app", "serve", "cli"],
        "the generated scheduler knows only its interface",
    ),
    (
        "app",
        &["serve", "cli"],
        "start-up is shared by every front end",
    ),
    (
        "serve",
        &["cli"],
        "the server is a library the command line starts",
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_layer_names_only_layers_below_it() {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 50,
        "found only {} files under {root:?}",
        files.len()
    );
    let tests = test_module_files(&files);
    let mut broken = Vec::new();
    for f in &files {
        if is_test_file(f, &tests) {
            continue;
        }
        let rel = f.strip_prefix(&root).unwrap_or(f);
        let Some(layer) = rel.iter().next().and_then(|c| c.to_str()) else {
            continue;
        };
        let Some((_, forbidden, why)) = NEVER.iter().find(|(l, _, _)| *l == layer) else {
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (n, line) in code_lines(&text) {
            for m in *forbidden {
                if line.contains(&format!("crate::{m}::")) || line.contains(&format!("crate::{m};"))
                {
                    broken.push(format!(
                        "{}:{n}: {layer} names crate::{m} ({why}): {}",
                        rel.display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dependencies pointing the wrong way:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_store_crate_does_not_depend_on_sov() {
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("store");
    let manifest = std::fs::read_to_string(store.join("Cargo.toml")).expect("store manifest");
    let deps: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("sov") && l.contains('='))
        .collect();
    assert!(
        deps.is_empty(),
        "runtime/store must not depend on sov crates (the store knows bytes, not engines): {deps:?}"
    );
    let mut files = Vec::new();
    rust_files(&store.join("src"), &mut files);
    assert!(!files.is_empty(), "no sources under {store:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (n, line) in code_lines(&text) {
            assert!(
                !line.contains("sov::"),
                "{}:{n}: the store names sov: {}",
                f.display(),
                line.trim()
            );
        }
    }
}

#[test]
fn the_checker_sees_a_wrong_way_import() {
    let lines = code_lines(
        "//! docs may say crate::engine::x\nuse crate::engine::core::EngineCore; // real\n#[cfg(test)]\nuse crate::cli::x;\n",
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, 2);
    assert!(lines[0].1.contains("crate::engine::"));
}
