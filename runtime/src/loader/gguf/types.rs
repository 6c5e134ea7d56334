//! ggml tensor types as GGUF stores them: ids, names and block geometry.
//!
//! Design: the table mirrors `GGML_QUANT_SIZES` of the `gguf` Python package 0.19.0 (ggml.h's
//! `ggml_type`). Knowing every type's block size lets the reader bounds-check any file, while
//! [`GgmlType::is_supported`] says which ones sov can load.

/// A ggml element/block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType {
    /// ggml's numeric type id, as stored in GGUF tensor entries.
    pub id: u32,
    name: &'static str,
    /// Elements per block.
    block_elems: u64,
    /// Bytes per block.
    block_bytes: u64,
}

/// (id, name, elements per block, bytes per block), from gguf-py 0.19.0 `GGML_QUANT_SIZES`.
const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: GgmlType = GgmlType::known(0);
    /// 16-bit IEEE float.
    pub const F16: GgmlType = GgmlType::known(1);
    /// 4-bit blocks of 32 with one f16 scale.
    pub const Q4_0: GgmlType = GgmlType::known(2);
    /// 4-bit blocks of 32 with an f16 scale and an f16 minimum.
    pub const Q4_1: GgmlType = GgmlType::known(3);
    /// 8-bit blocks of 32 with one f16 scale.
    pub const Q8_0: GgmlType = GgmlType::known(8);
    /// 4-bit k-quant super-blocks of 256.
    pub const Q4_K: GgmlType = GgmlType::known(12);
    /// 5-bit K-quant super-block.
    pub const Q5_K: GgmlType = GgmlType::known(13);
    /// 6-bit k-quant super-blocks of 256.
    pub const Q6_K: GgmlType = GgmlType::known(14);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType::known(30);

    /// The type with ggml id `id`, if ggml defines one.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|e| e.0 == id)
            .map(|&(id, name, block_elems, block_bytes)| GgmlType {
                id,
                name,
                block_elems,
                block_bytes,
            })
    }

    const fn known(id: u32) -> GgmlType {
        let mut i = 0;
        while i < TABLE.len() {
            let (tid, name, block_elems, block_bytes) = TABLE[i];
            if tid == id {
                return GgmlType {
                    id,
                    name,
                    block_elems,
                    block_bytes,
                };
            }
            i += 1;
        }
        panic!("GgmlType::known: id not in TABLE (compile-time constant)");
    }

    /// ggml's name for the type (`Q4_1`, `F16`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Elements per block (1 for plain types like `F32`).
    pub fn block_elems(&self) -> u64 {
        self.block_elems
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Whether sov can dequantize this type.
    pub fn is_supported(&self) -> bool {
        [
            Self::F32,
            Self::F16,
            Self::BF16,
            Self::Q8_0,
            Self::Q4_0,
            Self::Q4_1,
            Self::Q4_K,
            Self::Q5_K,
            Self::Q6_K,
        ]
        .contains(self)
    }

    /// Bytes a tensor of dimensions `ne` (innermost first) occupies, or `None` when its rows are
    /// not a whole number of blocks or the size overflows.
    pub fn byte_size(&self, ne: &[u64]) -> Option<u64> {
        let row = *ne.first()?;
        if !row.is_multiple_of(self.block_elems) {
            return None;
        }
        let rows = ne[1..]
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        (row / self.block_elems)
            .checked_mul(self.block_bytes)?
            .checked_mul(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_geometry_matches_the_ggml_definitions() {
        assert_eq!(GgmlType::Q8_0.block_bytes(), 2 + 32);
        assert_eq!(GgmlType::Q4_0.block_bytes(), 2 + 16);
        assert_eq!(GgmlType::Q4_1.block_bytes(), 2 + 2 + 16);
        assert_eq!(GgmlType::Q4_1.byte_size(&[64, 3]), Some(2 * 20 * 3));
        assert_eq!(GgmlType::Q4_1.byte_size(&[33, 3]), None);
        assert_eq!(GgmlType::F32.byte_size(&[5, 7]), Some(140));
        assert_eq!(GgmlType::F16.byte_size(&[u64::MAX, 2]), None);
        assert_eq!(GgmlType::from_id(12).map(|t| t.name()), Some("Q4_K"));
        assert!(GgmlType::from_id(4).is_none());
        assert!(GgmlType::from_id(12).is_some_and(|t| t.is_supported()));
        assert!(!GgmlType::from_id(11).is_some_and(|t| t.is_supported()));
    }
}
