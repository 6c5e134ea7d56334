//! The fixed part of a C2SP checkpoint body (<https://c2sp.org/tlog-checkpoint>): an origin line,
//! the tree size in decimal (no leading zeros), the root hash in standard base64, then optional
//! extension lines. A witness reads only these three lines; sov's extension lines are the log's.

use base64ct::{Base64, Encoding};

use crate::merkle::Hash;

/// The three lines a witness checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The origin line: names the log.
    pub origin: String,
    /// Tree size.
    pub size: u64,
    /// RFC 6962 root of the first `size` leaves.
    pub root: Hash,
}

/// A decimal without leading zeros (`0` itself allowed), as the C2SP formats require.
pub fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

/// A canonical standard-base64 encoding of exactly 32 bytes.
pub fn parse_hash(s: &str) -> Option<Hash> {
    let raw = Base64::decode_vec(s).ok()?;
    if Base64::encode_string(&raw) != s {
        return None;
    }
    raw.as_slice().try_into().ok()
}

impl Checkpoint {
    /// Parse the first three lines of a checkpoint note body (extension lines are ignored).
    pub fn parse(body: &str) -> Result<Self, String> {
        let mut lines = body.split('\n');
        let origin = lines.next().unwrap_or("");
        if origin.is_empty() || origin.chars().any(char::is_control) {
            return Err("checkpoint: empty or invalid origin line".into());
        }
        let size = lines
            .next()
            .and_then(parse_decimal)
            .ok_or("checkpoint: tree size is not a decimal without leading zeros")?;
        let root = lines
            .next()
            .and_then(parse_hash)
            .ok_or("checkpoint: root hash is not base64 of 32 bytes")?;
        if lines.next().is_none() {
            return Err("checkpoint: body must end in a newline".into());
        }
        Ok(Self {
            origin: origin.to_string(),
            size,
            root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_c2sp_example() {
        // The example checkpoint of c2sp.org/tlog-checkpoint and tlog-witness.
        let c = Checkpoint::parse(
            "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        )
        .unwrap();
        assert_eq!(c.origin, "example.com/behind-the-sofa");
        assert_eq!(c.size, 20852163);
        assert_eq!(
            Base64::encode_string(&c.root),
            "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="
        );
        for bad in [
            "o\n01\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
            "o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I\n",
            "\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
            "o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",
            "o\n-1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        ] {
            assert!(Checkpoint::parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(text in "(.{0,30}\n){0,4}.{0,20}") {
            let _ = Checkpoint::parse(&text);
            let _ = parse_decimal(&text);
            let _ = parse_hash(&text);
        }
    }
}
