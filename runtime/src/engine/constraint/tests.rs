//! Tests of the constraint module over a small vocabulary built here (every single byte, a few
//! multi-byte JSON pieces and one special end-of-sequence token), so they need no model. The
//! default model's vocabulary is tested in `runner::grammar_vocab`'s tests.

use serde_json::{Value, json};

use super::testing::drive_random;
use super::{ConstraintError, Grammar, GrammarCompiler, GrammarVocab, TokenConstraint, VocabToken};

const PIECES: &[&str] = &[
    "{\"", "\":", "\", \"", "\"}", "true", "false", "null", "  ", "\n",
];

/// Ids 0..=255 are the single bytes, then [`PIECES`], then the special EOS.
fn vocab() -> (GrammarVocab, u32) {
    let mut tokens: Vec<VocabToken> = (0..=255u8)
        .map(|b| VocabToken {
            bytes: vec![b],
            special: false,
        })
        .collect();
    tokens.extend(PIECES.iter().map(|p| VocabToken {
        bytes: p.as_bytes().to_vec(),
        special: false,
    }));
    let eos = tokens.len() as u32;
    tokens.push(VocabToken {
        bytes: b"<eos>".to_vec(),
        special: true,
    });
    (
        GrammarVocab::new(tokens, vec![eos]).expect("valid vocabulary"),
        eos,
    )
}

fn compiler() -> (GrammarCompiler, u32) {
    let (v, eos) = vocab();
    (GrammarCompiler::new(v).expect("compiler builds"), eos)
}

fn text(tokens: &[u32]) -> String {
    String::from_utf8(vocab().0.text_bytes(tokens)).expect("the grammar output is UTF-8")
}

#[test]
fn records_round_trip() {
    for g in [
        Grammar::JsonObject,
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "integer"}}})),
        Grammar::Regex("[a-z]+\n".into()),
        Grammar::Lark("start: \"yes\" | \"no\"".into()),
    ] {
        let r = g.to_record();
        assert!(!r.contains('\n'), "a record is one line: {r}");
        assert_eq!(Grammar::from_record(&r), Ok(g));
    }
    for bad in [
        "",
        "{",
        "{\"type\": \"xml\"}",
        "{\"type\": \"regex\", \"value\": 3}",
    ] {
        assert!(
            matches!(Grammar::from_record(bad), Err(ConstraintError::Record(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn openai_response_formats() {
    let f = |v: Value| Grammar::from_openai_response_format(&v);
    assert_eq!(f(json!({"type": "text"})), Ok(None));
    assert_eq!(
        f(json!({"type": "json_object"})),
        Ok(Some(Grammar::JsonObject))
    );
    let schema = json!({"type": "object", "properties": {"x": {"type": "string"}}});
    assert_eq!(
        f(
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}})
        ),
        Ok(Some(Grammar::JsonSchema(schema)))
    );
    for bad in [
        json!({}),
        json!({"type": "yaml"}),
        json!({"type": "json_schema"}),
        json!({"type": "json_schema", "json_schema": {"schema": 5}}),
    ] {
        assert!(
            matches!(f(bad.clone()), Err(ConstraintError::InvalidGrammar(_))),
            "{bad}"
        );
    }
}

#[test]
fn vocabulary_is_validated() {
    let t = || {
        vec![VocabToken {
            bytes: b"a".to_vec(),
            special: false,
        }]
    };
    assert!(GrammarVocab::new(t(), vec![]).is_err());
    assert!(GrammarVocab::new(t(), vec![1]).is_err());
    assert!(GrammarVocab::new(vec![], vec![0]).is_err());
    assert!(GrammarVocab::new(t(), vec![0]).is_ok());
}

#[test]
fn bad_grammars_are_errors_not_panics() {
    let (c, _) = compiler();
    for g in [
        Grammar::JsonSchema(json!({"type": "strng"})),
        Grammar::JsonSchema(json!(42)),
        Grammar::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        Grammar::JsonSchema(json!({"type": "string", "pattern": "(unclosed"})),
        Grammar::JsonSchema(json!({"type": "object", "properties": 7})),
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::Lark("this is not lark".into()),
    ] {
        match c.compile(&g) {
            Err(ConstraintError::InvalidGrammar(msg)) => assert!(!msg.is_empty()),
            other => panic!("{g:?} gave {other:?}"),
        }
    }
}

/// JSON's grammar allows any exponent (`65E6255091`), which `serde_json` refuses as out of
/// `f64` range; the exponent letters are steered down so the parse checks the structure.
#[test]
fn json_object_runs_parse_as_objects() {
    let (c, eos) = compiler();
    let bias = |id: u32| {
        if id == u32::from(b'e') || id == u32::from(b'E') {
            -1.0
        } else {
            0.0
        }
    };
    for seed in 0..8 {
        let mut m = c.compile(&Grammar::JsonObject).expect("compiles");
        let run = drive_random(&mut m, 266, &[eos], seed, 5000, &bias, false).expect("runs");
        assert!(run.finished, "seed {seed}");
        let s = text(&run.tokens);
        let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert!(v.is_object(), "{s:?}");
    }
}

#[test]
fn json_schema_runs_follow_the_schema() {
    let (c, eos) = compiler();
    let schema = json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["ok", "n"],
        "additionalProperties": false
    });
    for seed in 0..8 {
        let mut m = c
            .compile(&Grammar::JsonSchema(schema.clone()))
            .expect("compiles");
        let run = drive_random(&mut m, 266, &[eos], seed, 2000, &|_| 0.0, false).expect("runs");
        assert!(run.finished, "seed {seed}");
        let s = text(&run.tokens);
        let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        let o = v.as_object().expect("an object");
        assert_eq!(o.len(), 2, "{s}");
        assert!(o["ok"].is_boolean(), "{s}");
        assert!(
            o["n"].as_i64().is_some_and(|n| (-5..=5).contains(&n)),
            "{s}"
        );
    }
}

#[test]
fn regex_runs_match_and_finish() {
    let (c, eos) = compiler();
    for seed in 0..8 {
        let mut m = c
            .compile(&Grammar::Regex("[0-9]{3}-[a-c]{2}".into()))
            .expect("compiles");
        let run = drive_random(&mut m, 266, &[eos], seed, 50, &|_| 0.0, false).expect("runs");
        assert!(run.finished, "seed {seed}");
        let s = text(&run.tokens);
        let b = s.as_bytes();
        assert_eq!(b.len(), 6, "{s:?}");
        assert!(
            b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-',
            "{s:?}"
        );
        assert!(b[4..].iter().all(|c| (b'a'..=b'c').contains(c)), "{s:?}");
    }
}

#[test]
fn forbidden_commit_is_an_error_and_keeps_the_matcher() {
    let (c, eos) = compiler();
    let mut m = c.compile(&Grammar::Regex("ab".into())).expect("compiles");
    assert_eq!(
        m.commit(b'x'.into()),
        Err(ConstraintError::Forbidden { token: b'x'.into() })
    );
    assert_eq!(
        m.commit(9999),
        Err(ConstraintError::Forbidden { token: 9999 })
    );
    m.commit(b'a'.into()).expect("a is allowed");
    assert!(!m.is_finished());
    m.commit(b'b'.into()).expect("b is allowed");
    assert!(m.is_finished());
    // Finished: only EOS is allowed, and the model's extra ids (beyond 266) never are.
    let mut logits = vec![0f32; 300];
    m.mask_logits(&mut logits).expect("masks");
    let allowed: Vec<usize> = (0..300).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(allowed, [eos as usize]);
    assert_eq!(m.commit(eos), Ok(()));
    assert_eq!(
        m.commit(b'a'.into()),
        Err(ConstraintError::Forbidden { token: b'a'.into() })
    );
}

#[test]
fn mask_forbids_ids_beyond_the_tokenizer() {
    let (c, _) = compiler();
    let mut m = c.compile(&Grammar::JsonObject).expect("compiles");
    let mut logits = vec![1f32; 280];
    m.mask_logits(&mut logits).expect("masks");
    assert!(logits[266..].iter().all(|l| *l == f32::NEG_INFINITY));
    assert!(logits[usize::from(b'{')].is_finite());
    assert!(!logits[usize::from(b'x')].is_finite());
    // A logits row shorter than the vocabulary is masked over what it has: the first 100 ids
    // hold no `{`, the only start of a JSON object here, so nothing is left.
    let mut short = vec![1f32; 100];
    assert_eq!(m.mask_logits(&mut short), Err(ConstraintError::DeadEnd));
}

#[test]
fn replay_gives_the_live_mask() {
    let (c, eos) = compiler();
    let g = Grammar::JsonObject;
    let mut live = c.compile(&g).expect("compiles");
    let run = drive_random(&mut live, 266, &[eos], 3, 5000, &|_| 0.0, true).expect("runs");
    let n = run.tokens.len();
    for k in [0, 1, n / 2, n - 1] {
        let mut r = TokenConstraint::replay(&c, &g, &run.tokens[..k]).expect("replays");
        assert_eq!(
            r.allowed_tokens().expect("mask"),
            run.masks[k],
            "prefix {k} of {n}"
        );
    }
    let bad = [u32::from(b'x')];
    assert!(TokenConstraint::replay(&c, &g, &bad).is_err());
}
