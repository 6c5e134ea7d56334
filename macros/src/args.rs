//! Arguments of `interface!` and `machine!`: a path literal, then optional `key = value` pairs
//! (`base = "manifest" | "source"`, `interface = some::module`).

use std::path::PathBuf;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{LitStr, Token};

/// Where a relative spec path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// The invoking crate's `CARGO_MANIFEST_DIR` (the default).
    Manifest,
    /// The directory of the source file that invokes the macro.
    Source,
}

pub struct MacroArgs {
    pub path: LitStr,
    pub base: Base,
    pub interface: Option<syn::Path>,
    pub span: Span,
}

impl Parse for MacroArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let path: LitStr = input.parse()?;
        let span = path.span();
        let mut args = MacroArgs {
            path,
            base: Base::Manifest,
            interface: None,
            span,
        };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: syn::Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "base" => {
                    let v: LitStr = input.parse()?;
                    args.base = match v.value().as_str() {
                        "manifest" => Base::Manifest,
                        "source" => Base::Source,
                        _ => {
                            return Err(syn::Error::new(
                                v.span(),
                                "`base` is \"manifest\" (default) or \"source\"",
                            ));
                        }
                    };
                }
                "interface" => {
                    let p = input.call(syn::Path::parse_mod_style)?;
                    args.interface = Some(p);
                }
                _ => {
                    return Err(syn::Error::new(
                        key.span(),
                        "unknown argument (known: `base = \"manifest\"|\"source\"`, `interface = <module path>`)",
                    ));
                }
            }
        }
        Ok(args)
    }
}

impl MacroArgs {
    /// The spec file's path, resolved against the base directory.
    pub fn resolve(&self) -> syn::Result<PathBuf> {
        let rel = PathBuf::from(self.path.value());
        if rel.is_absolute() {
            return Ok(rel);
        }
        let base = match self.base {
            Base::Manifest => std::env::var_os("CARGO_MANIFEST_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    syn::Error::new(self.span, "CARGO_MANIFEST_DIR is not set; build with cargo")
                })?,
            Base::Source => proc_macro::Span::call_site()
                .local_file()
                .and_then(|f| f.parent().map(PathBuf::from))
                .ok_or_else(|| {
                    syn::Error::new(self.span, "the invoking source file's path is unknown")
                })?,
        };
        Ok(sov_spec::source::normalize(&base.join(rel)))
    }

    /// Tokens of the interface module path (default `super`).
    pub fn interface_path(&self) -> TokenStream {
        match &self.interface {
            Some(p) => quote! { #p },
            None => quote! { super },
        }
    }
}
