//! README.md keeps the default machine's diagram: its `mermaid` block must equal what the
//! generated scheduler draws (`sov spec graph specs/scheduler.toml`), so an edit of
//! `specs/scheduler.toml` that forgets the README fails here.

use std::path::Path;

#[test]
fn readme_diagram_is_the_default_machine() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&readme).expect("README.md readable");
    let start = text
        .find("```mermaid\n")
        .map(|i| i + "```mermaid\n".len())
        .expect("README.md has a mermaid block");
    let len = text[start..]
        .find("```")
        .expect("the mermaid block is closed");
    let drawn = sov::scheduler::seed::MERMAID;
    assert_eq!(
        text[start..start + len].trim_end(),
        drawn.trim_end(),
        "README.md's diagram differs from `sov spec graph specs/scheduler.toml`: paste its output"
    );
}
