//! Code generated per machine: its `State` enum, constants, digest, graphs and a `Scheduler`
//! implementing the interface's `Machine` trait. `step` is one expression: the interrupts as an
//! `if` chain, then a `match` on the state whose arms are each state's transitions as an `if`
//! chain ending in "stay" (or in the state's unguarded transition).

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::bytes_literal;
use super::expr::{expr_tokens, stmt_tokens};
use crate::LoadedMachine;
use crate::canon;
use crate::graph;
use crate::ir::{Stmt, TExpr};
use crate::walk::camel;

/// Tokens for `machine!`. `iface` is the path of the module where `interface!` expanded;
/// `tracked` are absolute paths whose change must rebuild the invoking crate.
pub fn machine_tokens(lm: &LoadedMachine, iface: &TokenStream, tracked: &[String]) -> TokenStream {
    let m = &lm.machine;
    let name = &m.name;
    let doc = format!("Machine `{}`: {}", m.name, m.doc);
    let digest = bytes_literal(&lm.digest());
    let iface_digest = bytes_literal(&canon::interface_digest(&lm.interface));
    let canonical = canon::spec_text(&lm.interface, m);
    let mermaid = graph::mermaid(m);
    let dot = graph::dot(m);
    let mismatch = format!(
        "machine `{}` was validated against interface file {}, but the interface module it names was generated from a different interface",
        m.name,
        lm.interface_path.display()
    );

    let state_names: Vec<&str> = m.states.iter().map(|s| s.name.as_str()).collect();
    let state_idents: Vec<_> = state_names
        .iter()
        .map(|s| format_ident!("{}", camel(s)))
        .collect();
    let state_docs: Vec<&str> = m.states.iter().map(|s| s.doc.as_str()).collect();
    let count = Literal::usize_unsuffixed(state_names.len());
    let initial = format_ident!("{}", camel(&m.initial));

    let const_names: Vec<&str> = m.constants.iter().map(|(n, _)| n.as_str()).collect();
    let const_values: Vec<_> = m
        .constants
        .iter()
        .map(|(_, v)| Literal::i64_suffixed(*v))
        .collect();
    let const_idents: Vec<_> = const_names
        .iter()
        .map(|n| format_ident!("{}", n.to_ascii_uppercase()))
        .collect();
    let const_docs: Vec<String> = const_names
        .iter()
        .map(|n| format!("Constant `{n}` of the spec."))
        .collect();

    let step = step_body(lm, iface);

    quote! {
        #(const _: &[u8] = include_bytes!(#tracked);)*

        #[doc = #doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum State {
            #(#[doc = #state_docs] #state_idents,)*
        }

        impl State {
            /// Every state, in spec order.
            pub const ALL: [Self; #count] = [#(Self::#state_idents),*];
            /// The state's name in the spec.
            pub const fn name(self) -> &'static str {
                match self { #(Self::#state_idents => #state_names,)* }
            }
            /// The state named `name`, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { #(#state_names => Some(Self::#state_idents),)* _ => None }
            }
        }

        impl ::std::fmt::Display for State {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        /// The machine's name.
        pub const NAME: &str = #name;
        /// The initial state.
        pub const INITIAL: State = State::#initial;
        /// BLAKE3 of [`CANONICAL`]: identifies this interface and machine in receipts.
        pub const SPEC_DIGEST: [u8; 32] = #digest;
        /// Canonical text of interface and machine (comments and docs excluded).
        pub const CANONICAL: &str = #canonical;
        /// Mermaid `stateDiagram-v2` of the machine.
        pub const MERMAID: &str = #mermaid;
        /// Graphviz DOT of the machine.
        pub const DOT: &str = #dot;
        /// The spec's constants.
        pub const CONSTANTS: &[(&str, i64)] = &[#((#const_names, #const_values)),*];
        #(#[doc = #const_docs] pub const #const_idents: i64 = #const_values;)*

        const _: () = {
            let expected: [u8; 32] = #iface_digest;
            let found = #iface::INTERFACE_DIGEST;
            let mut i = 0;
            while i < 32 {
                if expected[i] != found[i] {
                    panic!(#mismatch);
                }
                i += 1;
            }
        };

        /// The generated scheduler: holds the current state; `step` runs the spec.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Scheduler {
            state: State,
        }

        impl Default for Scheduler {
            fn default() -> Self { Self { state: INITIAL } }
        }

        impl #iface::Machine for Scheduler {
            type State = State;
            const NAME: &'static str = NAME;
            const SPEC_DIGEST: [u8; 32] = SPEC_DIGEST;
            const MERMAID: &'static str = MERMAID;
            const DOT: &'static str = DOT;
            const STATE_NAMES: &'static [&'static str] = &[#(#state_names),*];
            const CONSTANTS: &'static [(&'static str, i64)] = CONSTANTS;

            fn new() -> Self { Self::default() }
            fn state(&self) -> State { self.state }
            fn state_name(&self) -> &'static str { self.state.name() }
            fn set_state_by_name(&mut self, name: &str) -> Result<(), #iface::UnknownState> {
                match State::from_name(name) {
                    Some(s) => { self.state = s; Ok(()) }
                    None => Err(#iface::UnknownState { machine: NAME, name: name.to_string() }),
                }
            }

            #[allow(unused_parens, unused_variables, clippy::all)]
            fn step<R: #iface::Actions + #iface::Guards>(
                &mut self,
                rt: &mut R,
                slots: &#iface::Slots,
            ) -> Result<#iface::Transition<State>, R::Error> {
                let from = self.state;
                let transition: #iface::Transition<State> = #step;
                self.state = transition.to;
                Ok(transition)
            }
        }
    }
}

/// The block that runs `body`, then yields the transition to `to` with `cause`.
fn fire(body: &[Stmt], to: TokenStream, cause: TokenStream, iface: &TokenStream) -> TokenStream {
    let stmts = body.iter().map(|s| stmt_tokens(s, iface));
    let actions = body.iter().filter_map(|s| match s {
        Stmt::Action(a) => {
            let v = format_ident!("{}", camel(a));
            Some(quote! { #iface::Action::#v })
        }
        Stmt::Update { .. } => None,
    });
    let updates = body.iter().filter_map(|s| match s {
        Stmt::Update { source, .. } => Some(source.as_str()),
        Stmt::Action(_) => None,
    });
    quote! {
        {
            #(#stmts)*
            #iface::Transition {
                from,
                to: #to,
                cause: #cause,
                actions: vec![#(#actions),*],
                updates: vec![#(#updates),*],
            }
        }
    }
}

fn step_body(lm: &LoadedMachine, iface: &TokenStream) -> TokenStream {
    let m = &lm.machine;
    let stay = quote! {
        #iface::Transition {
            from, to: from, cause: #iface::Cause::Stay, actions: Vec::new(), updates: Vec::new(),
        }
    };
    let arms = m.states.iter().map(|s| {
        let ident = format_ident!("{}", camel(&s.name));
        let mut chain = stay.clone();
        // Build the if-chain from the last transition backwards.
        for (index, t) in s.transitions.iter().enumerate().rev() {
            let target = format_ident!("{}", camel(&t.target));
            let idx = Literal::usize_unsuffixed(index);
            let block = fire(
                &t.body,
                quote! { State::#target },
                quote! { #iface::Cause::Rule(#idx) },
                iface,
            );
            chain = match &t.guard {
                Some(g) if g.expr != TExpr::Bool(true) => {
                    let cond = expr_tokens(&g.expr, iface);
                    quote! { if #cond #block else { #chain } }
                }
                _ => block,
            };
        }
        quote! { State::#ident => #chain, }
    });
    let mut chain = quote! { match from { #(#arms)* } };
    for i in m.interrupts.iter().rev() {
        let to = match &i.target {
            Some(t) => {
                let t = format_ident!("{}", camel(t));
                quote! { State::#t }
            }
            None => quote! { from },
        };
        let name = &i.name;
        let block = fire(
            &i.body,
            to,
            quote! { #iface::Cause::Interrupt(#name) },
            iface,
        );
        let cond = expr_tokens(&i.guard.expr, iface);
        chain = quote! { if #cond #block else { #chain } };
    }
    chain
}
