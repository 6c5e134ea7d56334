//! The guard and slot-update language: lexer and recursive-descent parser producing an untyped
//! AST with byte spans (relative to the expression string).
//!
//! Grammar (precedence from loosest to tightest, like Rust):
//! ```text
//! guard  := or
//! or     := and ("||" and)*
//! and    := cmp ("&&" cmp)*
//! cmp    := sum (("=="|"!="|"<"|"<="|">"|">=") sum)?
//! sum    := term (("+"|"-") term)*
//! term   := unary (("*"|"/"|"%") unary)*
//! unary  := "!" unary | atom
//! atom   := INT | "true" | "false" | IDENT | "(" or ")"
//! stmt   := IDENT                       (an action)
//!         | IDENT ("="|"+="|"-=") or    (a slot update)
//! ```

use std::ops::Range;

/// A parse error at a byte span of the expression string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Byte range of the offending text within the expression string.
    pub span: Range<usize>,
    /// What is wrong, in words.
    pub message: String,
}

/// A binary operator, tightest-binding last. Generated code evaluates numbers as `i64` with
/// wrapping arithmetic; `/` and `%` by zero give 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `||`: logical or.
    Or,
    /// `&&`: logical and.
    And,
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/` (integer division).
    Div,
    /// `%` (remainder).
    Rem,
}

impl BinOp {
    /// The operator as written in the spec language, e.g. `"<="`.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "||",
            BinOp::And => "&&",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
        }
    }

    /// Whether the operator compares two numbers and yields a boolean.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }

    /// Whether the operator combines two booleans (`||`, `&&`).
    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::Or | BinOp::And)
    }
}

/// Untyped expression node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExprKind {
    /// An integer literal.
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
    /// A name: a slot field, constant, predicate or enum variant (resolved later).
    Ident(String),
    /// `!` applied to a subexpression.
    Not(Box<Expr>),
    /// A binary operation on two subexpressions.
    Binary(BinOp, Box<Expr>, Box<Expr>),
}

/// An expression node with its byte span in the expression string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    /// What the node is.
    pub kind: ExprKind,
    /// Byte range the node covers in the expression string.
    pub span: Range<usize>,
}

/// The operator of a slot update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOp {
    /// `=`: replace the slot's value.
    Assign,
    /// `+=`: add to it.
    Add,
    /// `-=`: subtract from it.
    Sub,
}

impl UpdateOp {
    /// The operator as written, e.g. `"+="`.
    pub fn symbol(self) -> &'static str {
        match self {
            UpdateOp::Assign => "=",
            UpdateOp::Add => "+=",
            UpdateOp::Sub => "-=",
        }
    }
}

/// One entry of a `do` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// A bare identifier: run the action of that name.
    Action {
        /// Action name.
        name: String,
        /// Byte range of the name in the statement string.
        span: Range<usize>,
    },
    /// `slot op value`: change a slot field.
    Update {
        /// Slot field name.
        slot: String,
        /// Byte range of the slot name in the statement string.
        slot_span: Range<usize>,
        /// `=`, `+=` or `-=`.
        op: UpdateOp,
        /// The right-hand side.
        value: Expr,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Int(i64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
}

const OPERATORS: [&str; 17] = [
    "&&", "||", "==", "!=", "<=", ">=", "+=", "-=", "<", ">", "!", "=", "+", "-", "*", "/", "%",
];

fn lex(text: &str) -> Result<Vec<(Tok, Range<usize>)>, ParseError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let digits = text[start..i].replace('_', "");
            let value = if let Some(hex) = digits.strip_prefix("0x") {
                i64::from_str_radix(hex, 16)
            } else {
                digits.parse::<i64>()
            };
            let value = value.map_err(|_| ParseError {
                span: start..i,
                message: format!("`{}` is not a valid integer", &text[start..i]),
            })?;
            out.push((Tok::Int(value), start..i));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Ident(text[start..i].to_string()), start..i));
        } else if c == b'(' {
            out.push((Tok::LParen, i..i + 1));
            i += 1;
        } else if c == b')' {
            out.push((Tok::RParen, i..i + 1));
            i += 1;
        } else if let Some(op) = OPERATORS.iter().find(|op| text[i..].starts_with(**op)) {
            out.push((Tok::Op(op), i..i + op.len()));
            i += op.len();
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(ParseError {
                span: i..i + ch.len_utf8(),
                message: format!("unexpected character `{ch}`"),
            });
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, Range<usize>)>,
    pos: usize,
    len: usize,
}

impl Parser {
    fn new(text: &str) -> Result<Self, ParseError> {
        Ok(Self {
            toks: lex(text)?,
            pos: 0,
            len: text.len(),
        })
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn peek_span(&self) -> Range<usize> {
        self.toks
            .get(self.pos)
            .map_or(self.len..self.len, |(_, s)| s.clone())
    }

    fn bump(&mut self) -> Option<(Tok, Range<usize>)> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn eat_op(&mut self, ops: &[&'static str]) -> Option<&'static str> {
        if let Some(Tok::Op(op)) = self.peek()
            && let Some(found) = ops.iter().find(|o| *o == op)
        {
            self.pos += 1;
            return Some(found);
        }
        None
    }

    fn error_here(&self, expected: &str) -> ParseError {
        let found = match self.peek() {
            None => "the end".to_string(),
            Some(Tok::Int(v)) => format!("`{v}`"),
            Some(Tok::Ident(s)) => format!("`{s}`"),
            Some(Tok::Op(o)) => format!("`{o}`"),
            Some(Tok::LParen) => "`(`".to_string(),
            Some(Tok::RParen) => "`)`".to_string(),
        };
        ParseError {
            span: self.peek_span(),
            message: format!("expected {expected}, found {found}"),
        }
    }

    fn binary(
        &mut self,
        ops: &[(&'static str, BinOp)],
        next: fn(&mut Self) -> Result<Expr, ParseError>,
        chain: bool,
    ) -> Result<Expr, ParseError> {
        let mut lhs = next(self)?;
        let symbols: Vec<&'static str> = ops.iter().map(|(s, _)| *s).collect();
        while let Some(sym) = self.eat_op(&symbols) {
            let op = ops
                .iter()
                .find(|(s, _)| *s == sym)
                .map(|(_, o)| *o)
                .unwrap_or(BinOp::Eq);
            let rhs = next(self)?;
            let span = lhs.span.start..rhs.span.end;
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                span,
            };
            if !chain {
                if let Some(Tok::Op(o)) = self.peek()
                    && symbols.contains(o)
                {
                    return Err(ParseError {
                        span: self.peek_span(),
                        message: "comparisons cannot be chained; use `&&`".to_string(),
                    });
                }
                break;
            }
        }
        Ok(lhs)
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        self.binary(&[("||", BinOp::Or)], Self::and, true)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        self.binary(&[("&&", BinOp::And)], Self::cmp, true)
    }

    fn cmp(&mut self) -> Result<Expr, ParseError> {
        self.binary(
            &[
                ("==", BinOp::Eq),
                ("!=", BinOp::Ne),
                ("<=", BinOp::Le),
                (">=", BinOp::Ge),
                ("<", BinOp::Lt),
                (">", BinOp::Gt),
            ],
            Self::sum,
            false,
        )
    }

    fn sum(&mut self) -> Result<Expr, ParseError> {
        self.binary(&[("+", BinOp::Add), ("-", BinOp::Sub)], Self::term, true)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        self.binary(
            &[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)],
            Self::unary,
            true,
        )
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let start = self.peek_span().start;
        if self.eat_op(&["!"]).is_some() {
            let inner = self.unary()?;
            let span = start..inner.span.end;
            return Ok(Expr {
                kind: ExprKind::Not(Box::new(inner)),
                span,
            });
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        match self.peek().cloned() {
            Some(Tok::Int(v)) => {
                let (_, span) = self.bump().unwrap_or((Tok::Int(v), 0..0));
                Ok(Expr {
                    kind: ExprKind::Int(v),
                    span,
                })
            }
            Some(Tok::Ident(name)) => {
                let span = self.peek_span();
                self.pos += 1;
                let kind = match name.as_str() {
                    "true" => ExprKind::Bool(true),
                    "false" => ExprKind::Bool(false),
                    _ => ExprKind::Ident(name),
                };
                Ok(Expr { kind, span })
            }
            Some(Tok::LParen) => {
                let start = self.peek_span().start;
                self.pos += 1;
                let mut inner = self.or()?;
                if self.peek() != Some(&Tok::RParen) {
                    return Err(self.error_here("`)`"));
                }
                let end = self.peek_span().end;
                self.pos += 1;
                inner.span = start..end;
                Ok(inner)
            }
            _ => Err(self.error_here("a number, a name or `(`")),
        }
    }

    fn finish(&self) -> Result<(), ParseError> {
        if self.pos < self.toks.len() {
            return Err(self.error_here("an operator or the end of the expression"));
        }
        Ok(())
    }
}

/// Parses a guard expression.
pub fn parse_expr(text: &str) -> Result<Expr, ParseError> {
    let mut p = Parser::new(text)?;
    if p.toks.is_empty() {
        return Err(ParseError {
            span: 0..text.len(),
            message: "empty expression".to_string(),
        });
    }
    let e = p.or()?;
    p.finish()?;
    Ok(e)
}

/// Parses one `do` entry: an action name or a slot update.
pub fn parse_stmt(text: &str) -> Result<Stmt, ParseError> {
    let mut p = Parser::new(text)?;
    let (name, span) = match p.bump() {
        Some((Tok::Ident(name), span)) => (name, span),
        _ => {
            p.pos = 0;
            return Err(p.error_here("an action name or `slot = value`"));
        }
    };
    if p.peek().is_none() {
        return Ok(Stmt::Action { name, span });
    }
    let op = match p.eat_op(&["=", "+=", "-="]) {
        Some("=") => UpdateOp::Assign,
        Some("+=") => UpdateOp::Add,
        Some("-=") => UpdateOp::Sub,
        _ => return Err(p.error_here("`=`, `+=`, `-=` or the end of the action name")),
    };
    let value = p.or()?;
    p.finish()?;
    Ok(Stmt::Update {
        slot: name,
        slot_span: span,
        op,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Int(v) => v.to_string(),
            ExprKind::Bool(b) => b.to_string(),
            ExprKind::Ident(s) => s.clone(),
            ExprKind::Not(i) => format!("!{}", show(i)),
            ExprKind::Binary(op, l, r) => format!("({} {} {})", show(l), op.symbol(), show(r)),
        }
    }

    #[test]
    fn precedence_follows_rust() {
        let e = parse_expr("a || b && !c || x + 1 * 2 >= y % 3").unwrap();
        assert_eq!(show(&e), "((a || (b && !c)) || ((x + (1 * 2)) >= (y % 3)))");
        let e = parse_expr("(a || b) && c").unwrap();
        assert_eq!(show(&e), "((a || b) && c)");
        assert_eq!(e.span, 0..13);
    }

    #[test]
    fn spans_point_into_the_text() {
        let e = parse_expr("tokens_generated + 1 >= checkpoint_every").unwrap();
        let ExprKind::Binary(_, _, rhs) = &e.kind else {
            panic!("not binary")
        };
        assert_eq!(rhs.span, 24..40);
    }

    #[test]
    fn errors_carry_spans() {
        let err = parse_expr("a && (b || c").unwrap_err();
        assert_eq!(err.span, 12..12);
        assert!(err.message.contains("`)`"), "{}", err.message);
        let err = parse_expr("a == b == c").unwrap_err();
        assert!(err.message.contains("chained"));
        let err = parse_expr("a $ b").unwrap_err();
        assert_eq!(err.span, 2..3);
        assert!(parse_expr("").is_err());
        assert!(parse_expr("a b").is_err());
        assert!(parse_expr("99999999999999999999").is_err());
        assert!(parse_expr("&&").is_err());
    }

    #[test]
    fn statements() {
        assert_eq!(
            parse_stmt("decode").unwrap(),
            Stmt::Action {
                name: "decode".into(),
                span: 0..6
            }
        );
        let Stmt::Update {
            slot, op, value, ..
        } = parse_stmt("tokens_generated += 1").unwrap()
        else {
            panic!("not an update")
        };
        assert_eq!(
            (slot.as_str(), op, show(&value)),
            ("tokens_generated", UpdateOp::Add, "1".into())
        );
        assert!(parse_stmt("x == 1").is_err());
        assert!(parse_stmt("1 = x").is_err());
        assert!(parse_stmt("x =").is_err());
    }
}
