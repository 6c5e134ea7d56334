//! The one-way dependencies between sov's library modules, checked on the source: the backends
//! know nothing of the model or anything above it, and the model nothing of the runner or the
//! engine. (The runner binds the model to the engine and owns backend-specific step paths such as
//! the CUDA decode graphs; it may import all three.)
//!
//! A line counts as an import when it names `crate::<module>` outside a comment; files of
//! test-only modules (`#[cfg(test)] mod x;`) are skipped, since tests may check one layer
//! against another.

use std::path::{Path, PathBuf};

/// Modules below `dir` (relative to `runtime/src`) may not name any of `forbidden`.
const RULES: [(&str, &[&str]); 2] = [
    (
        "backend",
        &[
            "model",
            "runner",
            "engine",
            "checkpoint",
            "scheduler",
            "cli",
        ],
    ),
    (
        "model",
        &["runner", "engine", "checkpoint", "scheduler", "cli"],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Names of the test-only modules a module file declares (`#[cfg(test)]` on the line before
/// `mod name;`).
fn test_only_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| {
            let rest = w[1].strip_prefix("pub ").unwrap_or(w[1]);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_string())
        })
        .collect()
}

/// Every non-test `.rs` file below `dir`.
fn library_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mod_rs = dir.join("mod.rs");
    let skip = std::fs::read_to_string(&mod_rs)
        .map(|t| test_only_modules(&t))
        .unwrap_or_default();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if skip.contains(&stem) {
            continue;
        }
        if path.is_dir() {
            library_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(file:line, text)` of every line in `files` that names `crate::<m>` for a forbidden `m`.
fn violations(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for m in forbidden {
                let path = format!("crate::{m}");
                let hit = code.match_indices(&path).any(|(at, _)| {
                    let next = code[at + path.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if hit {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn lower_layers_import_nothing_above_them() {
    for (dir, forbidden) in RULES {
        let mut files = Vec::new();
        library_files(&src().join(dir), &mut files);
        assert!(!files.is_empty(), "no sources found under src/{dir}");
        let bad = violations(&files, forbidden);
        assert!(
            bad.is_empty(),
            "src/{dir} must not import {forbidden:?}:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn the_check_sees_imports_and_skips_comments_and_test_modules() {
    let dir = std::env::temp_dir().join(format!("sov-layering-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("mod.rs"), "mod ops;\n#[cfg(test)]\nmod tests;\n").expect("write");
    std::fs::write(
        dir.join("ops.rs"),
        "//! Uses [`crate::model::LlamaModel`] in docs only.\nuse crate::modeling::X;\n",
    )
    .expect("write");
    std::fs::write(dir.join("tests.rs"), "use crate::model::LlamaModel;\n").expect("write");
    let mut files = Vec::new();
    library_files(&dir, &mut files);
    assert!(violations(&files, &["model"]).is_empty());
    std::fs::write(dir.join("ops.rs"), "use crate::model::{KvCache};\n").expect("write");
    assert_eq!(violations(&files, &["model"]).len(), 1);
    std::fs::remove_dir_all(&dir).expect("clean up");
}
