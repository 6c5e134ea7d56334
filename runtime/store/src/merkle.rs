//! The RFC 6962 Merkle tree of the verifiable log (RFC 9162 §2.1 algorithms, the tree
//! transparency-dev/merkle and the certificate-transparency logs use): leaf hash
//! SHA-256(0x00 || leaf), interior node SHA-256(0x01 || left || right), the split point of a range of
//! n leaves the largest power of two below n, and the empty tree's root SHA-256 of nothing.
//!
//! Design: [`Tree`] keeps every complete, aligned subtree hash (level k holds the hashes of the
//! aligned runs of 2^k leaves), so appending a leaf costs one hash per level it completes
//! (amortized 2), and a root, an inclusion proof or a consistency proof for any size costs
//! O(log n) hashes. The verifiers ([`verify_inclusion`], [`verify_consistency`]) need only the
//! proof and the roots, as an offline checker has them.

use sha2::{Digest as _, Sha256};

/// A SHA-256 hash (a leaf hash, a node or a root).
pub type Hash = [u8; 32];

/// Why a proof does not verify, or a proof cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The leaf index or sizes are outside the tree (or in the wrong order).
    #[error("{0}")]
    Range(String),
    /// The proof has the wrong number of hashes for these sizes.
    #[error("proof has the wrong length")]
    Length,
    /// The proof's hashes do not lead to the given root(s).
    #[error("proof does not lead to the signed root")]
    Mismatch,
}

/// SHA-256(0x00 || leaf).
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(leaf);
    h.finalize().into()
}

/// SHA-256(0x01 || left || right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// Root of the empty tree: SHA-256 of the empty string.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The largest power of two strictly below `n` (n >= 2).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// An append-only tree over leaf hashes.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// levels[k][i]: hash of leaves [i * 2^k, (i + 1) * 2^k).
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// A tree over these leaf hashes, in order.
    pub fn from_leaves(leaves: impl IntoIterator<Item = Hash>) -> Self {
        let mut t = Self::default();
        for l in leaves {
            t.push(l);
        }
        t
    }

    /// Number of leaves.
    pub fn size(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// The leaf hashes, in order.
    pub fn leaves(&self) -> &[Hash] {
        self.levels.first().map_or(&[], Vec::as_slice)
    }

    /// Append one leaf hash (see [`leaf_hash`]).
    pub fn push(&mut self, leaf: Hash) {
        let mut hash = leaf;
        let mut level = 0;
        loop {
            if self.levels.len() == level {
                self.levels.push(Vec::new());
            }
            self.levels[level].push(hash);
            let n = self.levels[level].len();
            if n % 2 == 1 {
                return;
            }
            hash = node_hash(&self.levels[level][n - 2], &self.levels[level][n - 1]);
            level += 1;
        }
    }

    /// Hash of leaves [start, start + n) where the RFC's recursion reaches such a range (n >= 1,
    /// `start` a multiple of the largest power of two <= n, the range inside the tree).
    fn range(&self, start: u64, n: u64) -> Hash {
        if n.is_power_of_two() {
            let k = n.trailing_zeros() as usize;
            return self.levels[k][(start >> k) as usize];
        }
        let k = split(n);
        node_hash(&self.range(start, k), &self.range(start + k, n - k))
    }

    /// Root of the first `size` leaves.
    pub fn root(&self, size: u64) -> Result<Hash, ProofError> {
        if size > self.size() {
            return Err(ProofError::Range(format!(
                "tree size {size} beyond the {} leaves held",
                self.size()
            )));
        }
        Ok(if size == 0 {
            empty_root()
        } else {
            self.range(0, size)
        })
    }

    /// RFC 6962 PATH(index, D[0:size]): sibling hashes from the leaf up.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Hash>, ProofError> {
        if index >= size || size > self.size() {
            return Err(ProofError::Range(format!(
                "no leaf {index} in a tree of size {size} (held: {})",
                self.size()
            )));
        }
        let mut out = Vec::new();
        self.path(index, 0, size, &mut out);
        Ok(out)
    }

    fn path(&self, m: u64, start: u64, n: u64, out: &mut Vec<Hash>) {
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < k {
            self.path(m, start, k, out);
            out.push(self.range(start + k, n - k));
        } else {
            self.path(m - k, start + k, n - k, out);
            out.push(self.range(start, k));
        }
    }

    /// RFC 6962 PROOF(old, D[0:new]): that the tree of size `old` is a prefix of size `new`.
    pub fn consistency_proof(&self, old: u64, new: u64) -> Result<Vec<Hash>, ProofError> {
        if old > new || new > self.size() {
            return Err(ProofError::Range(format!(
                "no consistency proof from size {old} to {new} (held: {})",
                self.size()
            )));
        }
        let mut out = Vec::new();
        if old > 0 && old < new {
            self.subproof(old, 0, new, true, &mut out);
        }
        Ok(out)
    }

    fn subproof(&self, m: u64, start: u64, n: u64, complete: bool, out: &mut Vec<Hash>) {
        if m == n {
            if !complete {
                out.push(self.range(start, n));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, start, k, complete, out);
            out.push(self.range(start + k, n - k));
        } else {
            self.subproof(m - k, start + k, n - k, false, out);
            out.push(self.range(start, k));
        }
    }
}

/// RFC 9162 §2.1.3.2: does `proof` show leaf hash `leaf` at `index` in the tree of `size` with
/// `root`?
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::Range(format!(
            "leaf index {index} is not below tree size {size}"
        )));
    }
    let (mut fi, mut si) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if si == 0 {
            return Err(ProofError::Length);
        }
        if fi & 1 == 1 || fi == si {
            r = node_hash(p, &r);
            while fi & 1 == 0 && fi != 0 {
                fi >>= 1;
                si >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fi >>= 1;
        si >>= 1;
    }
    if si != 0 {
        return Err(ProofError::Length);
    }
    if r != *root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

/// RFC 9162 §2.1.4.2: does `proof` show the tree of `old` leaves with `old_root` is a prefix of
/// the tree of `new` leaves with `new_root`?
pub fn verify_consistency(
    old: u64,
    new: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old > new {
        return Err(ProofError::Range(format!(
            "tree size went backwards: {old} then {new}"
        )));
    }
    if old == new {
        if !proof.is_empty() {
            return Err(ProofError::Length);
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::Mismatch)
        };
    }
    if old == 0 {
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofError::Length)
        };
    }
    if proof.is_empty() {
        return Err(ProofError::Length);
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let (mut fi, mut si) = (old - 1, new - 1);
    while fi & 1 == 1 {
        fi >>= 1;
        si >>= 1;
    }
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if si == 0 {
            return Err(ProofError::Length);
        }
        if fi & 1 == 1 || fi == si {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fi & 1 == 0 && fi != 0 {
                fi >>= 1;
                si >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fi >>= 1;
        si >>= 1;
    }
    if si != 0 {
        return Err(ProofError::Length);
    }
    if fr != *old_root || sr != *new_root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(s: &str) -> Hash {
        crate::digest::from_hex(s).unwrap()
    }

    fn bytes(s: &str) -> Vec<u8> {
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    // RFC 6962 test vectors as published in transparency-dev/merkle `proof/verify_test.go`
    // (Apache-2.0; the same values as certificate-transparency's merkle_tree_test): the eight
    // reference leaves, the roots of trees of 1..=8 of them, inclusion proofs (leaf numbers there
    // are 1-based; the indices below are 0-based) and consistency proofs.
    const LEAVES: [&str; 8] = [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ];
    const ROOTS: [&str; 8] = [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    /// (0-based leaf index, tree size, proof).
    const INCLUSION: [(u64, u64, &[&str]); 5] = [
        (0, 1, &[]),
        (
            0,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            5,
            8,
            &[
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            3,
            &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"],
        ),
        (
            1,
            5,
            &[
                "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
    ];
    /// (old size, new size, proof).
    const CONSISTENCY: [(u64, u64, &[&str]); 5] = [
        (1, 1, &[]),
        (
            1,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            6,
            8,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            5,
            &[
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
        (
            6,
            7,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
    ];

    fn reference() -> Tree {
        Tree::from_leaves(LEAVES.iter().map(|l| leaf_hash(&bytes(l))))
    }

    fn hashes(p: &[&str]) -> Vec<Hash> {
        p.iter().map(|s| h(s)).collect()
    }

    #[test]
    fn roots_match_the_published_vectors() {
        let t = reference();
        assert_eq!(t.root(0).unwrap(), h(EMPTY));
        for (n, want) in ROOTS.iter().enumerate() {
            assert_eq!(t.root(n as u64 + 1).unwrap(), h(want), "size {}", n + 1);
        }
        assert!(t.root(9).is_err());
    }

    #[test]
    fn inclusion_proofs_match_and_verify() {
        let t = reference();
        for (index, size, proof) in INCLUSION {
            let want = hashes(proof);
            assert_eq!(
                t.inclusion_proof(index, size).unwrap(),
                want,
                "{index}/{size}"
            );
            let root = h(ROOTS[size as usize - 1]);
            let leaf = t.leaves()[index as usize];
            verify_inclusion(index, size, &leaf, &want, &root).unwrap();
            // The corruptions of transparency-dev's corruptInclusionProof: all refused.
            let mut bad: Vec<(u64, u64, Hash, Vec<Hash>, Hash)> = vec![
                (index.wrapping_sub(1), size, leaf, want.clone(), root),
                (index + 1, size, leaf, want.clone(), root),
                (index ^ 2, size, leaf, want.clone(), root),
                (index, size * 2, leaf, want.clone(), root),
                (index, size / 2, leaf, want.clone(), root),
                (index, size, [7; 32], want.clone(), root),
                (index, size, leaf, want.clone(), h(EMPTY)),
                (index, size, leaf, [want.clone(), vec![root]].concat(), root),
                (index, size, leaf, [vec![root], want.clone()].concat(), root),
            ];
            for i in 0..want.len() {
                let mut w = want.clone();
                w[i][0] ^= 8;
                bad.push((index, size, leaf, w, root));
            }
            if !want.is_empty() {
                bad.push((index, size, leaf, want[..want.len() - 1].to_vec(), root));
            }
            for (k, (i, s, l, p, r)) in bad.into_iter().enumerate() {
                assert!(
                    verify_inclusion(i, s, &l, &p, &r).is_err(),
                    "{index}/{size}: corruption {k} verified"
                );
            }
        }
    }

    #[test]
    fn consistency_proofs_match_and_verify() {
        let t = reference();
        for (old, new, proof) in CONSISTENCY {
            let want = hashes(proof);
            assert_eq!(t.consistency_proof(old, new).unwrap(), want, "{old}->{new}");
            let (r1, r2) = (h(ROOTS[old as usize - 1]), h(ROOTS[new as usize - 1]));
            verify_consistency(old, new, &r1, &r2, &want).unwrap();
            if want.is_empty() {
                continue;
            }
            let mut bad: Vec<(u64, u64, Hash, Hash, Vec<Hash>)> = vec![
                (old - 1, new, r1, r2, want.clone()),
                (old + 1, new, r1, r2, want.clone()),
                (old ^ 2, new, r1, r2, want.clone()),
                (old, new * 2, r1, r2, want.clone()),
                (old, new / 2, r1, r2, want.clone()),
                (old, new, [1; 32], r2, want.clone()),
                (old, new, r1, [1; 32], want.clone()),
                (old, new, r2, r1, want.clone()),
                (old, new, r1, r2, vec![]),
                (old, new, r1, r2, [want.clone(), vec![r1]].concat()),
                (old, new, r1, r2, [want.clone(), vec![r2]].concat()),
                (old, new, r1, r2, [vec![r1], want.clone()].concat()),
                (old, new, r1, r2, [vec![r2], want.clone()].concat()),
                (old, new, r1, r2, [vec![want[0]], want.clone()].concat()),
                (old, new, r1, r2, want[..want.len() - 1].to_vec()),
            ];
            for i in 0..want.len() {
                let mut w = want.clone();
                w[i][0] ^= 16;
                bad.push((old, new, r1, r2, w));
            }
            for (k, (a, b, x, y, p)) in bad.into_iter().enumerate() {
                assert!(
                    verify_consistency(a, b, &x, &y, &p).is_err(),
                    "{old}->{new}: corruption {k} verified"
                );
            }
        }
        // The edge cases of TestVerifyConsistency.
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert!(verify_consistency(0, 0, &a, &b, &[]).is_err());
        assert!(verify_consistency(1, 1, &a, &b, &[]).is_err());
        verify_consistency(0, 0, &a, &a, &[]).unwrap();
        verify_consistency(0, 1, &a, &b, &[]).unwrap();
        assert!(verify_consistency(1, 0, &a, &b, &[]).is_err());
        assert!(verify_consistency(1, 2, &a, &b, &[]).is_err());
        let e = h(EMPTY);
        assert!(verify_consistency(0, 1, &e, &e, &[e]).is_err());
        assert!(verify_consistency(1, 1, &e, &e, &[e]).is_err());
    }

    #[test]
    fn every_proof_of_larger_trees_verifies() {
        let t = Tree::from_leaves((0..70u32).map(|i| leaf_hash(&i.to_le_bytes())));
        for n in 1..=t.size() {
            let root = t.root(n).unwrap();
            for i in 0..n {
                let p = t.inclusion_proof(i, n).unwrap();
                verify_inclusion(i, n, &t.leaves()[i as usize], &p, &root).unwrap();
            }
            for m in 0..=n {
                let p = t.consistency_proof(m, n).unwrap();
                verify_consistency(m, n, &t.root(m).unwrap(), &root, &p).unwrap();
            }
        }
    }

    proptest! {
        #[test]
        fn verifiers_never_panic(
            index in any::<u64>(), size in any::<u64>(), old in any::<u64>(),
            proof in proptest::collection::vec(any::<[u8; 32]>(), 0..70),
        ) {
            let _ = verify_inclusion(index, size, &[0; 32], &proof, &[1; 32]);
            let _ = verify_consistency(old, size, &[0; 32], &[1; 32], &proof);
            let _ = verify_consistency(old % 70, size % 70, &[0; 32], &[1; 32], &proof);
        }
    }
}
