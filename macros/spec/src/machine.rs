//! Parsing and validation of a machine file (`specs/scheduler.toml`) against its interface:
//! name resolution and type checking of guards and `do` lists, then the whole-machine checks
//! (initial state, shadowed transitions, reachability, states with no way out).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;

use crate::expr::{self, BinOp, Expr, ExprKind, UpdateOp};
use crate::ir::{
    Guard, Interface, Interrupt, Machine, SlotField, SlotType, State, Stmt, TExpr, Transition,
    Writer,
};
use crate::walk::{Reader, SpannedStr, Table, Value, did_you_mean, entries, is_snake_ident};

/// Reads the `interface = "..."` path of a machine file's `[machine]` table, if present.
pub(crate) fn interface_path(r: &mut Reader<'_>, root: &Table<'_>) -> Option<SpannedStr> {
    let v = root.get("machine")?;
    let span = v.span();
    let t = r.table(v, "[machine]")?;
    r.req_string(t, &span, "interface", "[machine]")
}

/// Expression types.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ty {
    Int,
    Bool,
    /// A one-slot enum field's raw word.
    Enum,
}

/// A state's position in the file, for messages.
struct StateSpans {
    key: Range<usize>,
    targets: Vec<Option<SpannedStr>>,
}

struct Checker<'r, 'a> {
    r: &'r mut Reader<'a>,
    iface: &'r Interface,
    constants: HashMap<String, i64>,
}

pub(crate) fn read_machine(
    r: &mut Reader<'_>,
    iface: &Interface,
    root: &Table<'_>,
    root_span: &Range<usize>,
) -> Option<Machine> {
    r.deny_unknown(
        root,
        &["machine", "constants", "interrupts", "states"],
        "a machine file",
    );

    let header = root.get("machine").and_then(|v| {
        let span = v.span();
        r.table(v, "[machine]").map(|t| (t, span))
    });
    let (name, doc, initial) = match header {
        Some((t, span)) => {
            r.deny_unknown(t, &["name", "interface", "initial", "doc"], "[machine]");
            let name = r.req_string(t, &span, "name", "[machine]");
            let doc = r.opt_string(t, "doc", "[machine]");
            let initial = r.opt_string(t, "initial", "[machine]");
            if initial.is_none() {
                r.error(
                    span.clone(),
                    "no initial state: [machine] needs `initial = \"<state>\"`",
                );
            }
            (name, doc, initial)
        }
        None => {
            r.error(
                root_span.start..root_span.start,
                "a machine file needs a [machine] table (name, interface, initial)",
            );
            (None, None, None)
        }
    };

    let mut checker = Checker {
        r,
        iface,
        constants: HashMap::new(),
    };
    let constants = checker.constants(root);
    let interrupts = checker.interrupts(root);
    let (states, spans) = checker.states(root, root_span);
    let r = checker.r;

    let state_names: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
    let check_target = |r: &mut Reader<'_>, target: &SpannedStr| {
        if !state_names.contains(&target.value.as_str()) {
            r.error(
                target.span.clone(),
                format!(
                    "unknown state `{}`{}",
                    target.value,
                    did_you_mean(&target.value, state_names.iter().copied())
                ),
            );
        }
    };
    if let Some(initial) = &initial {
        check_target(r, initial);
    }
    for (_, _, target) in &interrupts {
        if let Some(t) = target {
            check_target(r, t);
        }
    }
    for s in &spans {
        for t in s.targets.iter().flatten() {
            check_target(r, t);
        }
    }

    let interrupts: Vec<Interrupt> = interrupts.into_iter().filter_map(|(i, _, _)| i).collect();
    let machine = Machine {
        name: name?.value,
        doc: doc.map(|d| d.value).unwrap_or_default(),
        initial: initial?.value,
        constants,
        interrupts,
        states,
    };
    if r.diags.is_empty() {
        check_graph(r, &machine, &spans);
    }
    Some(machine)
}

impl Checker<'_, '_> {
    fn constants(&mut self, root: &Table<'_>) -> Vec<(String, i64)> {
        let Some(v) = root.get("constants") else {
            return Vec::new();
        };
        let Some(t) = self.r.table(v, "[constants]") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, span, value) in entries(t) {
            if !is_snake_ident(name) {
                self.r.error(
                    span.clone(),
                    format!("constant name `{name}` must be lower snake case"),
                );
            }
            let clash = if self.iface.slot(name).is_some() {
                Some("slot")
            } else if self.iface.has_predicate(name) {
                Some("predicate")
            } else if self.iface.has_action(name) {
                Some("action")
            } else {
                None
            };
            if let Some(kind) = clash {
                self.r.error(
                    span.clone(),
                    format!("duplicate name `{name}`: the interface already declares a {kind} of that name"),
                );
            }
            if let Some(v) = self.r.integer(value, &format!("constant `{name}`")) {
                self.constants.insert(name.to_string(), v);
                out.push((name.to_string(), v));
            }
        }
        out
    }

    #[allow(clippy::type_complexity)]
    fn interrupts(
        &mut self,
        root: &Table<'_>,
    ) -> Vec<(Option<Interrupt>, Range<usize>, Option<SpannedStr>)> {
        let Some(v) = root.get("interrupts") else {
            return Vec::new();
        };
        let Some(items) = self.r.array(v, "[[interrupts]]") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut seen: HashMap<String, Range<usize>> = HashMap::new();
        let mut always: Option<String> = None;
        for item in items {
            let span = item.span();
            let Some(t) = self.r.table(item, "each [[interrupts]] entry") else {
                continue;
            };
            self.r
                .deny_unknown(t, &["name", "when", "do", "goto", "doc"], "an interrupt");
            let name = self.r.req_string(t, &span, "name", "an interrupt");
            if let Some(n) = &name {
                if !is_snake_ident(&n.value) {
                    self.r.error(
                        n.span.clone(),
                        format!("interrupt name `{}` must be lower snake case", n.value),
                    );
                }
                if let Some(first) = seen.get(&n.value) {
                    let (line, col) = self.r.src.line_col(first.start);
                    self.r.error(
                        n.span.clone(),
                        format!(
                            "duplicate name: interrupt `{}` is already declared at {line}:{col}",
                            n.value
                        ),
                    );
                } else {
                    seen.insert(n.value.clone(), n.span.clone());
                }
            }
            if let Some(first) = &always {
                self.r.error(
                    span.clone(),
                    format!("this interrupt can never fire: interrupt `{first}` before it has a guard that is always true"),
                );
            }
            let what = "an interrupt";
            let guard = match self.r.req_string(t, &span, "when", what) {
                Some(w) => self.guard(&w),
                None => None,
            };
            if let (Some(g), Some(n)) = (&guard, &name)
                && g.expr == TExpr::Bool(true)
                && always.is_none()
            {
                always = Some(n.value.clone());
            }
            let body = self.body(t);
            let target = self.r.opt_string(t, "goto", what);
            let interrupt = match (name, guard, body) {
                (Some(name), Some(guard), Some(body)) => Some(Interrupt {
                    name: name.value,
                    guard,
                    body,
                    target: target.as_ref().map(|t| t.value.clone()),
                }),
                _ => None,
            };
            out.push((interrupt, span, target));
        }
        if let Some(first) = always {
            let span = v.span();
            self.r.error(
                span,
                format!("interrupt `{first}` has a guard that is always true: it shadows every state's transitions"),
            );
        }
        out
    }

    fn states(
        &mut self,
        root: &Table<'_>,
        root_span: &Range<usize>,
    ) -> (Vec<State>, Vec<StateSpans>) {
        let Some(v) = root.get("states") else {
            self.r.error(
                root_span.start..root_span.start,
                "a machine file needs at least one [states.<name>] table",
            );
            return (Vec::new(), Vec::new());
        };
        let Some(t) = self.r.table(v, "[states]") else {
            return (Vec::new(), Vec::new());
        };
        let mut states = Vec::new();
        let mut spans = Vec::new();
        for (name, key_span, value) in entries(t) {
            if !is_snake_ident(name) {
                self.r.error(
                    key_span.clone(),
                    format!("state name `{name}` must be lower snake case and not a Rust keyword"),
                );
            }
            let what = format!("state `{name}`");
            let Some(st) = self.r.table(value, &what) else {
                continue;
            };
            self.r.deny_unknown(st, &["doc", "on"], &what);
            let doc = self.r.opt_string(st, "doc", &what).map(|d| d.value);
            let items: &[Value<'_>] = match st.get("on") {
                Some(on) => self
                    .r
                    .array(on, &format!("`on` of {what}"))
                    .unwrap_or_default(),
                None => &[],
            };
            let mut transitions = Vec::new();
            let mut state_spans = StateSpans {
                key: key_span.clone(),
                targets: Vec::new(),
            };
            let mut unguarded: Option<usize> = None;
            for (index, item) in items.iter().enumerate() {
                let span = item.span();
                let twhat = format!("transition {} of {what}", index + 1);
                let Some(tt) = self.r.table(item, &twhat) else {
                    continue;
                };
                self.r
                    .deny_unknown(tt, &["when", "do", "goto", "doc"], &twhat);
                if let Some(first) = unguarded {
                    self.r.error(
                        span.clone(),
                        format!(
                            "{twhat} can never fire: transition {} before it has no guard (or `when = \"true\"`) and always fires first",
                            first + 1
                        ),
                    );
                }
                let guard = match self.r.opt_string(tt, "when", &twhat) {
                    Some(w) => self.guard(&w).map(Some),
                    None => Some(None),
                };
                if unguarded.is_none()
                    && matches!(&guard, Some(None))
                        | matches!(&guard, Some(Some(g)) if g.expr == TExpr::Bool(true))
                {
                    unguarded = Some(index);
                }
                let body = self.body(tt);
                let target = self.r.req_string(tt, &span, "goto", &twhat);
                state_spans.targets.push(target.clone());
                if let (Some(guard), Some(body), Some(target)) = (guard, body, target) {
                    transitions.push(Transition {
                        guard,
                        body,
                        target: target.value,
                    });
                }
            }
            states.push(State {
                name: name.to_string(),
                doc: doc.unwrap_or_default(),
                transitions,
            });
            spans.push(state_spans);
        }
        if states.is_empty() {
            self.r.error(v.span(), "a machine needs at least one state");
        }
        (states, spans)
    }

    /// Parses and checks a `when` string.
    fn guard(&mut self, when: &SpannedStr) -> Option<Guard> {
        let parsed = match expr::parse_expr(&when.value) {
            Ok(e) => e,
            Err(e) => {
                self.r.error(
                    when.sub_span(&e.span),
                    format!("guard does not parse: {}", e.message),
                );
                return None;
            }
        };
        let (texpr, ty) = self.resolve(&parsed, when)?;
        if ty != Ty::Bool {
            self.r.error(
                when.span.clone(),
                "a guard must be true or false, but this expression is a number",
            );
            return None;
        }
        Some(Guard {
            source: when.value.clone(),
            expr: texpr,
        })
    }

    /// Parses and checks a `do` list (absent: empty).
    fn body(&mut self, t: &Table<'_>) -> Option<Vec<Stmt>> {
        let Some(v) = t.get("do") else {
            return Some(Vec::new());
        };
        let items = self.r.strings(v, "`do`");
        let mut ok = true;
        let mut out = Vec::new();
        for item in &items {
            match self.stmt(item) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn stmt(&mut self, item: &SpannedStr) -> Option<Stmt> {
        let parsed = match expr::parse_stmt(&item.value) {
            Ok(s) => s,
            Err(e) => {
                self.r.error(
                    item.sub_span(&e.span),
                    format!("`do` entry does not parse: {}", e.message),
                );
                return None;
            }
        };
        match parsed {
            expr::Stmt::Action { name, span } => {
                if self.iface.has_action(&name) {
                    return Some(Stmt::Action(name));
                }
                let hint = if self.iface.slot(&name).is_some() {
                    format!("; `{name}` is a slot: write `{name} = <value>` to update it")
                } else {
                    did_you_mean(&name, self.iface.actions.iter().map(|a| a.name.as_str()))
                };
                self.r.error(
                    item.sub_span(&span),
                    format!("unknown action `{name}`{hint}"),
                );
                None
            }
            expr::Stmt::Update {
                slot,
                slot_span,
                op,
                value,
            } => {
                let Some(field) = self.iface.slot(&slot) else {
                    let hint =
                        did_you_mean(&slot, self.iface.slots.iter().map(|s| s.name.as_str()));
                    self.r.error(
                        item.sub_span(&slot_span),
                        format!("unknown slot `{slot}`{hint}"),
                    );
                    return None;
                };
                if field.writer == Writer::Runtime {
                    self.r.error(
                        item.sub_span(&slot_span),
                        format!(
                            "slot `{slot}` is written by the runtime; a machine may only read it"
                        ),
                    );
                    return None;
                }
                let texpr = match &field.ty {
                    SlotType::Bytes { .. } => {
                        self.r.error(
                            item.sub_span(&slot_span),
                            format!("slot `{slot}` holds bytes; a machine cannot update it"),
                        );
                        return None;
                    }
                    SlotType::Enum(variants) => {
                        if op != UpdateOp::Assign {
                            self.r.error(
                                item.sub_span(&slot_span),
                                format!("enum slot `{slot}` can only be assigned one of its variants with `=`"),
                            );
                            return None;
                        }
                        self.variant(field, variants, &value, item)?
                    }
                    SlotType::U32 => {
                        let (texpr, ty) = self.resolve(&value, item)?;
                        if ty != Ty::Int {
                            self.r.error(
                                item.sub_span(&value.span),
                                format!("slot `{slot}` holds a number, but this value is not one"),
                            );
                            return None;
                        }
                        texpr
                    }
                };
                Some(Stmt::Update {
                    slot,
                    offset: field.offset,
                    op,
                    value: texpr,
                    source: item.value.clone(),
                })
            }
        }
    }

    /// Resolves the value compared with (or assigned to) enum slot `field`.
    fn variant(
        &mut self,
        field: &SlotField,
        variants: &[String],
        e: &Expr,
        s: &SpannedStr,
    ) -> Option<TExpr> {
        let list = variants.join(", ");
        match &e.kind {
            ExprKind::Ident(name) => match variants.iter().position(|v| v == name) {
                Some(i) => Some(TExpr::Variant {
                    name: name.clone(),
                    index: u32::try_from(i).ok()?,
                }),
                None => {
                    self.r.error(
                        s.sub_span(&e.span),
                        format!(
                            "`{name}` is outside the enum of slot `{}` (variants: {list}){}",
                            field.name,
                            did_you_mean(name, variants.iter().map(String::as_str))
                        ),
                    );
                    None
                }
            },
            ExprKind::Int(v) if usize::try_from(*v).is_ok_and(|v| v < variants.len()) => {
                Some(TExpr::Variant {
                    name: variants[usize::try_from(*v).ok()?].clone(),
                    index: u32::try_from(*v).ok()?,
                })
            }
            ExprKind::Int(v) => {
                self.r.error(
                    s.sub_span(&e.span),
                    format!(
                        "{v} is outside the enum of slot `{}` (0..={}: {list})",
                        field.name,
                        variants.len() - 1
                    ),
                );
                None
            }
            _ => {
                self.r.error(
                    s.sub_span(&e.span),
                    format!("enum slot `{}` can only be compared with or set to one of its variants ({list})", field.name),
                );
                None
            }
        }
    }

    /// The enum slot an expression names directly, if any.
    fn enum_slot(&self, e: &Expr) -> Option<(&SlotField, Vec<String>)> {
        let ExprKind::Ident(name) = &e.kind else {
            return None;
        };
        let field = self.iface.slot(name)?;
        match &field.ty {
            SlotType::Enum(v) => Some((field, v.clone())),
            _ => None,
        }
    }

    fn resolve(&mut self, e: &Expr, s: &SpannedStr) -> Option<(TExpr, Ty)> {
        match &e.kind {
            ExprKind::Int(v) => Some((TExpr::Int(*v), Ty::Int)),
            ExprKind::Bool(b) => Some((TExpr::Bool(*b), Ty::Bool)),
            ExprKind::Ident(name) => self.ident(name, e, s),
            ExprKind::Not(inner) => {
                let (t, ty) = self.resolve(inner, s)?;
                if ty != Ty::Bool {
                    self.r.error(
                        s.sub_span(&inner.span),
                        "`!` needs a true/false operand, but this is a number",
                    );
                    return None;
                }
                Some((TExpr::Not(Box::new(t)), Ty::Bool))
            }
            ExprKind::Binary(op, l, r) => self.binary(*op, l, r, s),
        }
    }

    fn ident(&mut self, name: &str, e: &Expr, s: &SpannedStr) -> Option<(TExpr, Ty)> {
        if let Some(field) = self.iface.slot(name) {
            let ty = match field.ty {
                SlotType::U32 => Ty::Int,
                SlotType::Enum(_) => Ty::Enum,
                SlotType::Bytes { .. } => {
                    self.r.error(
                        s.sub_span(&e.span),
                        format!("slot `{name}` holds bytes and cannot be used in an expression"),
                    );
                    return None;
                }
            };
            return Some((
                TExpr::Slot {
                    name: name.to_string(),
                    offset: field.offset,
                },
                ty,
            ));
        }
        if let Some(v) = self.constants.get(name) {
            return Some((
                TExpr::Const {
                    name: name.to_string(),
                    value: *v,
                },
                Ty::Int,
            ));
        }
        if self.iface.has_predicate(name) {
            return Some((TExpr::Predicate(name.to_string()), Ty::Bool));
        }
        let msg = if self.iface.has_action(name) {
            format!("`{name}` is an action; a guard may use slots, constants and predicates")
        } else {
            let candidates = self
                .iface
                .slots
                .iter()
                .map(|s| s.name.as_str())
                .chain(self.iface.predicates.iter().map(|p| p.name.as_str()))
                .chain(self.constants.keys().map(String::as_str));
            format!(
                "unknown slot, constant or predicate `{name}`{}",
                did_you_mean(name, candidates)
            )
        };
        self.r.error(s.sub_span(&e.span), msg);
        None
    }

    fn binary(&mut self, op: BinOp, l: &Expr, r: &Expr, s: &SpannedStr) -> Option<(TExpr, Ty)> {
        if matches!(op, BinOp::Eq | BinOp::Ne) {
            let enum_side = self
                .enum_slot(l)
                .map(|x| (x, l, r))
                .or_else(|| self.enum_slot(r).map(|x| (x, r, l)));
            if let Some(((field, variants), _, other)) = enum_side {
                let field = field.clone();
                let value = self.variant(&field, &variants, other, s)?;
                let slot = TExpr::Slot {
                    name: field.name.clone(),
                    offset: field.offset,
                };
                return Some((TExpr::Binary(op, Box::new(slot), Box::new(value)), Ty::Bool));
            }
        }
        if let Some(side) = [l, r].into_iter().find(|e| self.enum_slot(e).is_some()) {
            self.r.error(
                s.sub_span(&side.span),
                "an enum slot can only be compared with `==` or `!=` against one of its variants",
            );
            return None;
        }
        let lhs = self.resolve(l, s);
        let rhs = self.resolve(r, s);
        let ((lt, lty), (rt, rty)) = (lhs?, rhs?);
        for (ty, side) in [(&lty, l), (&rty, r)] {
            if *ty == Ty::Enum {
                self.r.error(
                    s.sub_span(&side.span),
                    "an enum slot can only be compared with `==` or `!=` against one of its variants",
                );
                return None;
            }
        }
        let want = if op.is_logical() { Ty::Bool } else { Ty::Int };
        let same_bools = matches!(op, BinOp::Eq | BinOp::Ne) && lty == Ty::Bool && rty == Ty::Bool;
        if !same_bools {
            for (ty, side) in [(&lty, l), (&rty, r)] {
                if *ty != want {
                    let (need, found) = if want == Ty::Bool {
                        ("true/false", "a number")
                    } else {
                        ("number", "true/false")
                    };
                    self.r.error(
                        s.sub_span(&side.span),
                        format!(
                            "`{}` needs {need} operands, but this is {found}",
                            op.symbol()
                        ),
                    );
                    return None;
                }
            }
        }
        if matches!(op, BinOp::Div | BinOp::Rem) && matches!(rt, TExpr::Int(0)) {
            self.r.error(s.sub_span(&r.span), "division by zero");
            return None;
        }
        let ty = if op.is_logical() || op.is_comparison() {
            Ty::Bool
        } else {
            Ty::Int
        };
        Some((TExpr::Binary(op, Box::new(lt), Box::new(rt)), ty))
    }
}

/// Whole-machine checks, run once every name resolved: shadowing was checked while reading;
/// here unreachable states and states with no way out.
fn check_graph(r: &mut Reader<'_>, m: &Machine, spans: &[StateSpans]) {
    let index: HashMap<&str, usize> = m
        .states
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let interrupt_targets: Vec<usize> = m
        .interrupts
        .iter()
        .filter_map(|i| i.target.as_deref())
        .filter_map(|t| index.get(t).copied())
        .collect();

    let mut reached: HashSet<usize> = HashSet::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    if let Some(&start) = index.get(m.initial.as_str()) {
        reached.insert(start);
        queue.push_back(start);
    }
    while let Some(i) = queue.pop_front() {
        let own = m.states[i]
            .transitions
            .iter()
            .filter_map(|t| index.get(t.target.as_str()).copied());
        for next in own.chain(interrupt_targets.iter().copied()) {
            if reached.insert(next) {
                queue.push_back(next);
            }
        }
    }
    for (i, state) in m.states.iter().enumerate() {
        let Some(span) = spans.get(i) else { continue };
        if !reached.contains(&i) {
            r.error(
                span.key.clone(),
                format!(
                    "state `{}` is unreachable: no transition or interrupt leads to it from the initial state `{}`",
                    state.name, m.initial
                ),
            );
        }
        let leaves = state.transitions.iter().any(|t| t.target != state.name)
            || m.interrupts
                .iter()
                .any(|it| it.target.as_deref().is_some_and(|t| t != state.name));
        if !leaves && m.states.len() > 1 {
            r.error(
                span.key.clone(),
                format!(
                    "state `{}` has no way out: none of its transitions and no interrupt leads to another state",
                    state.name
                ),
            );
        }
    }
}
