// gemv.cu: out[n, m] = x[n, k] @ w[m, k]^T for a few rows of x (decode at batch 1-4), where the
// product is bound by streaming the weights once.
//
// Design: one warp per output column (weight row); the eight warps of a CTA take eight rows. A lane
// reads 16-byte pieces (8 bf16) of its weight row, UNROLL pieces per iteration issued before any
// is used, so many loads are in flight per SM; the weights are read with the streaming cache hint
// (used once). x is read as f32 through L1 (every warp of the SM reuses it) and, in fast mode,
// rounded to bf16 first so the products equal those of the bf16 cuBLAS path; precise mode keeps
// x in f32. Accumulation in f32, one warp reduction per output.
// Requires k % 8 == 0 (16-byte aligned rows); the host falls back to cuBLAS otherwise.
#include "common.cuh"

#define GEMV_MAX_N 4
#define GEMV_WARPS 8
#define UNROLL 4

// out: [n, m] f32. x: [n, k] f32. w: [m, k] bf16. round_x: 1 = round x to bf16 (fast mode).
// Grid: ceil(m / GEMV_WARPS), block: 32 * GEMV_WARPS.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_bf16(float* __restrict__ out, const float* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
          int m, int round_x) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= m) return;
    const uint4* wr = (const uint4*)(w + (size_t)row * k);
    const int vecs = k / 8;
    float acc[GEMV_MAX_N];
#pragma unroll
    for (int r = 0; r < GEMV_MAX_N; r++) acc[r] = 0.f;

    for (int v0 = lane; v0 < vecs; v0 += 32 * UNROLL) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * 32;
            wv[u] = v < vecs ? __ldcs(wr + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * 32;
            if (v >= vecs) break;
            float wf[8];
            unpack8(wv[u], wf);
#pragma unroll
            for (int r = 0; r < GEMV_MAX_N; r++) {
                if (r >= n) break;
                const float4* xp = (const float4*)(x + (size_t)r * k + (size_t)v * 8);
                const float4 a = xp[0], b = xp[1];
                float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float xv = round_x ? bf2f(f2bf(xf[j])) : xf[j];
                    s = fmaf(xv, wf[j], s);
                }
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_MAX_N; r++) {
        if (r >= n) break;
        const float s = warp_sum(acc[r]);
        if (lane == 0) out[(size_t)r * m + row] = s;
    }
}
