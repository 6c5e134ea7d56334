//! `sov spec check FILE` and `sov spec graph FILE [--format mermaid|dot]`: the spec compiler's
//! validation and graphs without building, so a user editing a spec sees the result at once.
//! Both run `sov-spec`, the library the `machine!`/`interface!` macros use, so they report the
//! same `file:line:col` errors as `cargo build`. A machine file names its interface file, so
//! neither command needs a second argument.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use sov_spec::{Checked, Diagnostic, GraphFormat};

/// `sov spec ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SpecCommand {
    /// Validate a machine or interface spec file; print every error as file:line:col and exit 1
    /// if there is any.
    Check {
        /// A machine (e.g. specs/scheduler.toml) or interface (specs/runtime.toml) file.
        file: PathBuf,
    },
    /// Print a machine's state graph.
    Graph {
        /// A machine file, e.g. specs/scheduler.toml.
        file: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Mermaid)]
        format: Format,
    },
}

/// Graph output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Mermaid `stateDiagram-v2` (renders on GitHub in a ```mermaid block).
    Mermaid,
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
}

/// Runs a `sov spec` subcommand. Spec errors go to stderr and give exit code 1.
pub fn run(cmd: SpecCommand) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    run_with(cmd, &mut out, &mut err)
}

/// [`run`] with explicit output streams (for tests).
pub fn run_with(
    cmd: SpecCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    match cmd {
        SpecCommand::Check { file } => match sov_spec::check_file(&file) {
            Ok(checked) => {
                writeln!(out, "{}", summary(&checked)).context("writing to stdout")?;
                Ok(ExitCode::SUCCESS)
            }
            Err(diags) => report(&diags, err),
        },
        SpecCommand::Graph { file, format } => {
            let format = match format {
                Format::Mermaid => GraphFormat::Mermaid,
                Format::Dot => GraphFormat::Dot,
            };
            match sov_spec::graph_file(&file, format) {
                Ok(text) => {
                    out.write_all(text.as_bytes())
                        .context("writing to stdout")?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(diags) => report(&diags, err),
            }
        }
    }
}

fn report(diags: &[Diagnostic], err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    for d in diags {
        writeln!(err, "error: {d}").context("writing to stderr")?;
    }
    let n = diags.len();
    writeln!(err, "{n} error{}", if n == 1 { "" } else { "s" }).context("writing to stderr")?;
    Ok(ExitCode::FAILURE)
}

fn summary(checked: &Checked) -> String {
    match checked {
        Checked::Interface(i) => format!(
            "ok: {}: interface `{}`: {} slot fields, {} actions, {} predicates; digest {}",
            i.path.display(),
            i.interface.name,
            i.interface.slots.len(),
            i.interface.actions.len(),
            i.interface.predicates.len(),
            sov_spec::hex(&sov_spec::canon::interface_digest(&i.interface)),
        ),
        Checked::Machine(m) => format!(
            "ok: {}: machine `{}` on interface `{}` ({}): {} states, {} interrupts, {} transitions; spec digest {}",
            m.path.display(),
            m.machine.name,
            m.interface.name,
            m.interface_path.display(),
            m.machine.states.len(),
            m.machine.interrupts.len(),
            m.machine
                .states
                .iter()
                .map(|s| s.transitions.len())
                .sum::<usize>(),
            sov_spec::hex(&m.digest()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn specs() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs")
    }

    fn run_capture(cmd: SpecCommand) -> (ExitCode, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_with(cmd, &mut out, &mut err).expect("writing to a Vec never fails");
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn check_accepts_the_shipped_specs() {
        for file in ["scheduler.toml", "laptop.toml", "runtime.toml"] {
            let (code, out, err) = run_capture(SpecCommand::Check {
                file: specs().join(file),
            });
            assert_eq!(code, ExitCode::SUCCESS, "{file}: {err}");
            assert!(out.starts_with("ok: "), "{out}");
        }
    }

    #[test]
    fn check_reports_line_and_column_and_fails() {
        let dir = tempfile::tempdir().expect("temp dir");
        let iface = std::fs::read_to_string(specs().join("runtime.toml")).expect("runtime.toml");
        std::fs::write(dir.path().join("runtime.toml"), iface).expect("write");
        let machine = "[machine]\nname = \"m\"\ninterface = \"runtime.toml\"\ninitial = \"idle\"\n\n\
                       [states.idle]\n[[states.idle.on]]\nwhen = \"power_state == sleeping\"\ngoto = \"nowhere\"\n";
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, machine).expect("write");
        let (code, out, err) = run_capture(SpecCommand::Check { file: path.clone() });
        assert_eq!(code, ExitCode::FAILURE);
        assert!(out.is_empty());
        let shown = path.display().to_string();
        assert!(
            err.contains(&format!("{shown}:8:24: `sleeping` is outside the enum")),
            "{err}"
        );
        assert!(
            err.contains(&format!("{shown}:9:8: unknown state `nowhere`")),
            "{err}"
        );
        assert!(err.ends_with("2 errors\n"), "{err}");
    }

    #[test]
    fn graph_prints_mermaid_and_dot() {
        let (code, out, _) = run_capture(SpecCommand::Graph {
            file: specs().join("scheduler.toml"),
            format: Format::Mermaid,
        });
        assert_eq!(code, ExitCode::SUCCESS);
        assert!(
            out.starts_with("stateDiagram-v2\n    [*] --> idle\n"),
            "{out}"
        );
        assert!(out.contains("checkpoint --> generate"), "{out}");
        let (code, out, _) = run_capture(SpecCommand::Graph {
            file: specs().join("laptop.toml"),
            format: Format::Dot,
        });
        assert_eq!(code, ExitCode::SUCCESS);
        assert!(out.starts_with("digraph \"laptop\" {"), "{out}");
    }

    #[test]
    fn missing_file_is_an_error_not_a_panic() {
        let (code, _, err) = run_capture(SpecCommand::Check {
            file: PathBuf::from("/nonexistent/spec.toml"),
        });
        assert_eq!(code, ExitCode::FAILURE);
        assert!(
            err.contains("/nonexistent/spec.toml:1:1: cannot read spec file"),
            "{err}"
        );
    }
}
