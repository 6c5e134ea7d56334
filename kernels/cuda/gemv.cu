// gemv.cu: out[n, m] = x[n, k] @ w[m, k]^T for a few rows of x (decode at batch 1; up to 4 allowed),
// where the product is bound by streaming the weights once; and the same product fused with the
// SwiGLU activation of a [gate; up] weight: out[r, j] = swiglu(x[r] . w[j], x[r] . w[f + j]).
//
// Design: one warp per weight row; the eight warps of a CTA take eight rows, the grid has
// ceil(rows / 8) CTAs. A lane reads 16-byte pieces (8 bf16) of the row, UNROLL pieces per round
// issued before any is used; the weights are read with the streaming cache hint (used once). x arrives as f32 -- no cast kernel in front -- and is read
// through L1, which every warp of the SM shares; each element is rounded to bf16 as it is used, so
// the products are those of the cuBLAS path (which multiplies a bf16 copy of x). Accumulation in
// f32, one warp reduction per row. Requires k % 8 == 0 (16-byte rows); the host falls back to cuBLAS
// otherwise.
//
// Four entry points from one template: gemv_bf16 / gemv_swiglu take up to GEMV_MAX_N rows of x;
// gemv_bf16_1 / gemv_swiglu_1 take exactly one, which needs fewer registers: they are compiled for
// ROW_MIN_BLOCKS CTAs per SM (32 registers a thread at 8), so every CTA of the qkv product is resident
// in one wave (at 47 registers 5 CTAs fit, and qkv's 768 CTAs needed 1.16 waves). Fewer pieces per
// round (UNROLL 2) measured better at that occupancy. A product of few rows can give each row
// `split` warps (the host picks the most that keep the grid in one wave: 2 for Llama-3-8B's o and
// down), each summing a contiguous share of k; the row's first warp adds the shares in order.
// The SwiGLU kernels give a unit's gate row and up row to two warps of one CTA (the loads of the
// unfused product), pass the sums through shared memory and apply the activation before the store,
// so the SiLU kernel and the [n, 2f] round trip disappear. Every row is summed in the same order as
// by gemv_bf16 with the same split, so the one-row and general kernels give the same bits, and so do
// the fused and unfused SwiGLU where the unfused product keeps one warp a row (Llama-3-8B's gate/up
// product does). (A first fused version gave both rows of a unit to one warp: half the warps, each
// twice as long; 0.17 ms a step slower.)
//
// Programmatic dependent launch (common.cuh): the first weight round is issued before the wait for
// the previous kernel; the next kernel is allowed to launch only after the main loop, so its CTAs
// (an RMSNorm of 1024 threads, the attention's) do not take SM slots this kernel's waves still need.
#include "common.cuh"

#define GEMV_MAX_N 4
#define GEMV_WARPS 8
#ifndef UNROLL
#define UNROLL 2  // pieces per lane per round: batch-1 step 4.22-4.26 ms at 2, 4.29 at 1, 4.36 at 3 (H200)
#endif
#ifndef ROW_MIN_BLOCKS
#define ROW_MIN_BLOCKS 8  // occupancy the one-row kernels are compiled for
#endif

// Eight f32 of x (two float4) rounded to bf16 and widened back: the values cuBLAS multiplies.
__device__ __forceinline__ void x8_as_bf16(const float4* p, float* xf) {
    const float4 a = p[0], b = p[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        u32 packed;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(v[j + 1]), "f"(v[j]));
        xf[j] = __uint_as_float(packed << 16);
        xf[j + 1] = __uint_as_float(packed & 0xffff0000u);
    }
}

// out: [n, units] f32. x: [n, k] f32. w: [units, k] bf16, or [2 * units, k] (gate rows, then up
// rows) for SWIGLU. n <= MAX_N. split (1, 2, 4 or 8; 1 for SWIGLU): warps per row, each summing a
// contiguous share of k, the shares added in order by the row's first warp -- more warps in flight
// for products of few rows. Grid: ceil(units / (GEMV_WARPS / split)) CTAs, or
// ceil(units / (GEMV_WARPS / 2)) for SWIGLU (warps 0-3 of a CTA take the gate rows of its four units,
// warps 4-7 their up rows, so the loads are those of the unfused product); block: 32 * GEMV_WARPS.
template <int MAX_N, bool SWIGLU>
__device__ __forceinline__ void gemv_rows(float* __restrict__ out, const float* __restrict__ x,
                                          const bf16_t* __restrict__ w, int n, int k, int units, int split) {
    if (SWIGLU) split = 1;
    const int per_cta = SWIGLU ? GEMV_WARPS / 2 : GEMV_WARPS / split;  // units of a CTA
    __shared__ float sums[GEMV_WARPS][MAX_N];  // per-warp row sums handed to another warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit = blockIdx.x * per_cta + (SWIGLU ? warp % per_cta : warp / split);
    const int half = SWIGLU ? warp / per_cta : 0;  // 1: this warp sums the unit's up row
    const int part = SWIGLU ? 0 : warp % split;    // this warp's share of the row
    const bool active = unit < units;
    if (!SWIGLU && split == 1 && !active) return;  // (the others meet at a barrier below)
    const float4* xr = (const float4*)x;  // row r, piece v at xr + (r * vecs + v) * 2
    const int vecs = k / 8;
    const int v_end = active ? (int)((long long)(part + 1) * vecs / split) : 0;
    const uint4* wr = (const uint4*)(w + ((size_t)unit + (size_t)half * units) * k);
    float acc[MAX_N];
#pragma unroll
    for (int r = 0; r < MAX_N; r++) acc[r] = 0.f;
    const int v_begin = (int)((long long)part * vecs / split);
    for (int v0 = v_begin + lane; v0 < v_end; v0 += 32 * UNROLL) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * 32;
            wv[u] = v < v_end ? __ldcs(wr + v) : make_uint4(0, 0, 0, 0);
        }
        // Launched with programmatic serialization at batch 1: the first weight loads are in
        // flight while the kernel before finishes; x and out are touched only after it has.
        wait_for_prerequisites();
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * 32;
            if (v >= v_end) break;
            float wf[8];
            unpack8(wv[u], wf);
#pragma unroll
            for (int r = 0; r < MAX_N; r++) {
                if (r >= n) break;
                float xf[8];
                x8_as_bf16(xr + ((size_t)r * vecs + v) * 2, xf);
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) s = fmaf(xf[j], wf[j], s);
                acc[r] += s;
            }
        }
    }
    wait_for_prerequisites();  // again for k == 0, where the loop never ran (a no-op otherwise)
    allow_dependents_early();
    if (SWIGLU || split > 1) {
        // Every warp but a unit's first (its gate row, or part 0) hands its row sums over.
#pragma unroll
        for (int r = 0; r < MAX_N; r++) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) sums[warp][r] = v;
        }
        __syncthreads();
        if (half == 1 || part != 0 || !active) return;
    }
#pragma unroll
    for (int r = 0; r < MAX_N; r++) {
        if (r >= n) break;
        float g;
        if (SWIGLU) {
            g = swiglu(sums[warp][r], sums[warp + per_cta][r]);
        } else if (split > 1) {
            g = sums[warp][r];
            for (int p = 1; p < split; p++) g += sums[warp + p][r];  // parts in order
        } else {
            g = warp_sum(acc[r]);
        }
        if (lane == 0) out[(size_t)r * units + unit] = g;
    }
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_bf16(float* __restrict__ out, const float* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
          int m, int split) {
    gemv_rows<GEMV_MAX_N, false>(out, x, w, n, k, m, split);
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, ROW_MIN_BLOCKS)
gemv_bf16_1(float* __restrict__ out, const float* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
            int m, int split) {
    gemv_rows<1, false>(out, x, w, n, k, m, split);
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_swiglu(float* __restrict__ out, const float* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
            int f, int split) {
    gemv_rows<GEMV_MAX_N, true>(out, x, w, n, k, f, split);
}

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, ROW_MIN_BLOCKS)
gemv_swiglu_1(float* __restrict__ out, const float* __restrict__ x, const bf16_t* __restrict__ w, int n,
              int k, int f, int split) {
    gemv_rows<1, true>(out, x, w, n, k, f, split);
}

// ---------------------------------------------------------------------------------------------
// Deterministic mode's reference order (det_mma_16 / _32 / _64: up to 16, 32, 64 rows of x):
// out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16), each output element one accumulator chain of
// tensor-core steps mma.sync m16n8k16 over k ascending in k16 steps, nothing split. On the H200
// (cuBLASLt 13.1) every cuBLASLt algorithm that does not split K gives exactly these bits
// (kernels/bench/logs/det-probe-2026-12-03T0457.log), so the host checks each algorithm it means to
// use against det_mma_16 on a probe product (gemm.rs, det_algo) and then may pick any of them per
// row count. Too slow to serve products itself (60-80 us for Llama-3-8B's qkv at 1-16 rows against
// cuBLASLt's 17-28 us: one chain per 8 weight rows leaves 4-6 warps an SM, each waiting on its loads).
//
// Design: a warp owns 8 weight rows (the B operand, n8) and NT tiles of 16 rows of x (the A
// operand). Inside one k16 step the slots of the fragment are permuted (lane t of a quad holds
// k0+4t..k0+4t+3, the same permutation for x and w), which leaves the step's sum unchanged (checked:
// 0 differing elements) and lets a lane load its part of a weight row with one 8-byte load.
// DET_G steps per round; the next round's weights are loaded before this round's mma, so two rounds
// are in flight. Weights with the streaming hint (read once); x through L1 (every warp of the SM
// reads the same rows). Requires k % 16 == 0 and 8-byte aligned x and w. Grid: ceil(m / 8) warps,
// any number of warps per CTA. Programmatic dependent launch as the GEMVs above.
#ifndef DET_G
#define DET_G 16
#endif

__device__ __forceinline__ uint2 ld_stream8(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.cs.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ void mma_bf16_16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800  // (the host routes nothing here below sm_80)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

template <int NT>
__device__ __forceinline__ void det_mma_rows(float* __restrict__ out, const bf16_t* __restrict__ x,
                                             const bf16_t* __restrict__ w, int n, int k, int m) {
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    if (warp * 8 >= m) {
        wait_for_prerequisites();
        allow_dependents_early();
        return;
    }
    const int wrow = min(warp * 8 + g, m - 1);  // rows past m load row m - 1 and store nothing
    const uint2* wp = (const uint2*)(w + (size_t)wrow * k) + t;  // k16 step j at wp[4 * j]
    const int steps = k / 16;
    uint2 cur[DET_G], nxt[DET_G];
#pragma unroll
    for (int u = 0; u < DET_G; u++) cur[u] = u < steps ? ld_stream8(wp + 4 * u) : make_uint2(0, 0);
    wait_for_prerequisites();  // x and out only from here on
    const uint2* xp[NT][2];    // rows 16i + g and 16i + g + 8 of x (null: past n, zeros)
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * i + g + 8 * h;
            xp[i][h] = r < n ? (const uint2*)(x + (size_t)r * k) + t : nullptr;
        }
    float d[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.f;
    for (int j0 = 0; j0 < steps; j0 += DET_G) {
#pragma unroll
        for (int u = 0; u < DET_G; u++)
            nxt[u] = j0 + DET_G + u < steps ? ld_stream8(wp + 4 * (j0 + DET_G + u)) : make_uint2(0, 0);
#pragma unroll
        for (int u = 0; u < DET_G; u++) {
            if (j0 + u >= steps) break;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const uint2 xa = xp[i][0] ? xp[i][0][4 * (j0 + u)] : make_uint2(0, 0);
                const uint2 xb = xp[i][1] ? xp[i][1][4 * (j0 + u)] : make_uint2(0, 0);
                // Slots (2t, 2t+1) hold k0+4t, +1 and slots (8+2t, 9+2t) hold k0+4t+2, +3.
                mma_bf16_16816(d[i], xa.x, xb.x, xa.y, xb.y, cur[u].x, cur[u].y);
            }
        }
#pragma unroll
        for (int u = 0; u < DET_G; u++) cur[u] = nxt[u];
    }
    allow_dependents_early();
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            // Accumulator q: row 16i + g (+8 for q >= 2) of x, weight row 8 * warp + 2t + (q & 1).
            const int xr = 16 * i + g + (q >= 2 ? 8 : 0), wr = warp * 8 + 2 * t + (q & 1);
            if (xr < n && wr < m) out[(size_t)xr * m + wr] = d[i][q];
        }
}

extern "C" __global__ void det_mma_16(float* __restrict__ out, const bf16_t* __restrict__ x,
                                      const bf16_t* __restrict__ w, int n, int k, int m) {
    det_mma_rows<1>(out, x, w, n, k, m);
}
