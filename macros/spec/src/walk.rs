//! Typed reads from a span-carrying TOML tree (`toml::de::DeTable`), each failure becoming a
//! diagnostic at the offending key or value so a file's errors are all collected in one pass.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::diag::Diags;
use crate::source::Source;

/// A TOML table whose values carry byte spans into the file.
pub type Table<'i> = DeTable<'i>;
/// A TOML value with its byte span in the file.
pub type Value<'i> = Spanned<DeValue<'i>>;

/// Context shared by the readers: the file and the diagnostics sink.
pub struct Reader<'a> {
    /// The file being read (for spans and messages).
    pub src: &'a Source,
    /// Where every failed read records its diagnostic.
    pub diags: &'a mut Diags,
}

/// A string value with the span of its literal (quotes included).
#[derive(Debug, Clone)]
pub struct SpannedStr {
    /// The string's contents (escapes resolved).
    pub value: String,
    /// Byte range of the literal in the file, quotes included.
    pub span: Range<usize>,
    /// Byte offset of the string's first character in the file when the literal maps byte for
    /// byte (no escapes), so expression spans can be shifted into the file.
    pub content_start: Option<usize>,
}

impl SpannedStr {
    /// The file span of bytes `inner` of the string's value (falls back to the whole literal).
    pub fn sub_span(&self, inner: &Range<usize>) -> Range<usize> {
        match self.content_start {
            Some(start) => start + inner.start..start + inner.end.max(inner.start),
            None => self.span.clone(),
        }
    }
}

/// Parses a whole document, reporting every syntax error.
pub fn parse_document<'i>(src: &'i Source, diags: &mut Diags) -> Option<Spanned<Table<'i>>> {
    let (doc, errors) = DeTable::parse_recoverable(&src.text);
    if errors.is_empty() {
        return Some(doc);
    }
    for e in errors {
        let span = e.span().unwrap_or(0..0);
        diags.error(src, span, format!("TOML syntax: {}", e.message().trim()));
    }
    None
}

/// Entries of a table in file order (the parser's map is sorted by key).
pub fn entries<'t, 'i>(table: &'t Table<'i>) -> Vec<(&'t str, Range<usize>, &'t Value<'i>)> {
    let mut v: Vec<_> = table
        .iter()
        .map(|(k, val)| (k.get_ref().as_ref(), k.span(), val))
        .collect();
    v.sort_by_key(|(_, span, _)| span.start);
    v
}

impl Reader<'_> {
    /// Records an error at byte range `span` of the file.
    pub fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.diags.error(self.src, span, message);
    }

    /// Reports keys of `table` not in `allowed`.
    pub fn deny_unknown(&mut self, table: &Table<'_>, allowed: &[&str], what: &str) {
        for (key, span, _) in entries(table) {
            if !allowed.contains(&key) {
                let known = allowed
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.error(
                    span,
                    format!("unknown key `{key}` in {what} (known: {known})"),
                );
            }
        }
    }

    /// A sub-table, or an error if the value has another type.
    pub fn table<'t, 'i>(&mut self, value: &'t Value<'i>, what: &str) -> Option<&'t Table<'i>> {
        match value.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be a table, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// `value` as a string; otherwise records "`what` must be a string" at it and returns None.
    pub fn string(&mut self, value: &Value<'_>, what: &str) -> Option<SpannedStr> {
        match value.get_ref() {
            DeValue::String(s) => {
                let span = value.span();
                let literal = self.src.text.get(span.clone()).unwrap_or("");
                let plain = literal.len() == s.len() + 2
                    && (literal.starts_with('"') || literal.starts_with('\''))
                    && literal.get(1..literal.len() - 1) == Some(s.as_ref());
                Some(SpannedStr {
                    value: s.to_string(),
                    content_start: plain.then_some(span.start + 1),
                    span,
                })
            }
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// `value` as an `i64` (any TOML radix, `_` separators allowed); otherwise records an error
    /// at it (wrong type, or out of range) and returns None.
    pub fn integer(&mut self, value: &Value<'_>, what: &str) -> Option<i64> {
        match value.get_ref() {
            DeValue::Integer(i) => {
                let digits = i.as_str().replace('_', "");
                let (neg, digits) = match digits.strip_prefix('-') {
                    Some(rest) => (true, rest.to_string()),
                    None => (false, digits.trim_start_matches('+').to_string()),
                };
                let digits = digits
                    .trim_start_matches("0x")
                    .trim_start_matches("0o")
                    .trim_start_matches("0b");
                match i64::from_str_radix(digits, i.radix()) {
                    Ok(v) => Some(if neg { -v } else { v }),
                    Err(_) => {
                        self.error(value.span(), format!("{what} is out of range"));
                        None
                    }
                }
            }
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be an integer, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// The elements of `value`; otherwise records "`what` must be an array" and returns None.
    pub fn array<'t, 'i>(&mut self, value: &'t Value<'i>, what: &str) -> Option<&'t [Value<'i>]> {
        match value.get_ref() {
            DeValue::Array(a) => Some(a.as_ref()),
            other => {
                self.error(
                    value.span(),
                    format!("{what} must be an array, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// An array of strings (elements of other types are reported and skipped).
    pub fn strings(&mut self, value: &Value<'_>, what: &str) -> Vec<SpannedStr> {
        let Some(items) = self.array(value, what) else {
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| self.string(item, &format!("each entry of {what}")))
            .collect()
    }

    /// A required string key of `table` (whose own span is `table_span`).
    pub fn req_string(
        &mut self,
        table: &Table<'_>,
        table_span: &Range<usize>,
        key: &str,
        what: &str,
    ) -> Option<SpannedStr> {
        match table.get(key) {
            Some(v) => self.string(v, &format!("`{key}` of {what}")),
            None => {
                self.error(table_span.clone(), format!("{what} has no `{key}`"));
                None
            }
        }
    }

    /// `key` of `table` as a string: None when absent, and None with an error when not a string.
    pub fn opt_string(&mut self, table: &Table<'_>, key: &str, what: &str) -> Option<SpannedStr> {
        table
            .get(key)
            .and_then(|v| self.string(v, &format!("`{key}` of {what}")))
    }
}

/// True for names usable as Rust identifiers in generated code: lower snake case ASCII, not a
/// keyword, no leading digit, no double or trailing underscore, no digit right after an
/// underscore (so `a_1` and `a1` cannot both become `A1` in CamelCase).
pub fn is_snake_ident(name: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
        "extern", "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod",
        "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait",
        "true", "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do",
        "final", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield",
    ];
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains("__")
        && !name.ends_with('_')
        && !name
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'_' && w[1].is_ascii_digit())
        && !KEYWORDS.contains(&name)
}

/// `low_battery` -> `LowBattery`.
pub fn camel(name: &str) -> String {
    name.split('_')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The closest of `candidates` to `name`, if any is close enough to suggest.
pub fn suggest<'c>(name: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= (c.len().max(name.len()) / 3).max(2) && *d < c.len().min(name.len()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// ", did you mean `x`?" or nothing.
pub fn did_you_mean<'c>(name: &str, candidates: impl IntoIterator<Item = &'c str>) -> String {
    suggest(name, candidates)
        .map(|s| format!("; did you mean `{s}`?"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_snake_ident("low_battery"));
        assert!(is_snake_ident("a1"));
        for bad in ["Low", "1a", "a__b", "a_", "type", "", "a-b", "é", "a_1"] {
            assert!(!is_snake_ident(bad), "{bad}");
        }
        assert_eq!(camel("low_battery"), "LowBattery");
        assert_eq!(camel("swap_in"), "SwapIn");
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("genrate", ["idle", "generate"]), Some("generate"));
        assert_eq!(suggest("zzz", ["idle", "generate"]), None);
    }
}
