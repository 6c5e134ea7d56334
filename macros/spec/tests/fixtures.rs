//! Validator tests over the compile-fail fixtures in macros/tests/ui (the same files the
//! trybuild tests feed to the macros): each broken spec yields exactly the expected errors at
//! the expected `line:col`, all at once; the good fixture and the shipped specs pass.

use std::path::{Path, PathBuf};

use sov_spec::{Checked, Diagnostic, check_file};

fn ui(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/ui")
        .join(name)
}

fn errors(name: &str) -> Vec<Diagnostic> {
    match check_file(&ui(name)) {
        Ok(_) => panic!("{name} should fail validation"),
        Err(d) => d,
    }
}

/// Asserts the diagnostics are exactly `expected` (line, col, message fragment), in order.
fn expect(name: &str, expected: &[(usize, usize, &str)]) {
    let got = errors(name);
    let shown: Vec<String> = got.iter().map(|d| d.to_string()).collect();
    assert_eq!(got.len(), expected.len(), "{name}: {shown:#?}");
    for (d, (line, col, frag)) in got.iter().zip(expected) {
        assert!(
            d.file.ends_with(&format!("tests/ui/{name}"))
                || d.file.ends_with("tests/ui/iface.toml"),
            "{name}: {d}"
        );
        assert_eq!((d.line, d.col), (*line, *col), "{name}: {d}");
        assert!(d.message.contains(frag), "{name}: `{frag}` not in {d}");
    }
}

#[test]
fn good_fixture_and_shipped_specs_pass() {
    assert!(matches!(
        check_file(&ui("ok.toml")),
        Ok(Checked::Machine(_))
    ));
    assert!(matches!(
        check_file(&ui("iface.toml")),
        Ok(Checked::Interface(_))
    ));
    let specs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs");
    for f in ["scheduler.toml", "laptop.toml", "runtime.toml"] {
        if let Err(d) = check_file(&specs.join(f)) {
            panic!("{f}: {d:#?}");
        }
    }
}

#[test]
fn unknown_names() {
    expect(
        "unknown_state.toml",
        &[(18, 8, "unknown state `runn`; did you mean `run`?")],
    );
    expect(
        "unknown_slot.toml",
        &[(27, 16, "unknown slot `stepz`; did you mean `steps`?")],
    );
    expect(
        "unknown_constant.toml",
        &[(
            22,
            30,
            "unknown slot, constant or predicate `evry`; did you mean `every`?",
        )],
    );
    expect(
        "unknown_action.toml",
        &[(27, 8, "unknown action `wrok`; did you mean `work`?")],
    );
    expect(
        "unknown_predicate.toml",
        &[(
            22,
            9,
            "unknown slot, constant or predicate `bussy`; did you mean `busy`?",
        )],
    );
}

#[test]
fn duplicate_names() {
    expect(
        "duplicate_name.toml",
        &[
            (
                8,
                1,
                "duplicate name `queue`: the interface already declares a slot",
            ),
            (
                17,
                8,
                "duplicate name: interrupt `off` is already declared at 11:8",
            ),
        ],
    );
    expect(
        "iface_duplicate.toml",
        &[(
            36,
            1,
            "duplicate name `queue`: already declared as a slot at 5:8",
        )],
    );
}

#[test]
fn slot_layout() {
    expect(
        "iface_overlap.toml",
        &[(
            23,
            8,
            "slot `digest` (slots 2..=9) overlaps slot `power` (slots 2..=2)",
        )],
    );
    expect(
        "iface_past_32.toml",
        &[(
            25,
            9,
            "covers slots 28..=35 and runs past the last slot (31)",
        )],
    );
    expect(
        "iface_width.toml",
        &[(
            25,
            9,
            "width of slot `digest` does not fit its type: 30 bytes need 8 slots",
        )],
    );
}

#[test]
fn graph_checks() {
    expect(
        "unreachable.toml",
        &[(30, 9, "state `orphan` is unreachable")],
    );
    expect("no_way_out.toml", &[(15, 9, "state `run` has no way out")]);
    expect(
        "shadowed.toml",
        &[(
            19,
            1,
            "transition 2 of state `idle` can never fire: transition 1 before it has no guard",
        )],
    );
    expect("no_initial.toml", &[(1, 1, "no initial state")]);
}

#[test]
fn guards() {
    expect(
        "guard_parse.toml",
        &[(
            17,
            17,
            "guard does not parse: expected a number, a name or `(`, found `>`",
        )],
    );
    expect(
        "enum_outside.toml",
        &[(
            11,
            18,
            "`sleeping` is outside the enum of slot `power` (variants: on, off)",
        )],
    );
}

#[test]
fn toml_syntax_errors_are_located() {
    let d = errors("toml_syntax.toml");
    assert!(!d.is_empty());
    assert_eq!((d[0].line, d[0].col), (7, 9), "{}", d[0]);
    assert!(d[0].message.starts_with("TOML syntax"), "{}", d[0]);
}

#[test]
fn all_errors_are_reported_at_once() {
    expect(
        "many_errors.toml",
        &[
            (
                11,
                18,
                "7 is outside the enum of slot `power` (0..=1: on, off)",
            ),
            (18, 8, "unknown state `nowhere`"),
            (
                27,
                16,
                "slot `queue` is written by the runtime; a machine may only read it",
            ),
        ],
    );
}
