//! aarch64 NEON kernel of [`super::qdot`] for the 32-value block types Q4_0, Q4_1 and Q8_0.
//!
//! Design: as the x86-64 kernels ([`super::qdot_x86`]): each block's codes are widened to i32,
//! converted to f32 and scaled with the reference's multiply-then-add, then multiply-added into
//! eight 4-lane accumulators per activation row.

use std::arch::aarch64::*;

use crate::loader::tensor::QuantType;

/// The f16 at byte `at` of `b`, widened.
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Widens 16 codes (u8 or i8 reinterpreted by `signed`) into four i32x4 groups, in order.
///
/// # Safety
/// The CPU has NEON.
#[target_feature(enable = "neon")]
unsafe fn widen(q: uint8x16_t, signed: bool) -> [int32x4_t; 4] {
    if signed {
        let s = vreinterpretq_s8_u8(q);
        let lo = vmovl_s8(vget_low_s8(s));
        let hi = vmovl_s8(vget_high_s8(s));
        [
            vmovl_s16(vget_low_s16(lo)),
            vmovl_s16(vget_high_s16(lo)),
            vmovl_s16(vget_low_s16(hi)),
            vmovl_s16(vget_high_s16(hi)),
        ]
    } else {
        let lo = vmovl_u8(vget_low_u8(q));
        let hi = vmovl_u8(vget_high_u8(q));
        [
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo))),
            vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(lo))),
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi))),
            vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(hi))),
        ]
    }
}

/// NEON kernel: `out[r] = dequant(w) . xs[r]`.
///
/// # Safety
/// The CPU has NEON; `ty` is Q4_0, Q4_1 or Q8_0; `w` is whole blocks of `ty`; every `xs[r]`
/// holds at least `w.len() / block_bytes * 32` values.
#[target_feature(enable = "neon")]
pub unsafe fn neon<const N: usize>(ty: QuantType, w: &[u8], xs: &[&[f32]; N]) -> [f32; N] {
    let bb = ty.block_bytes();
    let mut acc = [[vdupq_n_f32(0.0); 8]; N];
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        let d = f16_at(blk, 0);
        // SAFETY: every load reads 16 bytes inside `blk` (18, 20 or 34 bytes long).
        let (g, m): ([int32x4_t; 8], f32) = unsafe {
            match ty {
                QuantType::Q4_0 | QuantType::Q4_1 => {
                    let off = if ty == QuantType::Q4_0 { 2 } else { 4 };
                    let q = vld1q_u8(blk.as_ptr().add(off));
                    let lo = widen(vandq_u8(q, vdupq_n_u8(0x0f)), false);
                    let hi = widen(vshrq_n_u8(q, 4), false);
                    let mut g = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
                    if ty == QuantType::Q4_0 {
                        for v in &mut g {
                            *v = vsubq_s32(*v, vdupq_n_s32(8));
                        }
                        (g, 0.0)
                    } else {
                        (g, f16_at(blk, 2))
                    }
                }
                _ => {
                    let lo = widen(vld1q_u8(blk.as_ptr().add(2)), true);
                    let hi = widen(vld1q_u8(blk.as_ptr().add(18)), true);
                    (
                        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]],
                        0.0,
                    )
                }
            }
        };
        let dv = vdupq_n_f32(d);
        let mv = vdupq_n_f32(m);
        let wv: [float32x4_t; 8] = std::array::from_fn(|i| {
            let s = vmulq_f32(dv, vcvtq_f32_s32(g[i]));
            if ty == QuantType::Q4_1 {
                vaddq_f32(s, mv)
            } else {
                s
            }
        });
        for r in 0..N {
            let x = &xs[r][b * 32..b * 32 + 32];
            for i in 0..8 {
                // SAFETY: `x` holds 32 values, so lanes `4 * i .. 4 * i + 4` are readable.
                let xv = unsafe { vld1q_f32(x.as_ptr().add(4 * i)) };
                acc[r][i] = vfmaq_f32(acc[r][i], wv[i], xv);
            }
        }
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        let s = vaddq_f32(
            vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])),
            vaddq_f32(vaddq_f32(a[4], a[5]), vaddq_f32(a[6], a[7])),
        );
        vaddvq_f32(s)
    })
}
