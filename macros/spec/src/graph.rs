//! Mermaid and Graphviz DOT renderings of a machine: one node per state, one edge per
//! transition labelled `guard / actions`, and interrupts as edges from an "any state" node.

use std::fmt::Write;

use crate::ir::{Machine, Stmt};

/// Output format of `sov spec graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// Mermaid `stateDiagram-v2` text.
    Mermaid,
    /// Graphviz DOT text.
    Dot,
}

fn label(guard: Option<&str>, body: &[Stmt]) -> String {
    let actions = body.iter().map(Stmt::label).collect::<Vec<_>>().join(", ");
    match (guard, actions.is_empty()) {
        (Some(g), true) => g.to_string(),
        (Some(g), false) => format!("{g} / {actions}"),
        (None, true) => "always".to_string(),
        (None, false) => format!("always / {actions}"),
    }
}

/// Mermaid `stateDiagram-v2` text.
pub fn mermaid(m: &Machine) -> String {
    // Mermaid treats `;` as a statement break and `#` as an entity start inside labels.
    let clean = |s: String| s.replace(';', ",").replace('#', "");
    let mut out = String::from("stateDiagram-v2\n");
    let _ = writeln!(out, "    [*] --> {}", m.initial);
    for s in &m.states {
        for t in &s.transitions {
            let l = clean(label(t.guard.as_ref().map(|g| g.source.as_str()), &t.body));
            let _ = writeln!(out, "    {} --> {} : {l}", s.name, t.target);
        }
    }
    if !m.interrupts.is_empty() {
        out.push_str("    state \"any state (interrupts)\" as any_state\n");
        for i in &m.interrupts {
            let target = i.target.as_deref().unwrap_or("any_state");
            let l = clean(label(Some(&i.guard.source), &i.body));
            let _ = writeln!(out, "    any_state --> {target} : {} - {l}", i.name);
        }
    }
    out
}

/// Graphviz DOT text.
pub fn dot(m: &Machine) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = format!("digraph \"{}\" {{\n", esc(&m.name));
    out.push_str("    rankdir=LR;\n    node [shape=box, style=rounded];\n");
    out.push_str("    __start [shape=point, label=\"\"];\n");
    let _ = writeln!(out, "    __start -> \"{}\";", esc(&m.initial));
    for s in &m.states {
        let _ = writeln!(out, "    \"{}\";", esc(&s.name));
    }
    for s in &m.states {
        for t in &s.transitions {
            let l = label(t.guard.as_ref().map(|g| g.source.as_str()), &t.body);
            let _ = writeln!(
                out,
                "    \"{}\" -> \"{}\" [label=\"{}\"];",
                esc(&s.name),
                esc(&t.target),
                esc(&l)
            );
        }
    }
    if !m.interrupts.is_empty() {
        out.push_str("    __any [shape=plaintext, label=\"any state (interrupts)\"];\n");
        for i in &m.interrupts {
            let target = i.target.as_deref().unwrap_or("__any");
            let l = format!("{}: {}", i.name, label(Some(&i.guard.source), &i.body));
            let _ = writeln!(
                out,
                "    __any -> \"{}\" [label=\"{}\", style=dashed];",
                esc(target),
                esc(&l)
            );
        }
    }
    out.push_str("}\n");
    out
}
