//! Expressions and slot updates to Rust. Numbers are `i64` during evaluation with wrapping
//! `+ - *` and `/ %` by zero giving 0 (through the interface's `__ops` helpers), so no input
//! can make a generated guard panic; slot writes saturate to `0..=u32::MAX`.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use crate::expr::{BinOp, UpdateOp};
use crate::ir::{Stmt, TExpr};

/// Tokens of a typed expression. `iface` is the path of the interface module; the generated
/// code expects `rt: &mut R` and `slots: &Slots` in scope.
pub fn expr_tokens(e: &TExpr, iface: &TokenStream) -> TokenStream {
    match e {
        TExpr::Int(v) | TExpr::Const { value: v, .. } => {
            let lit = Literal::i64_suffixed(*v);
            quote! { #lit }
        }
        TExpr::Variant { index, .. } => {
            let lit = Literal::i64_suffixed(i64::from(*index));
            quote! { #lit }
        }
        TExpr::Bool(b) => quote! { #b },
        TExpr::Slot { offset, .. } => {
            let off = Literal::usize_unsuffixed(*offset as usize);
            quote! { slots.__read(#off) }
        }
        TExpr::Predicate(p) => {
            let p = format_ident!("{}", p);
            quote! { #iface::Guards::#p(&*rt) }
        }
        TExpr::Not(inner) => {
            let i = expr_tokens(inner, iface);
            quote! { !(#i) }
        }
        TExpr::Binary(op, l, r) => {
            let (l, r) = (expr_tokens(l, iface), expr_tokens(r, iface));
            let helper = |name: &str| {
                let f = format_ident!("{}", name);
                quote! { #iface::__ops::#f(#l, #r) }
            };
            match op {
                BinOp::Or => quote! { (#l || #r) },
                BinOp::And => quote! { (#l && #r) },
                BinOp::Eq => quote! { (#l == #r) },
                BinOp::Ne => quote! { (#l != #r) },
                BinOp::Lt => quote! { (#l < #r) },
                BinOp::Le => quote! { (#l <= #r) },
                BinOp::Gt => quote! { (#l > #r) },
                BinOp::Ge => quote! { (#l >= #r) },
                BinOp::Add => helper("add"),
                BinOp::Sub => helper("sub"),
                BinOp::Mul => helper("mul"),
                BinOp::Div => helper("div"),
                BinOp::Rem => helper("rem"),
            }
        }
    }
}

/// Tokens executing one `do` entry (an action call returns early on error).
pub fn stmt_tokens(s: &Stmt, iface: &TokenStream) -> TokenStream {
    match s {
        Stmt::Action(a) => {
            let a = format_ident!("{}", a);
            quote! { #iface::Actions::#a(rt)?; }
        }
        Stmt::Update {
            offset, op, value, ..
        } => {
            let off = Literal::usize_unsuffixed(*offset as usize);
            let v = expr_tokens(value, iface);
            match op {
                UpdateOp::Assign => quote! { slots.__write_saturating(#off, #v); },
                UpdateOp::Add => {
                    quote! { slots.__write_saturating(#off, #iface::__ops::add(slots.__read(#off), #v)); }
                }
                UpdateOp::Sub => {
                    quote! { slots.__write_saturating(#off, #iface::__ops::sub(slots.__read(#off), #v)); }
                }
            }
        }
    }
}
