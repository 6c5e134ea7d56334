//! The validated intermediate representation: what code generation, graphs and the canonical
//! digest are built from. Every name in it has been resolved against the interface.

use crate::expr::{BinOp, UpdateOp};

/// A runtime interface (`specs/runtime.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
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
    pub name: String,
    pub doc: String,
}

/// Number of `u32` slots of the control surface.
pub const SLOT_COUNT: u32 = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotField {
    pub name: String,
    pub offset: u32,
    /// In slots.
    pub width: u32,
    pub ty: SlotType,
    pub writer: Writer,
    pub doc: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotType {
    U32,
    /// Variant names; the slot holds the index.
    Enum(Vec<String>),
    /// `len` bytes, little-endian within each slot.
    Bytes {
        len: u32,
    },
}

impl SlotType {
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
    pub fn slot(&self, name: &str) -> Option<&SlotField> {
        self.slots.iter().find(|s| s.name == name)
    }
    pub fn has_action(&self, name: &str) -> bool {
        self.actions.iter().any(|a| a.name == name)
    }
    pub fn has_predicate(&self, name: &str) -> bool {
        self.predicates.iter().any(|a| a.name == name)
    }
}

/// A machine (`specs/scheduler.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    pub doc: String,
    pub initial: String,
    /// In file order.
    pub constants: Vec<(String, i64)>,
    /// In file order: checked first to last before every step.
    pub interrupts: Vec<Interrupt>,
    /// In file order; the initial state need not be first.
    pub states: Vec<State>,
}

impl Machine {
    pub fn constant(&self, name: &str) -> Option<i64> {
        self.constants
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupt {
    pub name: String,
    pub guard: Guard,
    pub body: Vec<Stmt>,
    /// None: stay in the current state.
    pub target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub name: String,
    pub doc: String,
    /// Ordered: the first whose guard holds fires.
    pub transitions: Vec<Transition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// None: always fires.
    pub guard: Option<Guard>,
    pub body: Vec<Stmt>,
    pub target: String,
}

/// A guard as written (for graphs) and resolved (for code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub source: String,
    pub expr: TExpr,
}

/// A resolved, type-checked expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TExpr {
    Int(i64),
    Bool(bool),
    Const {
        name: String,
        value: i64,
    },
    /// The raw `u32` word of a one-slot field (a number or an enum index).
    Slot {
        name: String,
        offset: u32,
    },
    /// An enum variant, compared with an enum slot's raw word.
    Variant {
        name: String,
        index: u32,
    },
    Predicate(String),
    Not(Box<TExpr>),
    Binary(BinOp, Box<TExpr>, Box<TExpr>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    Action(String),
    Update {
        slot: String,
        offset: u32,
        op: UpdateOp,
        value: TExpr,
        /// As written, e.g. `tokens_generated += 1`.
        source: String,
    },
}

impl Stmt {
    pub fn label(&self) -> String {
        match self {
            Stmt::Action(name) => name.clone(),
            Stmt::Update { source, .. } => source.clone(),
        }
    }
}
