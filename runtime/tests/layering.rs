//! The dependency directions of the `sov` crate, checked on its source: each layer may name only
//! the layers below it. A `use crate::engine::...` (or any `crate::engine::` path) in the backend,
//! say, fails this test with the file and line.
//!
//! Layers, top to bottom: `cli` -> `app` -> `runner` (the model bound to the engine's
//! `ForwardModel`) -> `engine` and `model` -> `backend`, with `loader`,
//! `scheduler` (generated from `specs/`) and the checkpoint store beside them. The store is its own
//! crate (`runtime/store`, `sov-store`), so the compiler already keeps it from importing `sov`; this
//! test also checks that its manifest does not depend on `sov`. Test code (`#[cfg(test)]` modules
//! and everything after a file's first `#[cfg(test)]`) is not checked: tests may wire layers
//! together.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// (module directory under `runtime/src`, modules of the crate it must never name, why).
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "backend",
        &["model", "engine", "app", "cli"],
        "backends know nothing of models or engines",
    ),
    (
        "model",
        &["engine", "app", "cli"],
        "the model does not schedule",
    ),
    (
        "engine",
        &["runner", "app", "cli"],
        "the loop knows no command line and drives any ForwardModel",
    ),
    (
        "runner",
        &["app", "cli"],
        "the runner binds a model to the engine, nothing above",
    ),
    ("loader", &["engine", "app", "cli"], "loading knows no loop"),
    (
        "scheduler",
        &["engine", "app", "cli"],
        "the generated scheduler knows only its interface",
    ),
    ("app", &["cli"], "start-up is shared by every front end"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Files that are test modules: declared as `#[cfg(test)] mod NAME;` by their parent module file,
/// and everything under such a module's directory.
fn test_module_files(files: &[PathBuf]) -> HashSet<PathBuf> {
    let mut tests = HashSet::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let dir = match f.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => f.parent().map(Path::to_path_buf),
            _ => f.file_stem().map(|s| f.with_file_name(s)),
        };
        let Some(dir) = dir else { continue };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = line
                .strip_prefix("mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            if i > 0 && lines[i - 1].starts_with("#[cfg(test)]") {
                tests.insert(dir.join(format!("{name}.rs")));
                tests.insert(dir.join(name));
            }
        }
    }
    tests
}

fn is_test_file(f: &Path, tests: &HashSet<PathBuf>) -> bool {
    f.ancestors().any(|a| tests.contains(a))
}

/// `(line number, line)` of the code lines before the file's first `#[cfg(test)]`, comments
/// dropped.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push((i + 1, code.to_string()));
    }
    out
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
