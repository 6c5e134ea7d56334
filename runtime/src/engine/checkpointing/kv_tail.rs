//! What a checkpoint keeps of a partial KV block: the bytes of its first `tokens` slots in every
//! part (each layer's K, then V), as [`KvBlockIo::read_block`](crate::checkpoint::driver::KvBlockIo)
//! returns them and `write_block` takes them back.
//!
//! Design: a part is `block_size` slots' bytes. In row layouts (`f32`, `bf16`, ...) a slot is one
//! row, so the first slots are the part's first rows; an e4m3 cache (`f8e4m3g16`) lays out groups
//! of 16 slots head-major, so its first slots are a list of byte ranges
//! (`sov_kernels::kv_e4m3_tail_ranges`). Both ends use [`tail_ranges`], so they agree.

use std::ops::Range;

use crate::checkpoint::snapshot::KvLayout;

/// The KV layout name of an e4m3 cache of slot groups (`KvLayout::dtype`).
pub const E4M3_GROUPED: &str = "f8e4m3g16";

/// Byte ranges of one `part`-byte part of a block in `layout` that hold its first `tokens` slots,
/// in the order a checkpoint stores them (all of it when `tokens` covers the block).
pub fn tail_ranges(layout: &KvLayout, part: usize, tokens: usize) -> Vec<Range<usize>> {
    let bs = (layout.block_size as usize).max(1);
    if tokens >= bs {
        return std::iter::once(0..part).collect();
    }
    if layout.dtype == E4M3_GROUPED {
        return sov_kernels::kv_e4m3_tail_ranges(
            layout.kv_heads as usize,
            layout.head_dim as usize,
            tokens,
        );
    }
    std::iter::once(0..part / bs * tokens).collect()
}

/// The tail of the whole block `full` ([`tail_ranges`] of each of its `2 * layers` parts).
pub fn tail_rows(layout: &KvLayout, full: &[u8], tokens: usize) -> Vec<u8> {
    let parts = (2 * layout.layers as usize).max(1);
    let part = full.len() / parts;
    let ranges = tail_ranges(layout, part, tokens);
    full.chunks(part.max(1))
        .flat_map(|p| {
            ranges
                .iter()
                .flat_map(move |r| &p[r.start.min(p.len())..r.end.min(p.len())])
        })
        .copied()
        .collect()
}

/// Writes `bytes`, a [`tail_rows`] result for `tokens` slots, over those slots of the whole
/// block `full`; the rest of `full` stays as it is.
pub fn merge_tail_rows(
    layout: &KvLayout,
    full: &mut [u8],
    bytes: &[u8],
    tokens: usize,
) -> Result<(), String> {
    let parts = (2 * layout.layers as usize).max(1);
    let part = full.len() / parts;
    let ranges = tail_ranges(layout, part, tokens);
    let keep: usize = ranges.iter().map(|r| r.len()).sum();
    if ranges.iter().any(|r| r.end > part) || bytes.len() != keep * parts {
        return Err(format!(
            "tail of {tokens} tokens is {} bytes, expected {} ({parts} parts of {part})",
            bytes.len(),
            keep * parts
        ));
    }
    let mut src = bytes;
    for dst in full.chunks_mut(part.max(1)) {
        for r in &ranges {
            let (now, rest) = src.split_at(r.len());
            dst[r.clone()].copy_from_slice(now);
            src = rest;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dtype: &str, kv_heads: u32, head_dim: u32, block_size: u32) -> KvLayout {
        KvLayout {
            layers: 2,
            kv_heads,
            head_dim,
            block_size,
            dtype: dtype.into(),
        }
    }

    #[test]
    fn row_tails_are_the_first_rows_of_each_part() {
        let l = layout("bf16", 1, 2, 4); // rows of 4 bytes, parts of 16
        let full: Vec<u8> = (0..64).collect();
        let tail = tail_rows(&l, &full, 1);
        assert_eq!(
            tail,
            [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51]
        );
        let mut back = vec![0u8; 64];
        merge_tail_rows(&l, &mut back, &tail, 1).unwrap();
        assert_eq!(&back[16..20], &full[16..20]);
        assert!(back[4..16].iter().all(|&b| b == 0));
        assert!(merge_tail_rows(&l, &mut back, &tail[1..], 1).is_err());
    }

    #[test]
    fn e4m3_tails_round_trip_the_first_slots_and_nothing_else() {
        let (h, d, bs) = (2usize, 16usize, 32usize);
        let l = layout(E4M3_GROUPED, h as u32, d as u32, bs as u32);
        let row = sov_kernels::kv_e4m3_row_bytes(h, d);
        let part = bs * row;
        let full: Vec<u8> = (0..4 * part).map(|i| (i * 7 % 251) as u8).collect();
        for tokens in [1, 15, 16, 17, 31] {
            let tail = tail_rows(&l, &full, tokens);
            assert_eq!(tail.len(), 4 * tokens * (h * d + 4 * h));
            let mut back = vec![0u8; full.len()];
            merge_tail_rows(&l, &mut back, &tail, tokens).unwrap();
            // Slot s, head k: codes at group base + (k * 16 + s % 16) * d, scale after all codes.
            for p in 0..4 {
                for s in 0..bs {
                    let g = p * part + s / 16 * 16 * row;
                    for k in 0..h {
                        let codes = g + (k * 16 + s % 16) * d;
                        let scale = g + h * 16 * d + (k * 16 + s % 16) * 4;
                        for at in (codes..codes + d).chain(scale..scale + 4) {
                            let want = if s < tokens { full[at] } else { 0 };
                            assert_eq!(
                                back[at], want,
                                "tokens {tokens} part {p} slot {s} byte {at}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(tail_rows(&l, &full, bs), full);
    }
}
