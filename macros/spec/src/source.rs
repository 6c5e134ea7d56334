//! A spec file's text and name, and the mapping from byte offsets (what the TOML parser reports)
//! to 1-based `line:col` (what users read).

use std::path::{Component, Path, PathBuf};

/// A loaded spec file.
#[derive(Debug, Clone)]
pub struct Source {
    /// Path used to open the file and to resolve paths written inside it.
    pub path: PathBuf,
    /// The whole file as UTF-8 text.
    pub text: String,
}

impl Source {
    /// A source from a path and its text, without touching the file system.
    pub fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            text: text.into(),
        }
    }

    /// Reads `path`; the error is a message ready for a diagnostic.
    pub fn read(path: &Path) -> Result<Self, String> {
        std::fs::read_to_string(path)
            .map(|text| Self::new(normalize(path), text))
            .map_err(|e| format!("cannot read spec file: {e}"))
    }

    /// The path as shown in diagnostics.
    pub fn display_name(&self) -> String {
        self.path.display().to_string()
    }

    /// 1-based line and column (counted in characters) of byte `offset`; offsets past the end or
    /// inside a character are clamped, never a panic.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }

    /// Resolves `relative` against this file's directory (as a machine names its interface).
    pub fn sibling(&self, relative: &str) -> PathBuf {
        let dir = self.path.parent().unwrap_or(Path::new(""));
        normalize(&dir.join(relative))
    }
}

/// Removes `.` and `name/..` pairs without touching the file system, so messages show
/// `runtime/../specs/x.toml` as `specs/x.toml`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) | Some(Component::Prefix(_)) => {}
                _ => out.push(component),
            },
            other => out.push(other),
        }
    }
    out.iter().map(|c| c.as_os_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one_in_characters() {
        let src = Source::new("x.toml", "ab\nçd = 1\n");
        assert_eq!(src.line_col(0), (1, 1));
        assert_eq!(src.line_col(3), (2, 1));
        // 'ç' is two bytes: the 'd' after it is column 2.
        assert_eq!(src.line_col(5), (2, 2));
        // Inside a character and past the end: clamped.
        assert_eq!(src.line_col(4), (2, 1));
        assert_eq!(src.line_col(999), (3, 1));
    }

    #[test]
    fn normalize_drops_parent_pairs() {
        assert_eq!(
            normalize(Path::new("/a/runtime/../specs/./x.toml")),
            PathBuf::from("/a/specs/x.toml")
        );
        assert_eq!(
            normalize(Path::new("../x.toml")),
            PathBuf::from("../x.toml")
        );
    }
}
