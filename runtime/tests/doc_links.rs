//! Every relative link in the repository's Markdown files points at a file or folder that exists.
//!
//! Walks the `*.md` files under the repository root (skipping `target/` and every dot-directory:
//! `.git/`, `.gpu/`, ...), takes each link target written `](path)` or `](path#anchor)` outside
//! code (fenced blocks and inline code spans are not links), and checks that `path` exists
//! relative to the file's own directory (a leading `/` is the repository root). Web and mail links
//! (`http:`, `https:`, `mailto:`) and links to an anchor of the same file (`#...`) are not checked,
//! nor are anchors. The failure lists every broken link with its file and line, so moving a
//! document (say, a section of `kernels/README.md` into `kernels/docs/`) without fixing the links
//! to it, or the links inside it, fails here.

use std::fs;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf()
}

/// The `*.md` files under `dir`, skipping `target` and dot-directories, sorted.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name.starts_with('.') || name == "target" {
                continue;
            }
            markdown_files(&path, out);
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// `line` with its inline code spans (runs of backticks and what they enclose) blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        match after.find(fence) {
            Some(end) => rest = &after[end + ticks..],
            // An unclosed run is literal text.
            None => {
                out.push_str(fence);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The relative link targets of one Markdown text: (line number, target without its anchor).
fn relative_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") {
            fence = Some("```");
            continue;
        }
        if trimmed.starts_with("~~~") {
            fence = Some("~~~");
            continue;
        }
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(close) = after.find(')') else { break };
            rest = &after[close + 1..];
            // `](<path>)` (which may hold spaces) and `](path "title")` are links to `path`.
            let inside = after[..close].trim();
            let target = match inside.strip_prefix('<') {
                Some(bracketed) => bracketed.split('>').next().unwrap_or(""),
                None => inside.split_whitespace().next().unwrap_or(""),
            };
            let path = target.split('#').next().unwrap_or("");
            let skip = path.is_empty()
                || ["http:", "https:", "mailto:"]
                    .iter()
                    .any(|scheme| target.starts_with(scheme));
            if !skip {
                links.push((i + 1, path.to_string()));
            }
        }
    }
    links
}

#[test]
fn relative_links_are_found_and_others_skipped() {
    let text = "see [a](docs/a.md) and [b](../b.md#part), [c](#here), [d](https://x.org/y)\n\
                `[e](not/a/link.md)` then [f](<f g.md>) [h](h.md \"title\")\n\
                ```sh\n[i](in/a/fence.md)\n```\n[j](mailto:me@x.org) [k](/root.md)\n";
    let found: Vec<_> = relative_links(text);
    assert_eq!(
        found,
        vec![
            (1, "docs/a.md".to_string()),
            (1, "../b.md".to_string()),
            (2, "f g.md".to_string()),
            (2, "h.md".to_string()),
            (6, "/root.md".to_string()),
        ]
    );
}

#[test]
fn markdown_links_resolve() {
    let root = repo_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("kernels/README.md")),
        "the walk found no kernels/README.md under {}",
        root.display()
    );
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let text =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let dir = file.parent().expect("a file has a directory");
        for (line, path) in relative_links(&text) {
            checked += 1;
            let resolved = match path.strip_prefix('/') {
                Some(from_root) => root.join(from_root),
                None => dir.join(&path),
            };
            if !resolved.exists() {
                let shown = file.strip_prefix(&root).unwrap_or(file);
                broken.push(format!("{}:{line}: ({path})", shown.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} of {checked} relative Markdown links point at nothing:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        checked > 0,
        "no relative links found in {} Markdown files",
        files.len()
    );
}
