//! Validator cases beyond the one-per-error fixtures: type errors in guards and updates,
//! unknown keys, always-true interrupts, variant checks. Each machine text is checked against
//! macros/tests/ui/iface.toml (slots queue, steps, power {on, off}, digest; actions work, save;
//! predicate busy).

use std::path::Path;

use sov_spec::machine_from_source;
use sov_spec::source::Source;

const HEAD: &str = "[machine]\nname = \"t\"\ninterface = \"iface.toml\"\ninitial = \"a\"\n\
                    [constants]\nevery = 4\n";

/// Messages (with line:col) of checking HEAD + `body`.
fn check(body: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ui/inline.toml");
    let src = Source::new(path, format!("{HEAD}{body}"));
    match machine_from_source(&src) {
        Ok(_) => Vec::new(),
        Err(d) => d
            .iter()
            .map(|d| format!("{}:{}: {}", d.line, d.col, d.message))
            .collect(),
    }
}

fn guard(when: &str) -> Vec<String> {
    check(&format!(
        "[states.a]\n[[states.a.on]]\nwhen = \"{when}\"\ngoto = \"b\"\n\
         [states.b]\n[[states.b.on]]\ngoto = \"a\"\n"
    ))
}

fn update(stmt: &str) -> Vec<String> {
    check(&format!(
        "[states.a]\n[[states.a.on]]\ndo = [\"{stmt}\"]\ngoto = \"b\"\n\
         [states.b]\n[[states.b.on]]\ngoto = \"a\"\n"
    ))
}

#[test]
fn well_typed_guards_pass() {
    for ok in [
        "busy",
        "!busy || queue > 0 && steps % every == 1",
        "power == off",
        "off != power",
        "power == 1",
        "(queue + steps) * 2 / every >= 3",
        "busy == (queue > 0)",
        "true",
    ] {
        assert_eq!(guard(ok), Vec::<String>::new(), "{ok}");
    }
}

#[test]
fn ill_typed_guards_fail_with_a_column() {
    let cases = [
        ("queue", "9:8: a guard must be true or false"),
        ("!queue", "9:10: `!` needs a true/false operand"),
        (
            "busy + 1 > 0",
            "9:9: `+` needs number operands, but this is true/false",
        ),
        (
            "queue && busy",
            "9:9: `&&` needs true/false operands, but this is a number",
        ),
        (
            "power > off",
            "9:9: an enum slot can only be compared with `==` or `!=`",
        ),
        ("power == 2", "9:18: 2 is outside the enum of slot `power`"),
        (
            "power == queue",
            "9:18: `queue` is outside the enum of slot `power`",
        ),
        ("digest == 0", "9:9: slot `digest` holds bytes"),
        (
            "work",
            "9:9: `work` is an action; a guard may use slots, constants and predicates",
        ),
        ("queue / 0 > 1", "9:17: division by zero"),
        (
            "queue > 0 &&",
            "9:21: guard does not parse: expected a number, a name or `(`, found the end",
        ),
        (
            "1 < 2 < 3",
            "9:15: guard does not parse: comparisons cannot be chained",
        ),
    ];
    for (when, expected) in cases {
        let got = guard(when);
        assert_eq!(got.len(), 1, "{when}: {got:?}");
        assert!(got[0].starts_with(expected), "{when}: {got:?}");
    }
}

#[test]
fn slot_updates_are_checked() {
    assert_eq!(update("steps += every * 2"), Vec::<String>::new());
    assert_eq!(update("power = off"), Vec::<String>::new());
    let cases = [
        ("queue = 1", "slot `queue` is written by the runtime"),
        (
            "power += 1",
            "enum slot `power` can only be assigned one of its variants",
        ),
        ("power = dim", "`dim` is outside the enum of slot `power`"),
        (
            "steps = busy",
            "slot `steps` holds a number, but this value is not one",
        ),
        ("steps", "unknown action `steps`; `steps` is a slot"),
        ("steps == 1", "`do` entry does not parse"),
    ];
    for (stmt, expected) in cases {
        let got = update(stmt);
        assert_eq!(got.len(), 1, "{stmt}: {got:?}");
        assert!(got[0].contains(expected), "{stmt}: {got:?}");
    }
}

#[test]
fn unknown_keys_and_always_true_interrupts() {
    let got = check(
        "[[interrupts]]\nname = \"i\"\nwhen = \"true\"\n\
         [[interrupts]]\nname = \"j\"\nwhen = \"busy\"\n\
         [states.a]\ncolour = \"red\"\n[[states.a.on]]\ngoto = \"a\"\n",
    );
    let text = got.join("\n");
    assert!(
        text.contains("this interrupt can never fire: interrupt `i` before it"),
        "{text}"
    );
    assert!(
        text.contains("interrupt `i` has a guard that is always true"),
        "{text}"
    );
    assert!(text.contains("unknown key `colour` in state `a`"), "{text}");
}

#[test]
fn constants_may_not_shadow_interface_names() {
    let got = check("busy = 1\n[states.a]\n[[states.a.on]]\ngoto = \"a\"\n");
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("duplicate name `busy`: the interface already declares a predicate"));
}

#[test]
fn a_missing_interface_file_is_reported_at_its_name() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ui/inline.toml");
    let src = Source::new(
        path,
        "[machine]\nname = \"t\"\ninterface = \"missing.toml\"\ninitial = \"a\"\n",
    );
    let d = machine_from_source(&src).expect_err("no such interface");
    assert_eq!((d[0].line, d[0].col), (3, 13));
    assert!(
        d[0].message.contains("missing.toml: cannot read spec file"),
        "{}",
        d[0]
    );
}
