//! sov-macros: the proc-macros that compile sov's TOML specs into Rust. A thin shell over
//! `sov-spec` (which parses, validates and generates): this crate only resolves the file path,
//! turns diagnostics into `compile_error!`s and hands the generated tokens to the compiler.
//!
//! ```ignore
//! pub mod scheduler {
//!     sov_macros::interface!("../specs/runtime.toml");
//!     pub mod seed { sov_macros::machine!("../specs/scheduler.toml"); }
//! }
//! ```
//! Paths are relative to the invoking crate's `CARGO_MANIFEST_DIR`, or to the invoking source
//! file's directory with `base = "source"`. `machine!` takes `interface = <path>`, the module
//! where `interface!` expanded (default `super`). Every spec error becomes one
//! `compile_error!` reading `file:line:col: message`; the macros never panic.

#![warn(missing_docs)]

mod args;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote_spanned;

use args::MacroArgs;
use sov_spec::source::Source;
use sov_spec::{Diagnostic, codegen};

/// Generates the slot surface, `Actions`, `Guards`, `Action`, `Transition` and the `Machine`
/// trait from a runtime interface TOML file.
#[proc_macro]
pub fn interface(input: TokenStream) -> TokenStream {
    let args = match syn::parse::<MacroArgs>(input) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    if let Some(extra) = &args.interface {
        return syn::Error::new_spanned(extra, "`interface = ...` is an argument of `machine!`")
            .to_compile_error()
            .into();
    }
    let path = match args.resolve() {
        Ok(p) => p,
        Err(e) => return e.to_compile_error().into(),
    };
    let tracked = vec![path.display().to_string()];
    match sov_spec::load_interface(&path) {
        Ok(loaded) => codegen::interface::interface_tokens(&loaded.interface, &tracked).into(),
        Err(diags) => errors(&diags, args.span, &tracked).into(),
    }
}

/// Generates a machine's `State` enum and `Scheduler` (implementing the interface's `Machine`
/// trait) from a machine TOML file, validated against the interface file it names.
#[proc_macro]
pub fn machine(input: TokenStream) -> TokenStream {
    let args = match syn::parse::<MacroArgs>(input) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    let path = match args.resolve() {
        Ok(p) => p,
        Err(e) => return e.to_compile_error().into(),
    };
    let src = match Source::read(&path) {
        Ok(s) => s,
        Err(msg) => {
            let d = Diagnostic {
                file: path.display().to_string(),
                line: 1,
                col: 1,
                message: msg,
            };
            return errors(&[d], args.span, &[]).into();
        }
    };
    let iface = args.interface_path();
    match sov_spec::machine_from_source(&src) {
        Ok(loaded) => {
            let tracked = vec![
                loaded.path.display().to_string(),
                loaded.interface_path.display().to_string(),
            ];
            codegen::machine::machine_tokens(&loaded, &iface, &tracked).into()
        }
        Err(diags) => errors(&diags, args.span, &[path.display().to_string()]).into(),
    }
}

/// One `compile_error!` per diagnostic, plus `include_bytes!` of the files so fixing them
/// triggers a rebuild.
fn errors(diags: &[Diagnostic], span: Span, tracked: &[String]) -> TokenStream2 {
    let messages = diags.iter().map(|d| d.to_string());
    quote_spanned! {span=>
        #(const _: &[u8] = include_bytes!(#tracked);)*
        #(::core::compile_error!(#messages);)*
    }
}
