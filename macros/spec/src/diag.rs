//! Diagnostics: an error located at `file:line:col` in a spec file, and the collector that the
//! parser and validator push into so every error of a file is reported at once.

use std::fmt;
use std::ops::Range;

use crate::source::Source;

/// One error in a spec file, located by 1-based line and column (in characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user named it (or as the macro resolved it).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.col, self.message
        )
    }
}

/// Collects diagnostics while a file is checked.
#[derive(Debug, Default)]
pub struct Diags {
    items: Vec<Diagnostic>,
}

impl Diags {
    /// Records an error at byte range `span` of `src`.
    pub fn error(&mut self, src: &Source, span: Range<usize>, message: impl Into<String>) {
        let (line, col) = src.line_col(span.start);
        self.items.push(Diagnostic {
            file: src.display_name(),
            line,
            col,
            message: message.into(),
        });
    }

    /// Records an error that has no place in a file (for example an unreadable file).
    pub fn error_at_start(&mut self, file: &str, message: impl Into<String>) {
        self.items.push(Diagnostic {
            file: file.to_string(),
            line: 1,
            col: 1,
            message: message.into(),
        });
    }

    /// Whether no error was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Number of errors recorded.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Appends the errors collected by `other`.
    pub fn extend(&mut self, other: Diags) {
        self.items.extend(other.items);
    }

    /// The diagnostics in file order (stable for equal positions).
    pub fn into_sorted(mut self) -> Vec<Diagnostic> {
        self.items
            .sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
        self.items
    }
}
