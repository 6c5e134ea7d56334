//! Chat templates: the Jinja template a model ships (`tokenizer_config.json` `chat_template` or
//! GGUF `tokenizer.chat_template`) rendered with minijinja.
//!
//! Design: rendered the way Hugging Face's `apply_chat_template` does (transformers'
//! `_compile_jinja_template`): `trim_blocks` and `lstrip_blocks` on; variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`; functions `raise_exception` and
//! `strftime_now` (UTC); a `tojson` filter that writes what Python's `json.dumps` writes (its
//! `ensure_ascii`, `indent` and `sort_keys` keyword arguments; no HTML escaping); Python string
//! methods (`.strip()`, `.startswith()`, ...) through minijinja-contrib's pycompat callback.

use std::sync::Arc;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};

use super::error::LoadError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// The author's name, when given (templates may read `message.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message from `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            name: None,
        }
    }
}

/// A compiled chat template (cheap to clone: the environment is shared).
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings templates see as variables.
    pub fn new(source: String, bos_token: &str, eos_token: &str) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", |format: String| {
            strftime(&format, unix_now())
        });
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| LoadError::Template {
                message: format!("does not compile: {e:#}"),
            })?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            source,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, ending with the assistant header when `add_generation_prompt`.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, LoadError> {
        self.render(Value::from_serialize(messages), add_generation_prompt)
    }

    fn render(&self, messages: Value, add_generation_prompt: bool) -> Result<String, LoadError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| LoadError::Template {
                message: e.to_string(),
            })?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| LoadError::Template {
                message: format!("rendering failed: {e:#}"),
            })
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// sort_keys=False)` by default, each keyword overridable.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    let opts = JsonOpts {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    dump(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    sort_keys: bool,
}

/// Writes `v` as Python's `json.dumps` does (separators `, `/`: `, or `,`/`: ` with an indent).
fn dump(v: &Value, o: &JsonOpts, depth: usize, out: &mut String) -> Result<(), minijinja::Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    let item_sep = if o.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64().filter(|_| v.is_integer()) {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => escape(v.as_str().unwrap_or(""), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dump(item, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key = match k.as_str() {
                    Some(s) => s.to_string(),
                    None => k.to_string(),
                };
                escape(&key, o.ensure_ascii, out);
                out.push_str(": ");
                dump(&v.get_item(k)?, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => escape(&v.to_string(), o.ensure_ascii, out),
    }
    Ok(())
}

/// Python's `repr` of a float (`1.0`, `0.5`, `1e-07`), as `json.dumps` writes it.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f.fract() == 0.0 && f.abs() < 1e16 {
        return format!("{f:.1}");
    }
    let s = format!("{f}");
    if f.abs() >= 1e16 || (f != 0.0 && f.abs() < 1e-4) {
        let e = format!("{f:e}");
        // Rust writes 1e-7, Python 1e-07.
        if let Some((m, exp)) = e.split_once('e') {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            return format!("{m}e{sign}{digits:0>2}");
        }
    }
    s
}

/// A JSON string literal as Python writes it.
fn escape(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7f) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `strftime` of the UTC time `unix` seconds for the directives chat templates use
/// (`%d %m %Y %y %B %b %A %a %H %M %S %j %e %%`); others are kept as written.
fn strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF and tokenizer_config.json carry it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_like_transformers() {
        let t = ChatTemplate::new(SMOLLM2.into(), "<|im_start|>", "<|im_end|>").expect("compiles");
        let out = t
            .apply(
                &[ChatMessage::new("user", "What is the capital of France?")],
                true,
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let out = t
            .apply(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                false,
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn python_methods_bos_and_raise_exception_work() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif %}{{ m.content.strip().upper() }}{% endfor %}";
        let t = ChatTemplate::new(src.into(), "<s>", "</s>").expect("compiles");
        assert_eq!(
            t.apply(&[ChatMessage::new("user", "  hi  ")], false)
                .expect("renders"),
            "<s>HI"
        );
        let err = t.apply(&[ChatMessage::new("bad", "x")], false).unwrap_err();
        assert!(err.to_string().contains("bad role"), "{err}");
        assert!(ChatTemplate::new("{% for %}".into(), "", "").is_err());
    }

    /// Renderings Jinja2 produces in transformers' environment
    /// (`fixtures/make_chat_template_fixtures.py` writes them).
    #[test]
    fn renders_as_jinja2_in_transformers_environment() {
        let cases: serde_json::Value =
            serde_json::from_str(include_str!("fixtures/chat_template_cases.json"))
                .expect("fixture parses");
        for case in cases["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let t = ChatTemplate::new(
                case["template"].as_str().expect("template").into(),
                "<s>",
                "</s>",
            )
            .expect("compiles");
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).expect("messages");
            let got = t
                .apply(&messages, case["add_generation_prompt"] == true)
                .expect("renders");
            assert_eq!(
                got,
                case["expected"].as_str().expect("expected"),
                "case {name}"
            );
        }
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // Expected as `date -u -d @1709211909 "+%A %B %e %H:%M:%S %j %y %m"` (GNU coreutils) prints.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %e %H:%M:%S %j %y %m %%", t),
            "Thursday February 29 13:05:09 060 24 02 %"
        );
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
    }
}
