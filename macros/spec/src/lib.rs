//! sov-spec: the compiler of sov's TOML scheduler specs, shared by the `sov-macros` proc-macros,
//! the `sov spec` command and the tests (the pest/pest_derive split: the macro crate is a thin
//! shell over this library).
//!
//! Pipeline: [`source`] (file text, `line:col`) -> [`walk`] (span-carrying TOML tree) ->
//! [`interface`] / [`machine`] (parse and validate, collecting every [`Diagnostic`]) -> [`ir`]
//! (the validated spec) -> [`codegen`] (Rust tokens), [`graph`] (Mermaid/DOT) and [`canon`]
//! (canonical text and BLAKE3 digest).
//!
//! Two kinds of file: an interface (`specs/runtime.toml`: slots, actions, predicates) and a
//! machine (`specs/scheduler.toml`: states, guarded transitions, interrupts, constants) that
//! names its interface with `interface = "runtime.toml"`, relative to itself.

#![warn(missing_docs)]

pub mod canon;
pub mod codegen;
pub mod diag;
pub mod expr;
pub mod graph;
pub mod interface;
pub mod ir;
pub mod machine;
pub mod source;
pub mod walk;

use std::path::{Path, PathBuf};

pub use diag::Diagnostic;
pub use graph::GraphFormat;

use diag::Diags;
use source::Source;
use walk::{Reader, parse_document};

/// A validated interface file.
#[derive(Debug, Clone)]
pub struct LoadedInterface {
    /// The validated interface.
    pub interface: ir::Interface,
    /// Path it was read from (normalized).
    pub path: PathBuf,
}

/// A validated machine file with the interface it names.
#[derive(Debug, Clone)]
pub struct LoadedMachine {
    /// The interface the machine names.
    pub interface: ir::Interface,
    /// Path of that interface file, resolved relative to the machine file.
    pub interface_path: PathBuf,
    /// The validated machine.
    pub machine: ir::Machine,
    /// Path the machine was read from (normalized).
    pub path: PathBuf,
}

impl LoadedMachine {
    /// BLAKE3 of the canonical interface and machine.
    pub fn digest(&self) -> [u8; 32] {
        canon::spec_digest(&self.interface, &self.machine)
    }
}

/// What `check_file` found: either kind of spec file, validated.
#[derive(Debug, Clone)]
pub enum Checked {
    /// The file was an interface (it has no `[machine]` table).
    Interface(LoadedInterface),
    /// The file was a machine (it has a `[machine]` table).
    Machine(LoadedMachine),
}

fn read(path: &Path) -> Result<Source, Vec<Diagnostic>> {
    Source::read(path).map_err(|msg| {
        let mut d = Diags::default();
        d.error_at_start(&source::normalize(path).display().to_string(), msg);
        d.into_sorted()
    })
}

/// Loads and validates an interface file.
pub fn load_interface(path: &Path) -> Result<LoadedInterface, Vec<Diagnostic>> {
    let src = read(path)?;
    interface::parse_interface(&src)
        .map(|interface| LoadedInterface {
            interface,
            path: src.path.clone(),
        })
        .map_err(Diags::into_sorted)
}

/// Loads and validates a machine file and the interface file it names.
pub fn load_machine(path: &Path) -> Result<LoadedMachine, Vec<Diagnostic>> {
    let src = read(path)?;
    machine_from_source(&src)
}

/// Validates a machine given as text (`path` locates its interface and names it in messages).
pub fn machine_from_source(src: &Source) -> Result<LoadedMachine, Vec<Diagnostic>> {
    let mut diags = Diags::default();
    let Some(doc) = parse_document(src, &mut diags) else {
        return Err(diags.into_sorted());
    };
    let mut r = Reader {
        src,
        diags: &mut diags,
    };
    let Some(iface_ref) = machine::interface_path(&mut r, doc.get_ref()) else {
        if r.diags.is_empty() {
            r.error(
                doc.span().start..doc.span().start,
                "a machine file needs a [machine] table naming its `interface` file",
            );
        }
        return Err(diags.into_sorted());
    };
    let iface_path = src.sibling(&iface_ref.value);
    let iface = match Source::read(&iface_path) {
        Ok(iface_src) => match interface::parse_interface(&iface_src) {
            Ok(i) => i,
            Err(errors) => {
                r.error(
                    iface_ref.span.clone(),
                    format!("interface file {} has errors", iface_path.display()),
                );
                diags.extend(errors);
                return Err(diags.into_sorted());
            }
        },
        Err(msg) => {
            r.error(
                iface_ref.span.clone(),
                format!("interface file {}: {msg}", iface_path.display()),
            );
            return Err(diags.into_sorted());
        }
    };
    let m = machine::read_machine(&mut r, &iface, doc.get_ref(), &doc.span());
    match m {
        Some(machine) if diags.is_empty() => Ok(LoadedMachine {
            interface: iface,
            interface_path: iface_path,
            machine,
            path: src.path.clone(),
        }),
        _ => Err(diags.into_sorted()),
    }
}

/// True when the file's top level has a `[machine]` table (otherwise it is an interface).
fn is_machine(src: &Source) -> bool {
    let mut d = Diags::default();
    parse_document(src, &mut d).is_some_and(|doc| doc.get_ref().get("machine").is_some())
}

/// Validates either kind of spec file: what `sov spec check FILE` runs.
pub fn check_file(path: &Path) -> Result<Checked, Vec<Diagnostic>> {
    let src = read(path)?;
    if is_machine(&src) {
        machine_from_source(&src).map(Checked::Machine)
    } else {
        interface::parse_interface(&src)
            .map(|interface| {
                Checked::Interface(LoadedInterface {
                    interface,
                    path: src.path.clone(),
                })
            })
            .map_err(Diags::into_sorted)
    }
}

/// Mermaid or DOT text of a machine file: what `sov spec graph FILE` prints.
pub fn graph_file(path: &Path, format: GraphFormat) -> Result<String, Vec<Diagnostic>> {
    let loaded = load_machine(path)?;
    Ok(match format {
        GraphFormat::Mermaid => graph::mermaid(&loaded.machine),
        GraphFormat::Dot => graph::dot(&loaded.machine),
    })
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
