//! BLAKE3 digests used across checkpoints: block hashes, the KV root over a snapshot's ordered block
//! hashes, and lowercase-hex text for receipts. Each use is domain-separated with a BLAKE3
//! `derive_key` context so a block hash can never be confused with a snapshot or receipt digest.

/// A 32-byte BLAKE3 digest.
pub type Digest = [u8; 32];

/// Domain contexts (BLAKE3 key-derivation mode) for each kind of digest.
mod context {
    pub const BLOCK: &str = "sov checkpoint v1 kv block";
    pub const KV_ROOT: &str = "sov checkpoint v1 kv root";
    pub const SNAPSHOT: &str = "sov checkpoint v1 snapshot";
    pub const RECEIPT: &str = "sov checkpoint v1 receipt";
    pub const RECORD: &str = "sov checkpoint v1 record checksum";
}

fn keyed(context: &str) -> blake3::Hasher {
    blake3::Hasher::new_derive_key(context)
}

/// Content address of one KV block's bytes.
pub fn block_hash(bytes: &[u8]) -> Digest {
    *keyed(context::BLOCK).update(bytes).finalize().as_bytes()
}

/// KV root: BLAKE3 over every sequence's ordered block-hash list (sequence count, then per sequence
/// its block count and hashes), so reordering blocks within or across sequences changes the root.
pub fn kv_root<'a>(sequences: impl IntoIterator<Item = &'a [Digest]>) -> Digest {
    let mut hasher = keyed(context::KV_ROOT);
    let mut count = 0u64;
    let mut body = blake3::Hasher::new();
    for hashes in sequences {
        count += 1;
        body.update(&(hashes.len() as u64).to_le_bytes());
        for h in hashes {
            body.update(h);
        }
    }
    hasher.update(&count.to_le_bytes());
    hasher.update(body.finalize().as_bytes());
    *hasher.finalize().as_bytes()
}

/// Digest of a serialized snapshot file.
pub fn snapshot_digest(bytes: &[u8]) -> Digest {
    *keyed(context::SNAPSHOT).update(bytes).finalize().as_bytes()
}

/// Digest of a receipt's canonical (signed) body; the chain links and slots 8..15 carry it.
pub fn receipt_digest(body: &[u8]) -> Digest {
    *keyed(context::RECEIPT).update(body).finalize().as_bytes()
}

/// Short checksum of an index or journal record (detects torn and flipped bytes, not an adversary:
/// the receipts' signatures and digests do that).
pub fn record_checksum(parts: &[&[u8]]) -> [u8; 8] {
    let mut hasher = keyed(context::RECORD);
    for p in parts {
        hasher.update(p);
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
    out
}

/// Lowercase hex of a digest.
pub fn to_hex(d: &Digest) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(64);
    for b in d {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Parse exactly 64 lowercase hex digits (the canonical form; uppercase is refused).
pub fn from_hex(s: &str) -> Option<Digest> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_is_canonical() {
        let d = block_hash(b"abc");
        assert_eq!(from_hex(&to_hex(&d)), Some(d));
        assert_eq!(from_hex(&to_hex(&d).to_uppercase()), None);
        assert_eq!(from_hex("00"), None);
    }

    #[test]
    fn digests_are_domain_separated() {
        let plain = *blake3::hash(b"x").as_bytes();
        assert_ne!(block_hash(b"x"), plain);
        assert_ne!(block_hash(b"x"), snapshot_digest(b"x"));
        assert_ne!(snapshot_digest(b"x"), receipt_digest(b"x"));
    }

    #[test]
    fn kv_root_depends_on_order_and_grouping() {
        let a = block_hash(b"a");
        let b = block_hash(b"b");
        let one = kv_root([&[a, b][..]]);
        assert_ne!(one, kv_root([&[b, a][..]]));
        assert_ne!(one, kv_root([&[a][..], &[b][..]]));
        assert_ne!(kv_root([&[][..]]), kv_root(std::iter::empty::<&[Digest]>()));
    }
}
