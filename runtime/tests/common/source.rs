//! Reading the crate's own source for the structure tests (`layering.rs`, `import_loops.rs`):
//! its Rust files, which of them are test modules, and each file's code lines without comments.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, appended to `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
pub fn test_module_files(files: &[PathBuf]) -> HashSet<PathBuf> {
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

pub fn is_test_file(f: &Path, tests: &HashSet<PathBuf>) -> bool {
    f.ancestors().any(|a| tests.contains(a))
}

/// `(line number, line)` of the code lines before the file's first `#[cfg(test)]` item other than
/// a test module's declaration (`#[cfg(test)] mod NAME;`, which is skipped: the code after it is
/// still the file's), comments dropped.
pub fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            let declaration = lines.peek().is_some_and(|(_, next)| {
                let next = next.trim();
                next.starts_with("mod ") && next.ends_with(';')
            });
            if declaration {
                lines.next();
                continue;
            }
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
