//! The admin API (behind the API key): read every slot of the engine's live control surface, write
//! the writable ones, and suspend or resume serving.
//!
//! - `GET /admin/slots`: `{"phase": "ready", "slots": {NAME: VALUE, ...}}`, names as in
//!   `specs/runtime.toml`; numbers as JSON numbers, enum variants by name, bytes as hex.
//! - `PUT /admin/slots/{name}` with `{"value": V}`: `power_state` or `speculative_draft_len`, the
//!   value parsed exactly as `sov slots set` parses it (`Slots::set_by_name`: numbers in decimal or
//!   `0x` hex, enum variants by name or number). `power_state` `suspend`/`resume` also move the
//!   serving phase, as the two routes below do.
//! - `POST /admin/suspend`, `POST /admin/resume`.
//!
//! Design: the slots are the one control surface. Suspending raises `power_state = suspend`: the
//! machine's suspend interrupt checkpoints and waits in `suspended`, so running requests pause with
//! their state intact (their streams stay open), and [`Phase`](super::Phase) turns new requests
//! away with 503 + `Retry-After`. Resuming raises `power_state = resume` (the machine's resume
//! interrupt restores and continues) and reopens the phase. `sov slots get/set` on the run
//! directory's slot file read and write the very same memory.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::state::{AppState, PhaseKind};
use crate::scheduler::{PowerState, SLOT_FIELDS, SlotError, SlotType, Slots};

/// Slots the admin API writes; the others are the engine's or the machine's own.
pub const WRITABLE: &[&str] = &["power_state", "speculative_draft_len"];

/// Seconds a suspended server tells clients to wait (`Retry-After`).
pub const SUSPENDED_RETRY_AFTER: u64 = 5;

/// Routes of the admin API.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin/slots", get(get_slots))
        .route("/admin/slots/{name}", put(put_slot).get(get_slot))
        .route("/admin/suspend", post(suspend))
        .route("/admin/resume", post(resume))
}

/// Every slot field as JSON, by name.
pub fn slots_json(slots: &Slots) -> Map<String, Value> {
    SLOT_FIELDS
        .iter()
        .map(|f| (f.name.to_string(), field_json(slots, f.name, f.ty)))
        .collect()
}

fn field_json(slots: &Slots, name: &str, ty: SlotType) -> Value {
    let text = slots.get_by_name(name).unwrap_or_default();
    match ty {
        SlotType::U32 => text.parse::<u32>().map(Value::from).unwrap_or(Value::Null),
        SlotType::Enum { .. } | SlotType::Bytes { .. } => Value::String(text),
    }
}

async fn get_slots(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "phase": state.phase.get().as_str(),
        "slots": slots_json(state.engine.slots()),
    }))
}

async fn get_slot(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let field = SLOT_FIELDS
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| unknown_slot(&name))?;
    Ok(Json(json!({
        "name": field.name,
        "value": field_json(state.engine.slots(), field.name, field.ty),
    })))
}

/// Body of `PUT /admin/slots/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetSlot {
    /// A number or a string, as `sov slots set` takes it.
    value: Value,
}

async fn put_slot(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Json<SetSlot>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let field = SLOT_FIELDS
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| unknown_slot(&name))?;
    if !WRITABLE.contains(&field.name) {
        return Err(ApiError::invalid_param(
            "name",
            format!(
                "slot `{name}` is kept by the engine; writable: {}",
                WRITABLE.join(", ")
            ),
        )
        .with_code("slot_not_writable"));
    }
    let text = match &body.value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => {
            return Err(
                ApiError::unprocessable("`value` must be a number or a string").with_param("value"),
            );
        }
    };
    let slots = state.engine.slots();
    if field.name == "power_state" {
        // Parse on a scratch surface first, so the phase moves only with a valid value.
        let scratch = Slots::new();
        scratch.set_by_name(field.name, &text).map_err(slot_error)?;
        match scratch.power_state() {
            PowerState::Suspend => set_suspended(&state)?,
            PowerState::Resume => set_resumed(&state)?,
            _ => slots.set_by_name(field.name, &text).map_err(slot_error)?,
        }
    } else {
        slots.set_by_name(field.name, &text).map_err(slot_error)?;
    }
    Ok(Json(json!({
        "name": field.name,
        "value": field_json(slots, field.name, field.ty),
        "phase": state.phase.get().as_str(),
    })))
}

async fn suspend(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    set_suspended(&state)?;
    Ok(Json(phase_json(&state)))
}

async fn resume(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    set_resumed(&state)?;
    Ok(Json(phase_json(&state)))
}

fn phase_json(state: &AppState) -> Value {
    json!({
        "phase": state.phase.get().as_str(),
        "power_state": state.engine.slots().power_state().name(),
    })
}

/// Pauses the engine (running requests keep their state) and turns new requests away. Refused
/// while loading or draining.
pub fn set_suspended(state: &AppState) -> Result<(), ApiError> {
    match state.phase.get() {
        PhaseKind::Ready | PhaseKind::Suspended => {
            state.phase.set(PhaseKind::Suspended);
            state.engine.slots().set_power_state(PowerState::Suspend);
            Ok(())
        }
        other => Err(conflict(other)),
    }
}

/// Continues a suspended engine and takes new requests again. A no-op when already serving;
/// refused while loading or draining.
pub fn set_resumed(state: &AppState) -> Result<(), ApiError> {
    match state.phase.get() {
        PhaseKind::Suspended => {
            state.engine.slots().set_power_state(PowerState::Resume);
            state.phase.set(PhaseKind::Ready);
            Ok(())
        }
        PhaseKind::Ready => Ok(()),
        other => Err(conflict(other)),
    }
}

fn conflict(phase: PhaseKind) -> ApiError {
    ApiError {
        status: StatusCode::CONFLICT,
        ..ApiError::bad_request(format!("the server is {}", phase.as_str()))
    }
    .with_code("phase_conflict")
}

fn unknown_slot(name: &str) -> ApiError {
    let known: Vec<&str> = SLOT_FIELDS.iter().map(|f| f.name).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad_request(format!("no slot `{name}`; slots: {}", known.join(", ")))
    }
    .with_param("name")
    .with_code("slot_not_found")
}

fn slot_error(e: SlotError) -> ApiError {
    ApiError::invalid_param("value", e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_render_by_type() {
        let slots = Slots::new();
        slots.set_by_name("speculative_draft_len", "0x4").unwrap();
        slots.set_power_state(PowerState::Suspend);
        let j = slots_json(&slots);
        assert_eq!(j["speculative_draft_len"], json!(4));
        assert_eq!(j["power_state"], json!("suspend"));
        assert_eq!(j["receipt_digest"], json!("0".repeat(64)));
        assert_eq!(j.len(), SLOT_FIELDS.len());
    }

    #[test]
    fn writable_slots_exist_in_the_spec() {
        for name in WRITABLE {
            assert!(SLOT_FIELDS.iter().any(|f| f.name == *name), "{name}");
        }
    }
}
