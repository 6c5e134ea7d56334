//! The validated intermediate representation: what code generation, graphs and the canonical
//! digest are built from. Every name in it has been resolved against the interface.

use crate::expr::{BinOp, UpdateOp};

/// A runtime interface (`specs/runtime.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// `[interface] name`, e.g. `sov-runtime`.
    pub name: String,
    /// `[interface] doc`: one line saying what the runtime is (may be empty).
    pub doc: String,
    /// Sorted by offset.
    pub slots: Vec<SlotField>,
    /// In file order.
    pub actions: Vec<Named>,
    /// In file order.
    pub predicates: Vec<Named>,
}

/// A name with its doc line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The identifier as written in the spec (snake_case).
    pub name: String,
    /// Its `doc` string from the spec (may be empty).
    pub doc: String,
}

/// Number of `u32` slots of the control surface.
pub const SLOT_COUNT: u32 = 32;

/// One field of the 32-slot control surface (`[slots.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotField {
    /// Field name as written in the spec.
    pub name: String,
    /// First slot the field occupies (0-based, below [`SLOT_COUNT`]).
    pub offset: u32,
    /// In slots.
    pub width: u32,
    /// What the slots hold.
    pub ty: SlotType,
    /// Who may change the field.
    pub writer: Writer,
    /// Its `doc` string from the spec (may be empty).
    pub doc: String,
}

/// The `type` of a slot field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotType {
    /// One slot holding an unsigned number.
    U32,
    /// Variant names; the slot holds the index.
    Enum(Vec<String>),
    /// `len` bytes, little-endian within each slot.
    Bytes {
        /// Number of bytes (4 per slot of the field's width).
        len: u32,
    },
}

impl SlotType {
    /// The spec's spelling of the type: `"u32"`, `"enum"` or `"bytes"`.
    pub fn keyword(&self) -> &'static str {
        match self {
            SlotType::U32 => "u32",
            SlotType::Enum(_) => "enum",
            SlotType::Bytes { .. } => "bytes",
        }
    }
}

/// Who writes a slot field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The engine keeps it current; machines only read it.
    Runtime,
    /// Machines' slot updates may write it.
    Machine,
}

impl Interface {
    /// The slot field called `name`, if the interface declares one.
    pub fn slot(&self, name: &str) -> Option<&SlotField> {
        self.slots.iter().find(|s| s.name == name)
    }
    /// Whether the interface declares an action called `name`.
    pub fn has_action(&self, name: &str) -> bool {
        self.actions.iter().any(|a| a.name == name)
    }
    /// Whether the interface declares a predicate called `name`.
    pub fn has_predicate(&self, name: &str) -> bool {
        self.predicates.iter().any(|a| a.name == name)
    }
}

/// A machine (`specs/scheduler.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// `[machine] name`, e.g. `seed`.
    pub name: String,
    /// `[machine] doc` (may be empty).
    pub doc: String,
    /// Name of the state the machine starts in (one of `states`).
    pub initial: String,
    /// In file order.
    pub constants: Vec<(String, i64)>,
    /// In file order: checked first to last before every step.
    pub interrupts: Vec<Interrupt>,
    /// In file order; the initial state need not be first.
    pub states: Vec<State>,
}

impl Machine {
    /// The value of the constant called `name`, if the machine declares one.
    pub fn constant(&self, name: &str) -> Option<i64> {
        self.constants
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

/// An `[[interrupts]]` entry: checked before every step from any state; when its guard holds it
/// runs `body` and goes to `target` instead of the state's own transitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupt {
    /// Interrupt name as written in the spec.
    pub name: String,
    /// The `when` condition.
    pub guard: Guard,
    /// The `do` list, run in order.
    pub body: Vec<Stmt>,
    /// None: stay in the current state.
    pub target: Option<String>,
}

/// A `[states.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// State name as written in the spec.
    pub name: String,
    /// Its `doc` string from the spec (may be empty).
    pub doc: String,
    /// Ordered: the first whose guard holds fires.
    pub transitions: Vec<Transition>,
}

/// One `[[states.NAME.on]]` entry of a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// None: always fires.
    pub guard: Option<Guard>,
    /// The `do` list, run in order when the transition fires.
    pub body: Vec<Stmt>,
    /// Name of the state to go to (may be the same state).
    pub target: String,
}

/// A guard as written (for graphs) and resolved (for code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// The `when` text exactly as written in the spec.
    pub source: String,
    /// The resolved boolean expression.
    pub expr: TExpr,
}

/// A resolved, type-checked expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TExpr {
    /// An integer literal.
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
    /// A machine constant, inlined as its value.
    Const {
        /// Constant name as written.
        name: String,
        /// Its value from `[constants]`.
        value: i64,
    },
    /// The raw `u32` word of a one-slot field (a number or an enum index).
    Slot {
        /// Slot field name.
        name: String,
        /// The field's slot offset.
        offset: u32,
    },
    /// An enum variant, compared with an enum slot's raw word.
    Variant {
        /// Variant name as written in the slot's `variants`.
        name: String,
        /// Its position in `variants` (the raw slot value).
        index: u32,
    },
    /// A runtime predicate, answered by the engine when evaluated.
    Predicate(String),
    /// Logical negation.
    Not(Box<TExpr>),
    /// A binary operation on two subexpressions.
    Binary(BinOp, Box<TExpr>, Box<TExpr>),
}

/// One entry of a `do` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// Run the runtime action with this name.
    Action(String),
    /// Write a machine-written one-slot field.
    Update {
        /// Slot field name.
        slot: String,
        /// The field's slot offset.
        offset: u32,
        /// Assignment, `+=` or `-=`.
        op: UpdateOp,
        /// The value written or added (an integer expression).
        value: TExpr,
        /// As written, e.g. `tokens_generated += 1`.
        source: String,
    },
}

impl Stmt {
    /// The statement as the spec spells it: the action name, or the update's source text.
    pub fn label(&self) -> String {
        match self {
            Stmt::Action(name) => name.clone(),
            Stmt::Update { source, .. } => source.clone(),
        }
    }
}
