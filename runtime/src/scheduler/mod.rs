//! The scheduler generated from `specs/runtime.toml` (the runtime interface) and the machines
//! written against it (`specs/scheduler.toml` as [`seed`], `specs/laptop.toml` as [`laptop`]).
//! Nothing here is hand-written scheduling logic: the `sov_macros::interface!` and
//! `sov_macros::machine!` invocations below generate it at build time (design: the engine loop is
//! a TOML state machine; the engine is generic over [`Machine`]). Editing a spec file rebuilds
//! this module; a bad spec fails the build with `file:line:col` in the TOML.
//!
//! # Generated API (engine engineers code against this)
//!
//! From the interface, in this module:
//! - [`Slots`]: the 32-word control surface (`AtomicU32`s behind a [`SlotMemory`]; clones share
//!   memory). `Slots::new()` (heap) or `Slots::from_memory(Arc<dyn SlotMemory>)` (e.g. an mmap'd
//!   file: implement `SlotMemory::cells(&self) -> &[AtomicU32; 32]`). Typed accessors per field:
//!   `pending_request_count()` / `set_pending_request_count(u32)`, `batch_size`,
//!   `tokens_generated`, `current_seq_id`, `kv_blocks_used`, `speculative_draft_len`,
//!   `bft_quorum_height`; `power_state() -> PowerState` (out-of-range raw values read as
//!   `Active`, never a panic; `power_state_raw() -> u32`), `set_power_state(PowerState)`;
//!   `receipt_digest() -> [u8; 32]`, `set_receipt_digest(&[u8; 32])`, `receipt_signature() ->
//!   [u8; 64]`, `set_receipt_signature(&[u8; 64])` (little-endian within each slot).
//!   By name for `sov slots get/set`: `get_by_name(&str) -> Result<String, SlotError>` and
//!   `set_by_name(&str, &str) -> Result<(), SlotError>` (numbers in decimal or `0x` hex, enum
//!   variants by name such as `"suspend"` or by number, bytes as hex). Whole surface:
//!   `raw() -> [u32; 32]`, `load_raw(&[u32; 32])`, `word(i) -> Option<u32>`, `set_word(i, v)`.
//!   Layout table: [`SLOT_FIELDS`] (`SlotField { name, offset, width, ty, writer, doc }`).
//! - [`PowerState`] `{ Active, Suspend, Resume, LowBattery }` with `name()`, `raw()`,
//!   `from_raw(u32)`, `from_name(&str)`, `ALL`.
//! - [`Actions`]: `type Error: std::error::Error + Send + Sync + 'static;` and one
//!   `fn NAME(&mut self) -> Result<(), Self::Error>` per action: `admit`, `prefill`,
//!   `mixed_step`, `decode`, `draft`, `verify`, `preempt`, `swap_out`, `swap_in`, `checkpoint`,
//!   `restore` (doc lines in the TOML say what each must do).
//! - [`Guards`]: one `fn NAME(&self) -> bool` per predicate: `can_admit`, `has_unprefilled`,
//!   `has_running`, `mix_prefill`, `all_finished`, `kv_exhausted`, `has_swapped`, `can_swap_in`.
//! - [`Action`] (`Admit`, `Prefill`, ...; `name()`, `doc()`, `from_name`, `run(rt)`),
//!   [`Cause`] (`Interrupt(name)`, `Rule(index)`, `Stay`) and
//!   [`Transition<S>`]`{ from, to, cause, actions: Vec<Action>, updates: Vec<&'static str> }`
//!   with `is_noop()` (stayed, did nothing: wait for an event before stepping again).
//! - [`Machine`]: `type State`; consts `NAME`, `SPEC_DIGEST: [u8; 32]` (BLAKE3 of the canonical
//!   interface + machine; receipts carry it), `MERMAID`, `DOT`, `STATE_NAMES`, `CONSTANTS`;
//!   `new()`, `state()`, `state_name()`, `set_state_by_name(&str)` (checkpoint restore),
//!   `constant(&str) -> Option<i64>` (the engine reads `block_size`, `max_tokens`,
//!   `checkpoint_every`), and `step(&mut self, rt: &mut R, slots: &Slots) ->
//!   Result<Transition<State>, R::Error>` for `R: Actions + Guards`.
//!
//! From each machine, in its module ([`seed`], [`laptop`]): `State` (`ALL`, `name()`,
//! `from_name`), `Scheduler` (implements [`Machine`]), `NAME`, `INITIAL`, `SPEC_DIGEST`,
//! `CANONICAL`, `MERMAID`, `DOT`, `CONSTANTS` and one `i64` const per constant
//! (`CHECKPOINT_EVERY`, ...).
//!
//! # Step semantics
//! `step` first checks the machine's interrupts in order (the power events); the first
//! whose guard holds runs its `do` list and moves to its target (no target: stays). Otherwise the
//! current state's transitions are tried in order; the first whose guard holds runs and moves.
//! If none holds the machine stays and does nothing (`Cause::Stay`). Actions run on `rt` in
//! `do`-list order with slot updates interleaved; an action error aborts the step, leaves the
//! state unchanged and is returned. Guards and updates never panic (wrapping arithmetic,
//! division by zero gives 0, writes saturate to `0..=u32::MAX`).
//!
//! # States of the default machine (`seed`)
//! idle, prefill, generate, swap, checkpoint, resume, and `suspended`. When the engine mixes
//! (`mix_prefill`, its default) the prefill state hands admitted prompts to generate, whose
//! `mixed_step` runs them in chunks alongside the decode rows; otherwise prefill runs them. In
//! `suspended`, after a suspend interrupt has checkpointed, the engine waits (every step a no-op)
//! until `power_state` is set to `resume` from outside; the resume interrupt then moves to `resume`,
//! which restores the newest checkpoint and continues in `prefill`.

sov_macros::interface!("../specs/runtime.toml");

/// The default machine, `specs/scheduler.toml` (continuous batching, speculative decoding, checkpoints).
pub mod seed {
    sov_macros::machine!("../specs/scheduler.toml");
}

/// The laptop machine, `specs/laptop.toml`: checkpoint every 16 steps, low battery suspends,
/// no speculation, preemption by recomputation.
pub mod laptop {
    sov_macros::machine!("../specs/laptop.toml");
}

#[cfg(test)]
mod tests;
