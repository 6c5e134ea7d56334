//! Quantized weight storage: GGUF block formats kept as they are in the file.
//!
//! Design: a [`QuantData`] is a row-major matrix of whole blocks in ggml's layout (ggml-common.h;
//! blocks run along a row, so a row is `cols / block_elems` consecutive blocks). Nothing is
//! widened at load: the CPU kernels (`crate::backend::cpu::qdot`) read the blocks directly, and
//! [`decode_block`] is the scalar reference every kernel is tested against (itself tested against
//! the `gguf` Python package's dequantization, see `fixtures/make_gguf_fixtures.py`).

use super::types::GgmlType;
use super::{blocks, kquants};

/// A quantized block format sov computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32 values: f16 scale, 4-bit codes; `x = (q - 8) * d`.
    Q4_0,
    /// 32 values: f16 scale and min, 4-bit codes; `x = q * d + m`.
    Q4_1,
    /// 32 values: f16 scale, 8-bit codes; `x = q * d`.
    Q8_0,
    /// 256 values: 8 sub-blocks of 4-bit codes with 6-bit scales and mins.
    Q4K,
    /// 256 values: 8 sub-blocks of 5-bit codes with 6-bit scales and mins.
    Q5K,
    /// 256 values: 16 sub-blocks of 6-bit codes with 8-bit scales.
    Q6K,
}

impl QuantType {
    /// Every quantized type, for tests and tables.
    pub const ALL: [QuantType; 6] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
    ];

    /// The quantized type of a ggml type, if sov computes with it.
    pub fn from_ggml(t: GgmlType) -> Option<QuantType> {
        Some(match t {
            t if t == GgmlType::Q4_0 => QuantType::Q4_0,
            t if t == GgmlType::Q4_1 => QuantType::Q4_1,
            t if t == GgmlType::Q8_0 => QuantType::Q8_0,
            t if t == GgmlType::Q4_K => QuantType::Q4K,
            t if t == GgmlType::Q5_K => QuantType::Q5K,
            t if t == GgmlType::Q6_K => QuantType::Q6K,
            _ => return None,
        })
    }

    /// ggml's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
        }
    }

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0 => 32,
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q8_0 => 34,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
        }
    }

    /// Bytes of `elems` values (a whole number of blocks), or `None` when `elems` is not one.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        elems
            .is_multiple_of(self.block_elems())
            .then(|| elems / self.block_elems() * self.block_bytes())
    }
}

/// Decodes one block of type `ty` (`ty.block_bytes()` bytes) into `ty.block_elems()` f32 values,
/// with the arithmetic of gguf-py 0.19.0's `dequantize_blocks` (so the results are bit-identical).
///
/// # Panics
/// When `block` or `out` is shorter than one block (a caller bug).
pub fn decode_block(ty: QuantType, block: &[u8], out: &mut [f32]) {
    match ty {
        QuantType::Q4_0 => blocks::block_q4_0(block, out),
        QuantType::Q4_1 => blocks::block_q4_1(block, out),
        QuantType::Q8_0 => blocks::block_q8_0(block, out),
        QuantType::Q4K => kquants::block_q4_k(block, out),
        QuantType::Q5K => kquants::block_q5_k(block, out),
        QuantType::Q6K => kquants::block_q6_k(block, out),
    }
}

/// Decodes whole blocks of `ty` from `bytes` into `out` (`out.len()` values, a multiple of the
/// block size; `bytes` holds at least as many blocks).
///
/// # Panics
/// When `out` is not a whole number of blocks or `bytes` is too short (a caller bug).
pub fn decode_blocks(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    assert!(
        out.len().is_multiple_of(be) && bytes.len() >= out.len() / be * bb,
        "decode_blocks: not whole blocks"
    );
    for (o, b) in out.chunks_exact_mut(be).zip(bytes.chunks_exact(bb)) {
        decode_block(ty, b, o);
    }
}

/// A quantized tensor's blocks, row-major (`numel / block_elems` blocks of `block_bytes` each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantData {
    /// The block format.
    pub ty: QuantType,
    /// The blocks, exactly as in the file (after any row reordering).
    pub bytes: Vec<u8>,
}

impl QuantData {
    /// Number of values the blocks hold.
    pub fn numel(&self) -> usize {
        self.bytes.len() / self.ty.block_bytes() * self.ty.block_elems()
    }

    /// All values widened to f32 (the reference dequantization).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        decode_blocks(self.ty, &self.bytes, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_the_ggml_table() {
        for t in QuantType::ALL {
            let g = [
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
            ]
            .into_iter()
            .find(|g| QuantType::from_ggml(*g) == Some(t))
            .expect("every type has a ggml id");
            assert_eq!(g.name(), t.name());
            assert_eq!(g.block_elems() as usize, t.block_elems());
            assert_eq!(g.block_bytes() as usize, t.block_bytes());
        }
        assert_eq!(QuantType::from_ggml(GgmlType::F16), None);
        assert_eq!(QuantType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(QuantType::Q4_1.bytes_for(65), None);
    }
}
