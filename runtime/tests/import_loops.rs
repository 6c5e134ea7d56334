//! No two source files of the `sov` crate import each other, directly or through others: the
//! file-level form of "dependencies point down" (`layering.rs` checks the layers).
//!
//! Design: each file under `runtime/src` is a module (`a/b.rs` and `a/b/mod.rs` are `a::b`). Its
//! code (comments dropped, test code left out as `layering.rs` leaves it out) names other modules
//! through `use` trees and inline paths starting with `crate::`, `super::`, `self::` or a child
//! module's name. A name is resolved to the file of the longest module prefix, and when that file
//! only re-exports the name (`pub use`), on to the file that defines it; each resolution is an
//! arrow between two files. A `pub use` itself is no arrow: it hands a name on, and the files
//! that use the name get the arrow to where it is defined. A loop is a strongly connected set of more than one file (Tarjan's
//! algorithm); the test prints each loop's files and the arrows that tie them, with the names.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use common::source::{code_lines, is_test_file, rust_files, test_module_files};

/// A module path: `["engine", "core"]`; the crate root is empty.
type ModPath = Vec<String>;

/// The crate's modules: path -> file, and each file's code (without comments and test code), cut
/// into the file's module and the inline modules (`mod x { ... }`) it holds, each with its path.
struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
    code: BTreeMap<ModPath, Vec<(ModPath, String)>>,
}

impl Crate {
    /// Reads every non-test module file under `src` (the binary's `main.rs` is a crate of its own).
    fn read(src: &Path) -> Crate {
        let mut all = Vec::new();
        rust_files(src, &mut all);
        let tests = test_module_files(&all);
        let (mut files, mut code) = (BTreeMap::new(), BTreeMap::new());
        for f in all {
            let Ok(rel) = f.strip_prefix(src) else {
                continue;
            };
            if is_test_file(&f, &tests) || rel == Path::new("main.rs") {
                continue;
            }
            let mut path: ModPath = rel
                .iter()
                .filter_map(|c| c.to_str())
                .map(|c| c.trim_end_matches(".rs").to_string())
                .collect();
            if path.last().is_some_and(|l| l == "mod" || l == "lib") {
                path.pop();
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<String> = code_lines(&text).into_iter().map(|(_, l)| l).collect();
            let mut parts = Vec::new();
            split_inline_modules(&path, &strip_strings(&lines.join("\n")), &mut parts);
            code.insert(path.clone(), parts);
            files.insert(path, rel.to_path_buf());
        }
        Crate { files, code }
    }

    /// The absolute module path a `use` or inline path written in module `at` means (None: an
    /// external crate or a name this check does not follow).
    fn absolute(&self, at: &[String], path: &[String]) -> Option<ModPath> {
        let (first, rest) = path.split_first()?;
        let mut base: ModPath = at.to_vec();
        match first.as_str() {
            "crate" => base.clear(),
            "self" => {}
            "super" => {
                base.pop()?;
            }
            name => {
                let mut child = base.clone();
                child.push(name.to_string());
                if !self.files.contains_key(&child) {
                    return None;
                }
                return Some([child.as_slice(), rest].concat());
            }
        }
        let mut rest = rest;
        while let Some(("super", more)) = rest.split_first().map(|(s, m)| (s.as_str(), m)) {
            base.pop()?;
            rest = more;
        }
        Some([base.as_slice(), rest].concat())
    }

    /// The file that defines what absolute `path` names: the longest module prefix, followed
    /// through that module's `pub use` re-exports of the next name (a few hops at most).
    fn resolve(&self, path: &[String], exports: &Exports) -> Option<ModPath> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let k = (0..=path.len())
                .rev()
                .find(|&k| self.files.contains_key(&path[..k]))?;
            let module = path[..k].to_vec();
            let Some(target) = path
                .get(k)
                .and_then(|name| exports.get(&module).and_then(|m| m.get(name)))
            else {
                return Some(module);
            };
            path = [target.as_slice(), &path[k + 1..]].concat();
        }
        None
    }
}

/// Per module: name -> the absolute path it re-exports (`pub use a::b::C;` gives `C -> a::b::C`).
type Exports = HashMap<ModPath, HashMap<String, ModPath>>;

/// `text` with the contents of string and char literals blanked (a path in a message is no
/// import).
fn strip_strings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        match (in_str, c) {
            (false, '"') => {
                in_str = true;
                out.push(c);
            }
            (true, '\\') => {
                chars.next();
            }
            (true, '"') => {
                in_str = false;
                out.push(c);
            }
            (true, _) => {}
            (false, _) => out.push(c),
        }
    }
    out
}

/// Pushes `code` of module `at` onto `out`, with each inline module's body (`mod name { ... }`)
/// cut out and pushed as module `at::name` (recursively).
fn split_inline_modules(at: &[String], code: &str, out: &mut Vec<(ModPath, String)>) {
    let mut own = String::with_capacity(code.len());
    let mut i = 0;
    while i < code.len() {
        let at_token = i == 0 || !is_ident(code[..i].chars().next_back().unwrap_or(' '));
        if at_token && code[i..].starts_with("mod ") {
            let name: String = code[i + 4..]
                .trim_start()
                .chars()
                .take_while(|&c| is_ident(c))
                .collect();
            let after = code[i + 4..].trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                let open = code.len() - after.len();
                let mut depth = 0;
                let close = code[open..]
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(code.len(), |(j, _)| open + j);
                let inner: ModPath = [at, &[name]].concat();
                split_inline_modules(&inner, &code[(open + 1).min(close)..close], out);
                i = (close + 1).min(code.len());
                continue;
            }
        }
        let c = code[i..].chars().next().unwrap_or(' ');
        own.push(c);
        i += c.len_utf8();
    }
    out.push((at.to_vec(), own));
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `s` at top-level commas (outside braces).
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The paths of a `use` tree (`a::{b, c::{d as e, self}}` -> `a::b`, `a::c::d`, `a::c`), each
/// with the name it binds (the last segment or the alias; None for a glob).
fn expand_use(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let tree = tree.trim();
    if tree.is_empty() {
        return Vec::new();
    }
    if let Some(open) = tree.find('{') {
        let prefix: Vec<String> = segments(tree[..open].trim_end_matches("::"));
        let inner = tree[open + 1..].trim_end().trim_end_matches('}');
        let mut out = Vec::new();
        for item in split_top(inner) {
            for (p, bind) in expand_use(item) {
                if p == ["self"] {
                    let bind = prefix.last().cloned();
                    out.push((prefix.clone(), bind));
                } else {
                    out.push(([prefix.as_slice(), &p].concat(), bind));
                }
            }
        }
        return out;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut p = segments(path);
    if p.last().is_some_and(|l| l == "*") {
        p.pop();
        return vec![(p, None)];
    }
    let bind = alias.or_else(|| p.last().cloned());
    vec![(p, bind)]
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The `use` statements of `code`: (is a re-export, tree text), and `code` with them removed.
fn use_statements(code: &str) -> (Vec<(bool, String)>, String) {
    let mut uses = Vec::new();
    let mut rest = String::with_capacity(code.len());
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at_token = i == 0 || !is_ident(bytes[i - 1] as char);
        if at_token && code[i..].starts_with("use ") {
            let end = code[i..].find(';').map_or(code.len(), |e| i + e);
            // A visibility in front (`pub`, `pub(crate)`, ...) makes it a re-export; it is
            // taken off the remaining code, so it does not count for the next statement.
            let before = rest.trim_end();
            let visibility = if before.ends_with("pub") {
                Some(before.len() - 3)
            } else if before.ends_with(')') {
                before
                    .rsplit_once("pub(")
                    .filter(|(_, tail)| !tail.contains([';', '{', '}', '\n']))
                    .map(|(head, _)| head.len())
            } else {
                None
            };
            let public = visibility.is_some();
            if let Some(at) = visibility {
                rest.truncate(at);
            }
            uses.push((public, code[i + 4..end].to_string()));
            i = end + 1;
            continue;
        }
        let c = code[i..].chars().next().unwrap_or(' ');
        rest.push(c);
        i += c.len_utf8();
    }
    (uses, rest)
}

/// Inline paths of `code` that start with `crate::`, `super::` or `self::` (identifier chains).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let i = from + at;
            from = i + start.len();
            // `pub(in crate::x)` is a visibility, not a use.
            if i > 0 && is_ident(code[..i].chars().next_back().unwrap_or(' '))
                || code[..i].ends_with("(in ")
            {
                continue;
            }
            let chain: String = code[i..]
                .chars()
                .take_while(|&c| is_ident(c) || c == ':')
                .collect();
            out.push(segments(&chain));
        }
    }
    out
}

/// Arrows between files: (from, to) -> the names that tie them.
fn arrows(krate: &Crate) -> BTreeMap<(ModPath, ModPath), BTreeSet<String>> {
    let mut exports: Exports = HashMap::new();
    let mut parsed = Vec::new();
    for (file, parts) in &krate.code {
        for (module, code) in parts {
            let (uses, rest) = use_statements(code);
            for (public, tree) in &uses {
                for (path, bind) in expand_use(tree) {
                    if let (true, Some(bind), Some(abs)) =
                        (public, bind, krate.absolute(module, &path))
                    {
                        exports.entry(module.clone()).or_default().insert(bind, abs);
                    }
                }
            }
            parsed.push((file, module, uses, rest));
        }
    }
    let mut out: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
    for (file, module, uses, rest) in parsed {
        // A `pub use` only hands a name on (it is followed to the defining file above): the
        // module's own code does not depend on it.
        let paths = uses
            .iter()
            .filter(|(public, _)| !public)
            .flat_map(|(_, tree)| expand_use(tree).into_iter().map(|(p, _)| p))
            .chain(inline_paths(&rest));
        for path in paths {
            let Some(abs) = krate.absolute(module, &path) else {
                continue;
            };
            let Some(target) = krate.resolve(&abs, &exports) else {
                continue;
            };
            if target == *file {
                continue;
            }
            let name = path.last().cloned().unwrap_or_default();
            out.entry((file.clone(), target)).or_default().insert(name);
        }
    }
    out
}

/// Strongly connected sets of more than one module (Tarjan's algorithm, iterative).
fn loops(
    nodes: &[ModPath],
    edges: &BTreeMap<(ModPath, ModPath), BTreeSet<String>>,
) -> Vec<Vec<ModPath>> {
    let index_of: HashMap<&ModPath, usize> =
        nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut succ = vec![Vec::new(); nodes.len()];
    for (from, to) in edges.keys() {
        if let (Some(&a), Some(&b)) = (index_of.get(from), index_of.get(to)) {
            succ[a].push(b);
        }
    }
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if *child == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*child) {
                *child += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut set = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    set.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    out.push(set);
                }
            }
        }
    }
    out
}

/// The loops of the crate under `src`, described for a failure message.
fn describe_loops(src: &Path) -> (usize, Vec<String>) {
    let krate = Crate::read(src);
    let edges = arrows(&krate);
    let nodes: Vec<ModPath> = krate.files.keys().cloned().collect();
    let found = loops(&nodes, &edges)
        .into_iter()
        .map(|set| {
            let file = |m: &ModPath| krate.files[m].display().to_string();
            let mut text = format!(
                "loop of {} files: {}",
                set.len(),
                set.iter().map(file).collect::<Vec<_>>().join(", ")
            );
            for ((from, to), names) in &edges {
                if set.contains(from) && set.contains(to) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    text += &format!("\n  {} -> {}: {}", file(from), file(to), names.join(", "));
                }
            }
            text
        })
        .collect();
    (krate.files.len(), found)
}

#[test]
fn no_source_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, found) = describe_loops(&src);
    assert!(files > 100, "read only {files} module files under {src:?}");
    assert!(
        found.is_empty(),
        "files that import each other (move what both need into a file of its own):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_a_loop_through_braces_super_and_a_face() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    // a/mod.rs is a face: `crate::a::Thing` is defined in a/thing.rs.
    write("a/mod.rs", "mod thing;\npub use thing::Thing;\n");
    write(
        "a/thing.rs",
        "use crate::b::{self, helper};\npub struct Thing;\nfn f() { helper(); }\n",
    );
    write(
        "b.rs",
        "pub fn helper() {\n    let _ = crate::a::Thing;\n}\n// crate::nothing\n",
    );
    let (_, found) = describe_loops(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a/thing.rs -> b.rs: b, helper"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("b.rs -> a/thing.rs: Thing"),
        "{}",
        found[0]
    );
    // Without b's use of Thing there is no loop; a path inside a string names nothing.
    write(
        "b.rs",
        "pub fn helper() {\n    let _ = \"crate::a::Thing\";\n}\n",
    );
    assert!(describe_loops(src).1.is_empty());
    // A plain `use` after a re-export is an arrow (a/mod.rs -> b.rs), and a/mod.rs's own item
    // named from b closes the loop.
    write(
        "a/mod.rs",
        "mod thing;\npub use thing::Thing;\nuse crate::b::helper;\npub fn g() { helper(); }\n",
    );
    write("b.rs", "pub fn helper() {}\nfn h() { super::a::g(); }\n");
    let (_, found) = describe_loops(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a/mod.rs -> b.rs: helper"),
        "{}",
        found[0]
    );
}
