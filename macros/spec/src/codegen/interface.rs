//! Code generated once per interface: `Slots` (32 `AtomicU32` behind a `SlotMemory`, typed
//! accessors, get/set by name), one Rust enum per enum slot, the `Actions` and `Guards` traits,
//! the `Action` enum, `Transition`/`Cause`, and the `Machine` trait every machine implements.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::bytes_literal;
use crate::canon;
use crate::ir::{Interface, SLOT_COUNT, SlotField, SlotType, Writer};
use crate::walk::camel;

/// Tokens for `interface!`. `tracked` are absolute paths of files whose change must rebuild the
/// invoking crate (emitted as `include_bytes!`).
pub fn interface_tokens(i: &Interface, tracked: &[String]) -> TokenStream {
    let name = &i.name;
    let doc = format!("Interface `{}`: {}", i.name, i.doc);
    let digest = bytes_literal(&canon::interface_digest(i));
    let canonical = canon::interface_text(i);
    let n = Literal::usize_unsuffixed(SLOT_COUNT as usize);
    let enums = i.slots.iter().filter_map(enum_tokens);
    let slots = slots_tokens(i);
    let actions = actions_tokens(i);
    let machine = machine_trait_tokens();
    quote! {
        #(const _: &[u8] = include_bytes!(#tracked);)*

        #[doc = #doc]
        pub const INTERFACE_NAME: &str = #name;
        /// BLAKE3 of the interface's canonical text ([`INTERFACE_CANONICAL`]).
        pub const INTERFACE_DIGEST: [u8; 32] = #digest;
        /// Canonical text of the interface (what [`INTERFACE_DIGEST`] hashes).
        pub const INTERFACE_CANONICAL: &str = #canonical;
        /// Number of `u32` slots of the control surface.
        pub const SLOT_COUNT: usize = #n;

        #(#enums)*
        #slots
        #actions
        #machine

        /// Arithmetic used by generated guards: wrapping, and `/ %` by zero give 0, so no slot
        /// value can make a step panic.
        #[doc(hidden)]
        pub mod __ops {
            pub const fn add(a: i64, b: i64) -> i64 { a.wrapping_add(b) }
            pub const fn sub(a: i64, b: i64) -> i64 { a.wrapping_sub(b) }
            pub const fn mul(a: i64, b: i64) -> i64 { a.wrapping_mul(b) }
            pub const fn div(a: i64, b: i64) -> i64 {
                match a.checked_div(b) { Some(v) => v, None => 0 }
            }
            pub const fn rem(a: i64, b: i64) -> i64 {
                match a.checked_rem(b) { Some(v) => v, None => 0 }
            }
        }
    }
}

fn enum_tokens(field: &SlotField) -> Option<TokenStream> {
    let SlotType::Enum(variants) = &field.ty else {
        return None;
    };
    let ty = format_ident!("{}", camel(&field.name));
    let doc = format!("Values of slot `{}`: {}", field.name, field.doc);
    let idents: Vec<_> = variants
        .iter()
        .map(|v| format_ident!("{}", camel(v)))
        .collect();
    let raws: Vec<_> = (0..variants.len())
        .map(|k| Literal::u32_unsuffixed(k as u32))
        .collect();
    let docs: Vec<_> = raws
        .iter()
        .zip(variants)
        .map(|(r, v)| format!("`{v}` (raw value {r})"))
        .collect();
    let count = Literal::usize_unsuffixed(variants.len());
    let first = idents.first()?;
    Some(quote! {
        #[doc = #doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum #ty {
            #[default]
            #(#[doc = #docs] #idents = #raws,)*
        }

        impl #ty {
            /// Every variant, in raw-value order.
            pub const ALL: [Self; #count] = [#(Self::#idents),*];
            /// The name used in specs and by `Slots::set_by_name`.
            pub const fn name(self) -> &'static str {
                match self { #(Self::#idents => #variants,)* }
            }
            /// The raw slot value.
            pub const fn raw(self) -> u32 { self as u32 }
            /// The variant stored as `raw`, if any.
            pub const fn from_raw(raw: u32) -> Option<Self> {
                match raw { #(#raws => Some(Self::#idents),)* _ => None }
            }
            /// The variant named `name`, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { #(#variants => Some(Self::#idents),)* _ => None }
            }
            /// Reads a raw value, falling back to the first variant when out of range.
            pub const fn from_raw_or_default(raw: u32) -> Self {
                match Self::from_raw(raw) { Some(v) => v, None => Self::#first }
            }
        }

        impl ::std::fmt::Display for #ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    })
}

fn slot_field_entry(f: &SlotField) -> TokenStream {
    let name = &f.name;
    let offset = Literal::usize_unsuffixed(f.offset as usize);
    let width = Literal::usize_unsuffixed(f.width as usize);
    let doc = &f.doc;
    let ty = match &f.ty {
        SlotType::U32 => quote! { SlotType::U32 },
        SlotType::Enum(v) => quote! { SlotType::Enum { variants: &[#(#v),*] } },
        SlotType::Bytes { len } => {
            let len = Literal::usize_unsuffixed(*len as usize);
            quote! { SlotType::Bytes { len: #len } }
        }
    };
    let writer = match f.writer {
        Writer::Runtime => quote! { SlotWriter::Runtime },
        Writer::Machine => quote! { SlotWriter::Machine },
    };
    quote! {
        SlotField { name: #name, offset: #offset, width: #width, ty: #ty, writer: #writer, doc: #doc }
    }
}

/// Typed accessors, `get_by_name` and `set_by_name` arms for one field.
fn accessors(f: &SlotField) -> (TokenStream, TokenStream, TokenStream) {
    let name = &f.name;
    let get = format_ident!("{}", f.name);
    let set = format_ident!("set_{}", f.name);
    let off = Literal::usize_unsuffixed(f.offset as usize);
    let doc = format!("Slot `{}` (slot {}): {}", f.name, f.offset, f.doc);
    let set_doc = format!("Sets slot `{}` (slot {}).", f.name, f.offset);
    match &f.ty {
        SlotType::U32 => (
            quote! {
                #[doc = #doc]
                pub fn #get(&self) -> u32 { self.cells()[#off].load(::std::sync::atomic::Ordering::Acquire) }
                #[doc = #set_doc]
                pub fn #set(&self, value: u32) { self.cells()[#off].store(value, ::std::sync::atomic::Ordering::Release) }
            },
            quote! { #name => Ok(self.#get().to_string()), },
            quote! {
                #name => {
                    let v = parse_u32(value).ok_or_else(|| SlotError::BadValue {
                        field: #name, value: value.to_string(),
                        expected: "a number in 0..=4294967295 (decimal or 0x hex)".to_string(),
                    })?;
                    self.#set(v);
                    Ok(())
                }
            },
        ),
        SlotType::Enum(variants) => {
            let ty = format_ident!("{}", camel(&f.name));
            let raw = format_ident!("{}_raw", f.name);
            let raw_doc = format!(
                "Raw value of slot `{}` (may be out of range of [`{ty}`]).",
                f.name
            );
            let doc = format!(
                "{doc} Out-of-range raw values read as the first variant; see `{}_raw`.",
                f.name
            );
            let expected = format!("one of {} (or its number)", variants.join(", "));
            (
                quote! {
                    #[doc = #doc]
                    pub fn #get(&self) -> #ty { #ty::from_raw_or_default(self.#raw()) }
                    #[doc = #raw_doc]
                    pub fn #raw(&self) -> u32 { self.cells()[#off].load(::std::sync::atomic::Ordering::Acquire) }
                    #[doc = #set_doc]
                    pub fn #set(&self, value: #ty) { self.cells()[#off].store(value.raw(), ::std::sync::atomic::Ordering::Release) }
                },
                quote! {
                    #name => Ok(match #ty::from_raw(self.#raw()) {
                        Some(v) => v.name().to_string(),
                        None => self.#raw().to_string(),
                    }),
                },
                quote! {
                    #name => {
                        let v = #ty::from_name(value)
                            .or_else(|| parse_u32(value).and_then(#ty::from_raw))
                            .ok_or_else(|| SlotError::BadValue {
                                field: #name, value: value.to_string(), expected: #expected.to_string(),
                            })?;
                        self.#set(v);
                        Ok(())
                    }
                },
            )
        }
        SlotType::Bytes { len } => {
            let len_lit = Literal::usize_unsuffixed(*len as usize);
            let expected = format!("{} hex digits ({len} bytes)", 2 * len);
            (
                quote! {
                    #[doc = #doc]
                    pub fn #get(&self) -> [u8; #len_lit] {
                        let mut out = [0u8; #len_lit];
                        for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
                            let word = self.word(#off + i).unwrap_or(0);
                            for (dst, src) in chunk.iter_mut().zip(word.to_le_bytes()) {
                                *dst = src;
                            }
                        }
                        out
                    }
                    #[doc = #set_doc]
                    pub fn #set(&self, value: &[u8; #len_lit]) {
                        for (i, chunk) in value.chunks_exact(4).enumerate() {
                            let mut word = [0u8; 4];
                            for (dst, src) in word.iter_mut().zip(chunk) {
                                *dst = *src;
                            }
                            self.set_word(#off + i, u32::from_le_bytes(word));
                        }
                    }
                },
                quote! { #name => Ok(hex(&self.#get())), },
                quote! {
                    #name => {
                        let mut bytes = [0u8; #len_lit];
                        if !parse_hex(value, &mut bytes) {
                            return Err(SlotError::BadValue {
                                field: #name, value: value.to_string(), expected: #expected.to_string(),
                            });
                        }
                        self.#set(&bytes);
                        Ok(())
                    }
                },
            )
        }
    }
}

fn slots_tokens(i: &Interface) -> TokenStream {
    let entries = i.slots.iter().map(slot_field_entry);
    let (mut access, mut gets, mut sets) = (Vec::new(), Vec::new(), Vec::new());
    for f in &i.slots {
        let (a, g, s) = accessors(f);
        access.push(a);
        gets.push(g);
        sets.push(s);
    }
    let known = i
        .slots
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let n = Literal::usize_unsuffixed(SLOT_COUNT as usize);
    quote! {
        /// The type of a slot field.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum SlotType {
            /// One slot, an unsigned number.
            U32,
            /// One slot holding the index of one of `variants`.
            Enum {
                /// Variant names in spec order; the slot holds the index (0 = first).
                variants: &'static [&'static str],
            },
            /// `len` bytes over `len / 4` slots, little-endian within each slot.
            Bytes {
                /// Number of bytes (4 per slot).
                len: usize,
            },
        }

        /// Who writes a slot field.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum SlotWriter {
            /// The runtime keeps it current; machines only read it.
            Runtime,
            /// Machines' slot updates write it.
            Machine,
        }

        /// One field of the slot layout.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct SlotField {
            /// Field name as written in the interface spec.
            pub name: &'static str,
            /// First slot.
            pub offset: usize,
            /// In slots.
            pub width: usize,
            /// What the slots hold.
            pub ty: SlotType,
            /// Who may change the field.
            pub writer: SlotWriter,
            /// The field's `doc` string from the interface spec (may be empty).
            pub doc: &'static str,
        }

        /// The slot layout, by offset (what `sov slots get` lists).
        pub const SLOT_FIELDS: &[SlotField] = &[#(#entries),*];

        /// Error of [`Slots::get_by_name`] and [`Slots::set_by_name`].
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum SlotError {
            /// No field has this name.
            UnknownField {
                /// The name asked for.
                name: String,
            },
            /// The value does not fit the field.
            BadValue {
                /// The field's name.
                field: &'static str,
                /// The text that was given.
                value: String,
                /// What the field accepts, in words.
                expected: String,
            },
        }

        impl ::std::fmt::Display for SlotError {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self {
                    SlotError::UnknownField { name } => {
                        write!(f, "unknown slot field `{}` (known: {})", name, #known)
                    }
                    SlotError::BadValue { field, value, expected } => {
                        write!(f, "bad value `{}` for slot field `{}`: expected {}", value, field, expected)
                    }
                }
            }
        }

        impl ::std::error::Error for SlotError {}

        /// Memory holding the 32 slot words: the heap ([`HeapSlotMemory`]) or, for the live
        /// control surface, a shared mapping another process can read and write.
        pub trait SlotMemory: Send + Sync {
            /// The slot words, indexed by slot offset.
            fn cells(&self) -> &[::std::sync::atomic::AtomicU32; #n];
        }

        /// Slot words on the heap.
        #[derive(Debug, Default)]
        pub struct HeapSlotMemory {
            cells: [::std::sync::atomic::AtomicU32; #n],
        }

        impl SlotMemory for HeapSlotMemory {
            fn cells(&self) -> &[::std::sync::atomic::AtomicU32; #n] {
                &self.cells
            }
        }

        /// The 32-slot control surface with typed accessors. Clones share the same memory.
        /// Loads are `Acquire`, stores `Release`; no accessor panics on any stored value.
        #[derive(Clone)]
        pub struct Slots {
            memory: ::std::sync::Arc<dyn SlotMemory>,
        }

        impl Default for Slots {
            fn default() -> Self { Self::new() }
        }

        impl ::std::fmt::Debug for Slots {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let mut m = f.debug_map();
                for field in SLOT_FIELDS {
                    m.entry(&field.name, &self.get_by_name(field.name).unwrap_or_default());
                }
                m.finish()
            }
        }

        fn parse_u32(value: &str) -> Option<u32> {
            let v = value.trim();
            match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => v.parse::<u32>().ok(),
            }
        }

        fn hex(bytes: &[u8]) -> String {
            bytes.iter().map(|b| format!("{:02x}", b)).collect()
        }

        /// Fills `out` from exactly `2 * out.len()` hex digits.
        fn parse_hex(value: &str, out: &mut [u8]) -> bool {
            let digits = value.trim().as_bytes();
            if digits.len() != 2 * out.len() {
                return false;
            }
            for (dst, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
                let s = match ::std::str::from_utf8(pair) { Ok(s) => s, Err(_) => return false };
                match u8::from_str_radix(s, 16) { Ok(b) => *dst = b, Err(_) => return false }
            }
            true
        }

        impl Slots {
            /// Zeroed slots on the heap.
            pub fn new() -> Self {
                Self::from_memory(::std::sync::Arc::new(HeapSlotMemory::default()))
            }

            /// Slots over caller-provided memory (e.g. a mapped file).
            pub fn from_memory(memory: ::std::sync::Arc<dyn SlotMemory>) -> Self {
                Self { memory }
            }

            /// The memory behind these slots.
            pub fn memory(&self) -> &::std::sync::Arc<dyn SlotMemory> {
                &self.memory
            }

            fn cells(&self) -> &[::std::sync::atomic::AtomicU32; #n] {
                self.memory.cells()
            }

            /// The layout table.
            pub fn fields() -> &'static [SlotField] {
                SLOT_FIELDS
            }

            /// Word `index`, or None past the last slot.
            pub fn word(&self, index: usize) -> Option<u32> {
                self.cells().get(index).map(|c| c.load(::std::sync::atomic::Ordering::Acquire))
            }

            /// Sets word `index`; false past the last slot.
            pub fn set_word(&self, index: usize, value: u32) -> bool {
                match self.cells().get(index) {
                    Some(c) => { c.store(value, ::std::sync::atomic::Ordering::Release); true }
                    None => false,
                }
            }

            /// All words (each loaded on its own: not one atomic snapshot).
            pub fn raw(&self) -> [u32; #n] {
                let mut out = [0u32; #n];
                for (dst, c) in out.iter_mut().zip(self.cells().iter()) {
                    *dst = c.load(::std::sync::atomic::Ordering::Acquire);
                }
                out
            }

            /// Stores all words (e.g. from a checkpoint snapshot).
            pub fn load_raw(&self, words: &[u32; #n]) {
                for (c, w) in self.cells().iter().zip(words.iter()) {
                    c.store(*w, ::std::sync::atomic::Ordering::Release);
                }
            }

            /// Generated guards read slots as `i64`; past the last slot reads 0.
            #[doc(hidden)]
            pub fn __read(&self, index: usize) -> i64 {
                i64::from(self.word(index).unwrap_or(0))
            }

            /// Generated slot updates store `value` clamped to `0..=u32::MAX`.
            #[doc(hidden)]
            pub fn __write_saturating(&self, index: usize, value: i64) {
                let v = value.clamp(0, i64::from(u32::MAX)) as u32;
                self.set_word(index, v);
            }

            #(#access)*

            /// The field's value as text: numbers in decimal, enum variants by name (raw number
            /// if out of range), bytes in lower-case hex.
            pub fn get_by_name(&self, name: &str) -> Result<String, SlotError> {
                match name {
                    #(#gets)*
                    _ => Err(SlotError::UnknownField { name: name.to_string() }),
                }
            }

            /// Sets a field from text: numbers in decimal or `0x` hex, enum variants by name or
            /// number, bytes as exactly `2 * len` hex digits.
            pub fn set_by_name(&self, name: &str, value: &str) -> Result<(), SlotError> {
                match name {
                    #(#sets)*
                    _ => Err(SlotError::UnknownField { name: name.to_string() }),
                }
            }
        }
    }
}

fn actions_tokens(i: &Interface) -> TokenStream {
    let names: Vec<&str> = i.actions.iter().map(|a| a.name.as_str()).collect();
    let methods: Vec<_> = names.iter().map(|n| format_ident!("{}", n)).collect();
    let variants: Vec<_> = names
        .iter()
        .map(|n| format_ident!("{}", camel(n)))
        .collect();
    let docs: Vec<&str> = i.actions.iter().map(|a| a.doc.as_str()).collect();
    let count = Literal::usize_unsuffixed(names.len());
    let preds: Vec<_> = i
        .predicates
        .iter()
        .map(|p| format_ident!("{}", p.name))
        .collect();
    let pred_names: Vec<&str> = i.predicates.iter().map(|p| p.name.as_str()).collect();
    let pred_docs: Vec<&str> = i.predicates.iter().map(|p| p.doc.as_str()).collect();
    quote! {
        /// The actions the runtime performs, one method per action of the interface. The runtime
        /// implements this once; every machine calls it.
        pub trait Actions {
            /// Error of a failed action; `step` returns it and leaves the machine's state as it
            /// was (slot updates listed before the failed action have been applied).
            type Error: ::std::error::Error + Send + Sync + 'static;
            #(#[doc = #docs] fn #methods(&mut self) -> Result<(), Self::Error>;)*
        }

        /// The predicates the runtime answers, one method per predicate of the interface.
        pub trait Guards {
            #(#[doc = #pred_docs] fn #preds(&self) -> bool;)*
        }

        /// Names and doc lines of the predicates.
        pub const PREDICATES: &[(&str, &str)] = &[#((#pred_names, #pred_docs)),*];

        /// Answers predicate `name`, or None if the interface has none of that name.
        pub fn predicate_by_name<G: Guards + ?Sized>(guards: &G, name: &str) -> Option<bool> {
            match name {
                #(#pred_names => Some(guards.#preds()),)*
                _ => None,
            }
        }

        /// An action of the interface, as recorded in a [`Transition`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Action {
            #(#[doc = #docs] #variants,)*
        }

        impl Action {
            /// Every action, in interface order.
            pub const ALL: [Self; #count] = [#(Self::#variants),*];
            /// The action's name in specs.
            pub const fn name(self) -> &'static str {
                match self { #(Self::#variants => #names,)* }
            }
            /// The action's doc line.
            pub const fn doc(self) -> &'static str {
                match self { #(Self::#variants => #docs,)* }
            }
            /// The action named `name`, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { #(#names => Some(Self::#variants),)* _ => None }
            }
            /// Runs the action on `rt`.
            pub fn run<R: Actions + ?Sized>(self, rt: &mut R) -> Result<(), R::Error> {
                match self { #(Self::#variants => rt.#methods(),)* }
            }
        }

        impl ::std::fmt::Display for Action {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    }
}

fn machine_trait_tokens() -> TokenStream {
    quote! {
        /// Why a step took the transition it took.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Cause {
            /// The interrupt of this name fired (checked before the state's transitions).
            Interrupt(&'static str),
            /// The state's transition at this 0-based index fired.
            Rule(usize),
            /// No interrupt and no transition held: the machine stayed and did nothing.
            Stay,
        }

        /// What one `step` did: from and to state, the rule that fired, the actions it ran and
        /// the slot updates it applied (as written in the spec), in order of the `do` list.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Transition<S> {
            /// State before the step.
            pub from: S,
            /// State after the step (equal to `from` when the machine stayed).
            pub to: S,
            /// The interrupt or transition that fired, or [`Cause::Stay`].
            pub cause: Cause,
            /// Actions run, in order.
            pub actions: Vec<Action>,
            /// Slot updates applied, as written in the spec (e.g. `tokens_generated += 1`).
            pub updates: Vec<&'static str>,
        }

        impl<S: PartialEq> Transition<S> {
            /// True when the step changed nothing: same state, no action, no update. An engine
            /// loop waits for an event (new request, slot write) before stepping again.
            pub fn is_noop(&self) -> bool {
                self.from == self.to && self.actions.is_empty() && self.updates.is_empty()
            }
        }

        /// `set_state_by_name` was given a name that is not a state of the machine.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct UnknownState {
            /// The machine's name (`[machine] name`).
            pub machine: &'static str,
            /// The name that was given.
            pub name: String,
        }

        impl ::std::fmt::Display for UnknownState {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "machine `{}` has no state `{}`", self.machine, self.name)
            }
        }

        impl ::std::error::Error for UnknownState {}

        /// A scheduler generated from a machine spec. The engine is generic over it, so any
        /// machine written against this interface runs on the same runtime.
        pub trait Machine: Send + Sized {
            /// The machine's state enum.
            type State: Copy + Eq + ::std::hash::Hash + ::std::fmt::Debug + Send + Sync + 'static;
            /// The machine's name (`[machine] name`).
            const NAME: &'static str;
            /// BLAKE3 of the canonical interface and machine text (receipts carry it).
            const SPEC_DIGEST: [u8; 32];
            /// Mermaid `stateDiagram-v2` of the machine.
            const MERMAID: &'static str;
            /// Graphviz DOT of the machine.
            const DOT: &'static str;
            /// State names in spec order.
            const STATE_NAMES: &'static [&'static str];
            /// The machine's constants (`checkpoint_every`, `max_tokens`, `block_size`, ...).
            const CONSTANTS: &'static [(&'static str, i64)];

            /// A machine in its initial state.
            fn new() -> Self;
            /// The current state.
            fn state(&self) -> Self::State;
            /// The current state's name.
            fn state_name(&self) -> &'static str;
            /// Sets the state by name (checkpoint restore).
            fn set_state_by_name(&mut self, name: &str) -> Result<(), UnknownState>;
            /// A constant by name.
            fn constant(name: &str) -> Option<i64> {
                Self::CONSTANTS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
            }
            /// One step: the first interrupt whose guard holds, else the current state's first
            /// transition whose guard holds, else stay. Runs its `do` list in order (actions on
            /// `rt`, updates on `slots`), moves to its target and returns what it did. On an
            /// action error the state is unchanged and the error returned. Never panics.
            fn step<R: Actions + Guards>(
                &mut self,
                rt: &mut R,
                slots: &Slots,
            ) -> Result<Transition<Self::State>, R::Error>;
        }
    }
}
