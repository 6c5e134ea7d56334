//! The C2SP tlog-witness wire format (<https://c2sp.org/tlog-witness>), both directions.
//!
//! `POST /add-checkpoint` body: `old <size>\n`, zero to [`MAX_PROOF_LINES`] consistency proof
//! lines (standard base64 of one 32-byte hash each), an empty line, then the signed checkpoint
//! note. Replies: 200 with one or more note signature lines (cosignatures); 409 with the witness's
//! size as `<decimal>\n` ([`SIZE_CONTENT_TYPE`]); other statuses per [`super::AddError::status`].

use base64ct::{Base64, Encoding};

use super::checkpoint::{parse_decimal, parse_hash};
use super::error::AddError;
use crate::merkle::Hash;
use crate::note;

/// Most consistency proof lines a client may send.
pub const MAX_PROOF_LINES: usize = 63;
/// Content type of a 409 reply's body.
pub const SIZE_CONTENT_TYPE: &str = "text/x.tlog.size";
/// Path of the submission endpoint under a witness's submission prefix.
pub const ADD_CHECKPOINT_PATH: &str = "/add-checkpoint";

/// One `add-checkpoint` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddCheckpoint {
    /// Size of the checkpoint the client believes the witness holds (0: none).
    pub old: u64,
    /// RFC 6962 consistency proof from `old` to the checkpoint's size.
    pub proof: Vec<Hash>,
    /// The signed checkpoint note (body, blank line, signature lines).
    pub checkpoint: String,
}

fn malformed(what: &str) -> AddError {
    AddError::Malformed(what.to_string())
}

impl AddCheckpoint {
    /// The request body.
    pub fn to_body(&self) -> String {
        let mut s = format!("old {}\n", self.old);
        for h in &self.proof {
            s.push_str(&Base64::encode_string(h));
            s.push('\n');
        }
        s.push('\n');
        s.push_str(&self.checkpoint);
        s
    }

    /// Parse a request body. Errors are [`AddError::Malformed`]; never panics.
    pub fn parse(body: &[u8]) -> Result<Self, AddError> {
        let text = std::str::from_utf8(body).map_err(|_| malformed("body is not UTF-8"))?;
        let (first, mut rest) = text
            .split_once('\n')
            .ok_or_else(|| malformed("no old size line"))?;
        let old = first
            .strip_prefix("old ")
            .and_then(parse_decimal)
            .ok_or_else(|| malformed("first line must be `old <decimal size>`"))?;
        let mut proof = Vec::new();
        loop {
            let (line, after) = rest
                .split_once('\n')
                .ok_or_else(|| malformed("no empty line before the checkpoint"))?;
            rest = after;
            if line.is_empty() {
                break;
            }
            if proof.len() == MAX_PROOF_LINES {
                return Err(malformed("more than 63 consistency proof lines"));
            }
            proof.push(
                parse_hash(line)
                    .ok_or_else(|| malformed("a proof line is not base64 of 32 bytes"))?,
            );
        }
        note::parse(rest).map_err(|e| AddError::Malformed(format!("checkpoint: {e}")))?;
        Ok(Self {
            old,
            proof,
            checkpoint: rest.to_string(),
        })
    }
}

/// A 409 reply's body: the witness's size and a newline.
pub fn size_body(size: u64) -> String {
    format!("{size}\n")
}

/// Parse a 409 reply's body.
pub fn parse_size_body(body: &str) -> Option<u64> {
    body.strip_suffix('\n').and_then(parse_decimal)
}

/// Split a 200 reply into its signature lines (each `— <name> <base64>`, newline-terminated);
/// errors on anything else. The lines are checked against keys by [`super::cosignatures`].
pub fn parse_cosignature_lines(body: &str) -> Result<Vec<String>, String> {
    if body.is_empty() || !body.ends_with('\n') {
        return Err("cosignature reply must be newline-terminated signature lines".into());
    }
    let lines: Vec<String> = body[..body.len() - 1]
        .split('\n')
        .map(|l| format!("{l}\n"))
        .collect();
    // Validate the syntax with the note parser over a placeholder body.
    note::parse(&format!("x\n\n{}", lines.concat()))
        .map_err(|e| format!("cosignature reply: {e}"))?;
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The example request body of c2sp.org/tlog-witness (its signature lines are placeholders
    /// there; the codec only needs them well-formed).
    const SPEC_EXAMPLE: &str = "old 20852014\nPlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\njrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n\nexample.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n\u{2014} example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n\u{2014} example.com/behind-the-sofa opLqBQsREYCgu6xQkYQwJr9fo45a62DN9EdmHXnZdXNqlcVGlCum2Wks+49/V6267UEjw6QUXTS5Rovnzv++qbSzm9Q=\n";

    #[test]
    fn parses_the_spec_example_and_round_trips() {
        let r = AddCheckpoint::parse(SPEC_EXAMPLE.as_bytes()).unwrap();
        assert_eq!(r.old, 20852014);
        assert_eq!(r.proof.len(), 4);
        assert!(
            r.checkpoint
                .starts_with("example.com/behind-the-sofa\n20852163\n")
        );
        assert_eq!(r.to_body(), SPEC_EXAMPLE);
    }

    #[test]
    fn refuses_malformed_bodies() {
        let ok = SPEC_EXAMPLE;
        let too_many = {
            let line = "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n";
            ok.replacen("old 20852014\n", &format!("old 1\n{}", line.repeat(64)), 1)
        };
        for bad in [
            ok.replacen("old 20852014", "old 020852014", 1),
            ok.replacen("old 20852014", "old  20852014", 1),
            ok.replacen("old 20852014", "size 20852014", 1),
            ok.replacen("PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=", "PlRN", 1),
            ok.replacen("\n\nexample.com", "\nexample.com", 1),
            ok.replacen("\n\n\u{2014}", "\n\u{2014}", 1),
            too_many,
            String::new(),
            "old 0\n".into(),
        ] {
            let e = AddCheckpoint::parse(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{bad:?}: {e}");
        }
        assert!(AddCheckpoint::parse(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn size_bodies_and_reply_lines() {
        assert_eq!(parse_size_body(&size_body(42)), Some(42));
        assert_eq!(parse_size_body("42"), None);
        assert_eq!(parse_size_body("042\n"), None);
        // The example reply of c2sp.org/tlog-witness.
        let reply = "\u{2014} witness.example/w1 CMp+6LWBU0anHGH5aNDTJkH/gj79sG+T6+iP2ThYN5krrDJbR1HDnucjL39QsZTSvVjyQLrdk3DXDqI5G2HgLatVs0pWh6Up69HVOw==\n\u{2014} witness.example/w2 AWui8Sk55XjYLOijihBjhqEH6nS1ndDymE0a+6idX7pLcnoB+dhnz0854aLZgrrKbYKA7nC3HNJhm/kWl7oJlqU3rXXvpysAdyP3wQ==\n";
        assert_eq!(parse_cosignature_lines(reply).unwrap().len(), 2);
        assert!(parse_cosignature_lines("not a signature\n").is_err());
        assert!(parse_cosignature_lines("").is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(
            text in "(old [0-9]{0,3}\n)?([A-Za-z0-9+/=]{0,44}\n){0,3}\n?(.{0,20}\n){0,5}(\u{2014} [a-z]{1,4} [A-Za-z0-9+/=]{0,100}\n){0,2}",
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let _ = AddCheckpoint::parse(text.as_bytes());
            let _ = AddCheckpoint::parse(&bytes);
            let _ = parse_size_body(&text);
            let _ = parse_cosignature_lines(&text);
        }

        #[test]
        fn mutated_requests_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
            let mut b = SPEC_EXAMPLE.as_bytes().to_vec();
            for (i, c) in edits {
                let at = i.index(b.len());
                b[at] = c;
            }
            let _ = AddCheckpoint::parse(&b);
        }
    }
}
