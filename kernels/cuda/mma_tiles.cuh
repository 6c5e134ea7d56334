// mma_tiles.cuh: the tensor-core attention kernels' shared pieces -- K/V rows copied into shared
// memory with cp.async in 16-byte pieces at swizzled columns, read back with ldmatrix, and bf16
// packing for mma.sync m16n8k16 operands. Included after HEAD_DIM's `D` is defined.
//
// With -DKV_FP8 (an e4m3 cache, common.cuh) the codes are staged unswizzled, widened to f16 into
// the same swizzled tile layout (widen_rows), and the mma operands are f16 (MMA_AB, pack_ab):
// every e4m3 value is exact in f16, whose 10-bit mantissa also keeps Q and P closer than bf16.
// The per-token scales are applied to the scores (K) and to P before it is packed (V).
//
// A token row of D bf16 is D / 8 pieces of 16 bytes; piece p of row `tok` lands at column
// (p ^ (tok & 7)), so the 8 rows an ldmatrix reads fall into different banks.

// Byte offset of (token row, 16-byte piece) inside a K or V tile of rows of D bf16, swizzled against
// bank conflicts. Shared-memory addresses are kept as 32-bit shared-window offsets throughout.
__device__ __forceinline__ u32 slot_offset(int tok, int piece) { return (u32)(tok * D * 2 + ((piece ^ (tok & 7)) << 4)); }

// .ca rather than .cg: through L1 a warp's 16-byte pieces reach L2 as whole 128-byte requests (with
// .cg each sector was requested twice; measured with ncu on the H200). `valid` false zero-fills.
__device__ __forceinline__ void cp_async16(u32 dst, const void* gmem, bool valid) {
    const int src_size = valid ? 16 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Four 8x8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldsm_x4(u32* r, u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(u32* r, u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// Two f32 -> one register of two bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two f32 -> one register of two f16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The mma operand type of Q, K, P and V: f16 over an e4m3 cache, bf16 otherwise.
#ifdef KV_FP8
#define MMA_AB "f16"
__device__ __forceinline__ u32 pack_ab(float lo, float hi) { return pack_f16x2(lo, hi); }
#else
#define MMA_AB "bf16"
__device__ __forceinline__ u32 pack_ab(float lo, float hi) { return pack_bf16x2(lo, hi); }
#endif

// 4-byte cp.async (an e4m3 cache's per-token scale); `valid` false zero-fills.
__device__ __forceinline__ void cp_async4(u32 dst, const void* gmem, bool valid) {
    const int src_size = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size) : "memory");
}
__device__ __forceinline__ uint4 ld_shared16(u32 at) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(at));
    return v;
}
__device__ __forceinline__ void st_shared16(u32 at, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ float ld_shared_f32(u32 at) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(at));
    return v;
}

// Widens `rows` rows of D e4m3 codes, staged unswizzled at `codes` (row r at r * D bytes), to f16
// rows at `wide` in slot_offset's swizzled layout; `n_threads` threads with indices `t` share the
// work (a warp, or a CTA). Each 16-byte piece of codes becomes the row's two 16-byte f16 pieces.
__device__ __forceinline__ void widen_rows(u32 codes, u32 wide, int rows, int t, int n_threads) {
    for (int i = t; i < rows * (D / 16); i += n_threads) {
        const int row = i / (D / 16), piece = i % (D / 16);
        const uint4 c = ld_shared16(codes + (u32)(row * D + piece * 16));
        const u32 w[4] = {c.x, c.y, c.z, c.w};
        u32 h[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            h[2 * k] = e4m3x2_to_f16x2((unsigned short)(w[k] & 0xffffu));
            h[2 * k + 1] = e4m3x2_to_f16x2((unsigned short)(w[k] >> 16));
        }
        st_shared16(wide + slot_offset(row, 2 * piece), make_uint4(h[0], h[1], h[2], h[3]));
        st_shared16(wide + slot_offset(row, 2 * piece + 1), make_uint4(h[4], h[5], h[6], h[7]));
    }
}
