//! The canonical form of a spec and its BLAKE3 digest (the `SPEC_DIGEST` receipts carry).
//!
//! The canonical form is a line-oriented text built from the validated IR, so comments, doc
//! lines, key order, whitespace and quoting do not change the digest, while every change of
//! behaviour (a slot offset, a guard, an action, a constant, a target) does. Slots are listed by
//! offset, actions, predicates, constants and states by name, interrupts and transitions in
//! their (meaningful) order; expressions fully parenthesised.

use std::fmt::Write;

use crate::ir::{Interface, Machine, SlotType, Stmt, TExpr, Writer};

/// Version tag of the canonical form; bump it when the format changes.
pub const CANONICAL_VERSION: &str = "sov-spec-canonical-v1";

/// The canonical text of an interface: the version and name lines, then slots by offset, actions
/// and predicates by name (doc strings left out).
pub fn interface_text(i: &Interface) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{CANONICAL_VERSION}");
    let _ = writeln!(out, "interface {}", i.name);
    for s in &i.slots {
        let ty = match &s.ty {
            SlotType::U32 => "u32".to_string(),
            SlotType::Enum(v) => format!("enum({})", v.join(",")),
            SlotType::Bytes { len } => format!("bytes({len})"),
        };
        let writer = match s.writer {
            Writer::Runtime => "runtime",
            Writer::Machine => "machine",
        };
        let _ = writeln!(
            out,
            "slot {} offset={} width={} type={ty} writer={writer}",
            s.name, s.offset, s.width
        );
    }
    let mut actions: Vec<&str> = i.actions.iter().map(|a| a.name.as_str()).collect();
    actions.sort_unstable();
    for a in actions {
        let _ = writeln!(out, "action {a}");
    }
    let mut preds: Vec<&str> = i.predicates.iter().map(|a| a.name.as_str()).collect();
    preds.sort_unstable();
    for p in preds {
        let _ = writeln!(out, "predicate {p}");
    }
    out
}

/// The canonical text of a machine (without its interface): initial state, constants and states
/// by name, interrupts and transitions in order, expressions fully parenthesised.
pub fn machine_text(m: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "machine {} initial={}", m.name, m.initial);
    let mut consts = m.constants.clone();
    consts.sort();
    for (n, v) in consts {
        let _ = writeln!(out, "const {n}={v}");
    }
    for i in &m.interrupts {
        let _ = writeln!(
            out,
            "interrupt {} when {} do [{}] goto {}",
            i.name,
            expr_text(&i.guard.expr),
            body_text(&i.body),
            i.target.as_deref().unwrap_or("-")
        );
    }
    let mut states: Vec<_> = m.states.iter().collect();
    states.sort_by(|a, b| a.name.cmp(&b.name));
    for s in states {
        let _ = writeln!(out, "state {}", s.name);
        for t in &s.transitions {
            let guard = t
                .guard
                .as_ref()
                .map_or("true".to_string(), |g| expr_text(&g.expr));
            let _ = writeln!(
                out,
                "  on {guard} do [{}] goto {}",
                body_text(&t.body),
                t.target
            );
        }
    }
    out
}

/// Canonical text of interface plus machine.
pub fn spec_text(i: &Interface, m: &Machine) -> String {
    interface_text(i) + &machine_text(m)
}

/// BLAKE3 of [`interface_text`].
pub fn interface_digest(i: &Interface) -> [u8; 32] {
    *blake3::hash(interface_text(i).as_bytes()).as_bytes()
}

/// BLAKE3 of the canonical interface and machine: the machine's `SPEC_DIGEST`.
pub fn spec_digest(i: &Interface, m: &Machine) -> [u8; 32] {
    *blake3::hash(spec_text(i, m).as_bytes()).as_bytes()
}

fn body_text(body: &[Stmt]) -> String {
    body.iter()
        .map(|s| match s {
            Stmt::Action(a) => a.clone(),
            Stmt::Update {
                slot, op, value, ..
            } => format!("{slot}{}{}", op.symbol(), expr_text(value)),
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// An expression in canonical form, fully parenthesised.
pub fn expr_text(e: &TExpr) -> String {
    match e {
        TExpr::Int(v) => v.to_string(),
        TExpr::Bool(b) => b.to_string(),
        TExpr::Const { name, value } => format!("{name}({value})"),
        TExpr::Slot { name, .. } => format!("slot.{name}"),
        TExpr::Variant { name, index } => format!("{name}({index})"),
        TExpr::Predicate(p) => format!("{p}?"),
        TExpr::Not(inner) => format!("!{}", expr_text(inner)),
        TExpr::Binary(op, l, r) => format!("({} {} {})", expr_text(l), op.symbol(), expr_text(r)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::machine_from_source;
    use crate::source::Source;

    fn specs() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs")
    }

    /// Digest of the shipped seed machine after `edit` of its text.
    fn digest_after(edit: impl Fn(&str) -> String) -> [u8; 32] {
        let path = specs().join("scheduler.toml");
        let text = std::fs::read_to_string(&path).expect("shipped spec");
        let src = Source::new(path, edit(&text));
        match machine_from_source(&src) {
            Ok(m) => m.digest(),
            Err(d) => panic!("{d:#?}"),
        }
    }

    #[test]
    fn digest_ignores_comments_docs_and_layout() {
        let base = digest_after(str::to_string);
        let commented = digest_after(|t| format!("# a new comment\n{t}\n# trailing\n"));
        let redoc = digest_after(|t| {
            t.replace(
                "doc = \"Run the prompts of newly admitted sequences.\"",
                "doc = \"Something else entirely.\"",
            )
        });
        let spaced =
            digest_after(|t| t.replace("when = \"kv_exhausted\"", "when   =  'kv_exhausted'"));
        let reparen = digest_after(|t| {
            t.replace(
                "when = \"has_swapped && can_swap_in\"",
                "when = \"(has_swapped) && (can_swap_in)\"",
            )
        });
        assert_eq!(base, commented);
        assert_eq!(base, redoc);
        assert_eq!(base, spaced);
        assert_eq!(base, reparen);
    }

    #[test]
    fn digest_changes_with_behaviour() {
        let base = digest_after(str::to_string);
        let cadence = digest_after(|t| t.replace("checkpoint_every = 64", "checkpoint_every = 32"));
        let guard =
            digest_after(|t| t.replace("when = \"kv_exhausted\"", "when = \"!kv_exhausted\""));
        let order = digest_after(|t| {
            t.replacen(
                "do = [\"draft\", \"verify\"",
                "do = [\"verify\", \"draft\"",
                1,
            )
        });
        assert_ne!(base, cadence);
        assert_ne!(base, guard);
        assert_ne!(base, order);
        assert_ne!(cadence, guard);
    }

    #[test]
    fn graphs_name_every_transition() {
        let loaded = crate::load_machine(&specs().join("laptop.toml")).expect("shipped spec");
        let mermaid = crate::graph::mermaid(&loaded.machine);
        let dot = crate::graph::dot(&loaded.machine);
        let transitions: usize = loaded
            .machine
            .states
            .iter()
            .map(|s| s.transitions.len())
            .sum();
        let interrupts = loaded.machine.interrupts.len();
        assert_eq!(
            mermaid.matches(" --> ").count(),
            1 + transitions + interrupts
        );
        assert_eq!(dot.matches(" -> ").count(), 1 + transitions + interrupts);
        assert!(
            mermaid.contains("swap --> generate : kv_exhausted / preempt"),
            "{mermaid}"
        );
        assert!(
            dot.contains("\"swap\" -> \"generate\" [label=\"kv_exhausted / preempt\"];"),
            "{dot}"
        );
    }
}
