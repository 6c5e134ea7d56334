//! [`Grammar`]: what a request's output must match, and its journal form (a JSON text, so a
//! resumed request rebuilds the same matcher).

use serde_json::{Value, json};

use super::error::ConstraintError;

/// What the output must match. Serializable so the journal can carry it (resume rebuilds the
/// matcher).
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid under this JSON schema (OpenAI `response_format: {"type":
    /// "json_schema"}`'s `json_schema.schema`).
    JsonSchema(Value),
    /// Text matching this regular expression (whole output).
    Regex(String),
    /// Text matching this Lark grammar (llguidance's Lark dialect).
    Lark(String),
}

impl Grammar {
    /// The journal form: one line of JSON, `{"type": "...", "value": ...}`.
    pub fn to_record(&self) -> String {
        let v = match self {
            Grammar::JsonObject => json!({ "type": "json_object" }),
            Grammar::JsonSchema(schema) => json!({ "type": "json_schema", "value": schema }),
            Grammar::Regex(rx) => json!({ "type": "regex", "value": rx }),
            Grammar::Lark(lark) => json!({ "type": "lark", "value": lark }),
        };
        v.to_string()
    }

    /// Reads back what [`Grammar::to_record`] wrote.
    pub fn from_record(s: &str) -> Result<Self, ConstraintError> {
        let v: Value =
            serde_json::from_str(s).map_err(|e| ConstraintError::Record(e.to_string()))?;
        let text = |v: &Value| {
            v.get("value")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| ConstraintError::Record("\"value\" is not a string".into()))
        };
        match v.get("type").and_then(Value::as_str) {
            Some("json_object") => Ok(Grammar::JsonObject),
            Some("json_schema") => v
                .get("value")
                .cloned()
                .map(Grammar::JsonSchema)
                .ok_or_else(|| ConstraintError::Record("json_schema without \"value\"".into())),
            Some("regex") => text(&v).map(Grammar::Regex),
            Some("lark") => text(&v).map(Grammar::Lark),
            other => Err(ConstraintError::Record(format!(
                "unknown grammar type {other:?}"
            ))),
        }
    }

    /// The grammar an OpenAI `response_format` object asks for: `{"type": "text"}` gives None,
    /// `{"type": "json_object"}` [`Grammar::JsonObject`], `{"type": "json_schema", "json_schema":
    /// {"schema": ...}}` [`Grammar::JsonSchema`] (a missing schema means any JSON value).
    pub fn from_openai_response_format(format: &Value) -> Result<Option<Self>, ConstraintError> {
        let bad = |why: &str| ConstraintError::InvalidGrammar(format!("response_format: {why}"));
        match format.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(Grammar::JsonObject)),
            Some("json_schema") => {
                let spec = format
                    .get("json_schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| bad("json_schema must be an object"))?;
                let schema = spec.get("schema").cloned().unwrap_or(json!({}));
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(bad("json_schema.schema must be an object"));
                }
                Ok(Some(Grammar::JsonSchema(schema)))
            }
            Some(other) => Err(bad(&format!("unknown type {other:?}"))),
            None => Err(bad("missing \"type\"")),
        }
    }
}
