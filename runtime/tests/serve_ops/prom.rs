//! A strict reader of the Prometheus text exposition format (version 0.0.4) for the tests: every
//! line must be a comment, `# HELP`/`# TYPE`, or `name{labels} value`; every sample must belong
//! to a family declared by `# TYPE` (histograms through `_bucket`, `_sum`, `_count`).

use std::collections::HashMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name as written (`x_bucket` for a histogram's bucket).
    pub name: String,
    /// Label pairs in order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Default)]
pub struct Scrape {
    /// Family name -> declared type.
    pub types: HashMap<String, String>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses `text`, or says which line is wrong.
    pub fn parse(text: &str) -> Result<Scrape, String> {
        let mut s = Scrape::default();
        for (i, line) in text.lines().enumerate() {
            let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
            if line.trim().is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest
                    .split_once(' ')
                    .ok_or_else(|| bad("TYPE without type"))?;
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty) {
                    return Err(bad("unknown type"));
                }
                if s.types.insert(name.to_string(), ty.to_string()).is_some() {
                    return Err(bad("family declared twice"));
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').ok_or_else(|| bad("no value"))?;
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| bad("value is not a number"))?,
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), Vec::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .ok_or_else(|| bad("unclosed labels"))?;
                    (
                        name.to_string(),
                        parse_labels(inner).ok_or_else(|| bad("bad labels"))?,
                    )
                }
            };
            if !valid_name(&name) {
                return Err(bad("bad metric name"));
            }
            if s.family_of(&name).is_none() {
                return Err(bad("sample of an undeclared family"));
            }
            s.samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Ok(s)
    }

    /// The declared family a series name belongs to.
    fn family_of(&self, series: &str) -> Option<&str> {
        if let Some((name, _)) = self.types.get_key_value(series) {
            return Some(name);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = series.strip_suffix(suffix)?;
            let (name, ty) = self.types.get_key_value(base)?;
            (ty == "histogram" || (ty == "summary" && *suffix != "_bucket"))
                .then_some(name.as_str())
        })
    }

    /// The declared type of family `name`.
    pub fn type_of(&self, name: &str) -> Option<&str> {
        self.types.get(name).map(String::as_str)
    }

    /// The value of series `name` whose labels include every pair of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.value)
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `a="x",b="y"` (escapes `\\`, `\"`, `\n`), or None if malformed.
fn parse_labels(inner: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        if !valid_name(key) {
            return None;
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Some(out)
}

#[test]
fn reads_the_format_and_refuses_strays() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{r=\"x\\\"y\",s=\"z\"} 3\n\
              # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
    let s = Scrape::parse(ok).unwrap();
    assert_eq!(s.value("a_total", &[("r", "x\"y")]), Some(3.0));
    assert_eq!(s.value("h_bucket", &[("le", "+Inf")]), Some(2.0));
    assert_eq!(s.type_of("h"), Some("histogram"));
    assert!(Scrape::parse("stray 1\n").is_err());
    assert!(Scrape::parse("# TYPE a gauge\na one\n").is_err());
    assert!(Scrape::parse("# TYPE a gauge\na{x=\"1} 1\n").is_err());
}
