// mma_tiles.cuh: the tensor-core attention kernels' shared pieces -- K/V rows copied into shared
// memory with cp.async in 16-byte pieces at swizzled columns, read back with ldmatrix, and bf16
// packing for mma.sync m16n8k16 operands. Included after HEAD_DIM's `D` is defined.
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
