//! Compile-fail tests: every kind of spec error fails the build with `file:line:col` messages
//! (expected output in tests/ui/*.stderr), and the good fixture builds and runs. Slow (trybuild
//! builds a crate per fixture); the same errors are checked fast by sov-spec's fixture tests.

#[test]
fn spec_errors_fail_the_build() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/[a-np-z]*.rs");
    t.pass("tests/ui/ok.rs");
}
