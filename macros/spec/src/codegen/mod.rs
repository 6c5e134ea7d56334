//! Rust code generation from the validated IR: [`interface`] emits the slot surface, the
//! `Actions`/`Guards` traits and the `Machine` trait once per interface; [`machine`] emits one
//! machine's `State` enum and `Scheduler`. Output is `proc_macro2` tokens using only `std`, so
//! generated code needs no dependency besides the macro crate.

pub mod expr;
pub mod interface;
pub mod machine;

use proc_macro2::{Literal, TokenStream};
use quote::quote;

/// `[u8; N]` literal tokens.
pub(crate) fn bytes_literal(bytes: &[u8]) -> TokenStream {
    let items = bytes.iter().map(|b| Literal::u8_unsuffixed(*b));
    quote! { [#(#items),*] }
}
