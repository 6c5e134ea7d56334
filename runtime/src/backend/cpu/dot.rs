//! Dot products of one weight row (f32, f16, bf16 or quantized blocks) with up to four f32
//! activation rows: the row type the matrix products hand out, and the dispatch of a row to its
//! kernels -- dense rows to [`super::dense_dot`], quantized ones to [`super::qdot`].

use half::{bf16, f16};

use super::dense_dot::{DenseRow, dense_dot_rows};
use super::qdot::qdot_rows;
use crate::loader::tensor::QuantType;

/// One weight row, in the dtype the backend stores it in.
#[derive(Debug, Clone, Copy)]
pub enum WeightRow<'a> {
    /// An f32 row.
    F32(&'a [f32]),
    /// An f16 row.
    F16(&'a [f16]),
    /// A bf16 row.
    BF16(&'a [bf16]),
    /// A row of whole quantized blocks.
    Quant(QuantType, &'a [u8]),
}

impl WeightRow<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            WeightRow::F32(w) => w.len(),
            WeightRow::F16(w) => w.len(),
            WeightRow::BF16(w) => w.len(),
            WeightRow::Quant(t, w) => w.len() / t.block_bytes() * t.block_elems(),
        }
    }

    /// True when the row holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> WeightRow<'a> {
    /// The dense row, or the quantized type and blocks.
    fn split(self) -> Result<DenseRow<'a>, (QuantType, &'a [u8])> {
        match self {
            WeightRow::F32(w) => Ok(DenseRow::F32(w)),
            WeightRow::F16(w) => Ok(DenseRow::F16(w)),
            WeightRow::BF16(w) => Ok(DenseRow::BF16(w)),
            WeightRow::Quant(t, q) => Err((t, q)),
        }
    }
}

/// `out[r] = w . xs[r]` for `r < N` (`N <= 4`), over `w.len()` elements, on the fastest kernel
/// this CPU runs.
///
/// # Panics
/// When an activation row is shorter than `w` (a caller bug, never user input).
pub fn dot_rows<const N: usize>(w: WeightRow<'_>, xs: &[&[f32]; N]) -> [f32; N] {
    for x in xs {
        assert!(x.len() >= w.len(), "activation row shorter than weight row");
    }
    match w.split() {
        Ok(d) => dense_dot_rows(d, xs),
        Err((t, q)) => qdot_rows(t, q, xs),
    }
}
