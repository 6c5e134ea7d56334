//! Chat template and special tokens of a Hugging Face folder: `tokenizer_config.json`
//! (`chat_template`, `bos_token`, `eos_token`) and `generation_config.json` / `config.json`
//! (`eos_token_id`, `bos_token_id`).
//!
//! Design: follows transformers' precedence: generation_config.json's ids (what `generate` stops
//! on) over config.json's, over the ids of tokenizer_config.json's token strings. A chat template
//! may be a string or a list of named templates (the one named `default` is used), and may also
//! live in a separate `chat_template.jinja` file (transformers 4.43+).

use std::path::Path;

use serde_json::Value;

use crate::loader::error::LoadError;
use crate::loader::tokenizer::Tokenizer;

/// What the folder says about special tokens and chat formatting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialInfo {
    /// `chat_template` from `tokenizer_config.json` (or `chat_template.jinja`).
    pub chat_template: Option<String>,
    /// `bos_token` from `tokenizer_config.json`.
    pub bos_token: Option<String>,
    /// `eos_token` from `tokenizer_config.json`.
    pub eos_token: Option<String>,
    /// End-of-sequence ids: from `generation_config.json`, else `config.json`, else the id of
    /// `eos_token`.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id, looked up in the same order as `eos_token_ids`.
    pub bos_token_id: Option<u32>,
}

/// Reads an optional JSON file: `Ok(None)` when absent.
fn read_json(path: &Path) -> Result<Option<Value>, LoadError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| LoadError::metadata(path, format!("not valid JSON: {e}")))
}

/// A token string as tokenizer_config.json writes it: a string or `{"content": ...}`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id` as an int or a list of ints.
fn ids(path: &Path, key: &str, v: Option<&Value>) -> Result<Vec<u32>, LoadError> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| LoadError::metadata(path, format!("{key} = {x} is not a token id")))
    };
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}

/// Reads the folder's special-token information; `tokenizer` resolves token strings to ids.
pub fn read_special(dir: &Path, tokenizer: &Tokenizer) -> Result<SpecialInfo, LoadError> {
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json(&tc_path)?.unwrap_or(Value::Null);
    let gen_path = dir.join("generation_config.json");
    let gen_cfg = read_json(&gen_path)?.unwrap_or(Value::Null);
    let cfg_path = dir.join("config.json");
    let cfg = read_json(&cfg_path)?.unwrap_or(Value::Null);

    let chat_template = match tc.get("chat_template") {
        None | Some(Value::Null) => {
            let jinja = dir.join("chat_template.jinja");
            if jinja.is_file() {
                Some(std::fs::read_to_string(&jinja).map_err(|e| LoadError::io(&jinja, e))?)
            } else {
                None
            }
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        Some(other) => {
            return Err(LoadError::metadata(
                &tc_path,
                format!("chat_template is neither a string nor a list: {other}"),
            ));
        }
    };
    let bos_token = token_string(tc.get("bos_token"));
    let eos_token = token_string(tc.get("eos_token"));

    let mut eos_token_ids = ids(&gen_path, "eos_token_id", gen_cfg.get("eos_token_id"))?;
    if eos_token_ids.is_empty() {
        eos_token_ids = ids(&cfg_path, "eos_token_id", cfg.get("eos_token_id"))?;
    }
    if eos_token_ids.is_empty()
        && let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t))
    {
        eos_token_ids.push(id);
    }
    let bos_token_id = ids(&gen_path, "bos_token_id", gen_cfg.get("bos_token_id"))?
        .first()
        .copied()
        .or(ids(&cfg_path, "bos_token_id", cfg.get("bos_token_id"))?
            .first()
            .copied())
        .or_else(|| bos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)));

    Ok(SpecialInfo {
        chat_template,
        bos_token,
        eos_token,
        eos_token_ids,
        bos_token_id,
    })
}
