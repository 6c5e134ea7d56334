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
// tensor-core steps mma.sync m16n8k16 over k ascending in k16 steps, nothing split; rows of x and
// w are ld elements apart (ld >= k: a product over the first k columns of wider rows, one half of
// a K-split product, see det_gemv_rows). On the H200
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
// reads the same rows). Requires k % 16 == 0, ld % 4 == 0 and 8-byte aligned x and w. Grid: ceil(m / 8) warps,
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
                                             const bf16_t* __restrict__ w, int n, int k, int m, int ld) {
    const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    if (warp * 8 >= m) {
        wait_for_prerequisites();
        allow_dependents_early();
        return;
    }
    const int wrow = min(warp * 8 + g, m - 1);  // rows past m load row m - 1 and store nothing
    const uint2* wp = (const uint2*)(w + (size_t)wrow * ld) + t;  // k16 step j at wp[4 * j]
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
            xp[i][h] = r < n ? (const uint2*)(x + (size_t)r * ld) + t : nullptr;
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
                                      const bf16_t* __restrict__ w, int n, int k, int m, int ld) {
    det_mma_rows<1>(out, x, w, n, k, m, ld);
}

// ---------------------------------------------------------------------------------------------
// det_gemv_8 / det_gemv_16: deterministic mode's products of up to 16 rows of x, streaming the
// weights near copy bandwidth: out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T (bf16), plus beta * out
// when beta != 0. Every element is det_mma_16's chain (the same mma.sync m16n8k16 steps over k
// ascending, the same slot permutation), so the bits are det_mma_16's, and those of every split-K-1
// cuBLASLt algorithm the host has checked against it (gemm.rs): the host may take whichever is
// faster for a row count (det_gemv.rs).
//
// Design: det_mma_16 waits, step after step, on the loads that feed its chain (~450 cycles a k16
// step; an mma.sync chain alone takes ~25 on the H200), and per-lane cp.async rings topped out at
// ~2.6 TB/s even without any mma (kernels/bench/logs/det-gemv-2026-12-03T0734.log). Here the loads
// leave the chain and the lanes: a CTA of WARPS warps owns 8 * WARPS * CHAINS weight rows and streams them,
// with the n rows of x, through a ring of STAGES shared-memory stages of KC columns filled by 1-D
// bulk copies (the TMA engine: one cp.async.bulk per row segment, issued by warp 0, completion
// counted in bytes on the stage's mbarrier). Each warp keeps CHAINS chains (8 weight rows x 16
// rows of x each: one x fragment a step feeds them all, and their mma steps overlap, as one chain's
// latency, ~25 cycles a step, would otherwise bound a warp) and reads its fragments from shared
// memory, where a row is padded by 32 bytes so the eight rows a warp reads in one load fall in
// distinct banks. More weight rows a CTA also means fewer copies of x a weight byte: at 16 rows of
// x, x is as many bytes a stage as 16 weight rows, and total bytes in (L2 hits included) bounded
// every tiling at ~4.5 TB/s (det-gemv-2026-12-03T0734.log). Rows past m copy row m - 1 and store
// nothing; x rows past n read a zero row. Requires k % 16 == 0, 16-byte aligned rows of x and w
// (ld % 8 == 0, aligned bases), n <= 16.
// K split (gridDim.y == 2, launched in clusters of the two CTAs (1, 2, 1)): CTA y reduces columns
// [y * k, (y + 1) * k) of rows ld apart -- twice the CTAs, each chain half as long, where few
// output rows and a long k leave too few CTAs to fill the GPU (Llama-3-8B's down: 512 chains of
// 896 k16 steps; the host splits k >= 2m, det_split.rs). The CTA of half 1 leaves its accumulators in its
// shared memory; the CTA of half 0 reads them over the cluster (distributed shared memory) and
// stores d1 + (d0 + beta * out), the order of two split-K-1 cuBLASLt products over the halves,
// the second with beta 1 (gemm.rs): the same bits at every row count.
// Dynamic shared memory: DetGemvKernel::shared_bytes in kernels/src/lib.rs (barriers, stages, zero
// row); the host's DET_GEMV_KERNELS lists the instantiations below with their template arguments.
// CLUSTER > 1 (launched in clusters of that many CTAs; the grid a whole number of them): each x
// row of a stage is read once for the cluster and multicast into every CTA's shared memory, a
// cluster barrier before a stage is refilled. Measured on the H200 (det-gemv-2026-12-03T0942.log
// part 6, Llama-3-8B down at 16 rows, timed as the host times): clusters of 2 57.1 us, of 4 100.1
// (fewer whole clusters fit at one CTA an SM), against 54.3 without; so x's bytes are not what
// holds the 16-row products back, and sov instantiates none (the bench harness,
// bench/det_probe/det_gemv_bench.cu, keeps them as variants).
// Programmatic dependent launch: the first stages' weight copies are issued before the wait.
#define DG_BAR_BYTES 128  // the stages' mbarriers, ahead of the ring

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// The bulk copies and transaction-counting mbarriers are sm_90 instructions: below it these helpers
// are empty and the host never launches det_gemv_* (det_gemv.rs checks the compute capability).
// A phase completes after `arrivals` arrivals (and the bytes they expect).
__device__ __forceinline__ void mbar_init(u64* bar, u32 arrivals = 1) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives (the barrier's one arrival) and expects `bytes` of copies before the phase completes.
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred p;\nDG_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra DG_WAIT;\n}\n" ::"r"(
            smem_u32(bar)),
        "r"(parity)
        : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}
// As bulk_copy, into the same offset of the shared memory of every CTA of the cluster in `mask`,
// completing bytes on the mbarrier at `bar`'s offset in each (ptxas advises sm_90a for it; only
// the bench harness instantiates det_gemv_rows with clusters, for sm_90a: see det_gemv_rows).
__device__ __forceinline__ void bulk_copy_multicast(void* dst, const void* src, u32 bytes, u64* bar, unsigned short mask) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(mask)
        : "memory");
#endif
}
__device__ __forceinline__ u32 cluster_rank() {
    u32 r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
    return r;
}
// Every thread of every CTA of the cluster: what each did before (its shared-memory reads, its
// mbarrier inits) is visible to all after.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

// Orders this thread's earlier shared-memory reads before bulk copies it issues next.
__device__ __forceinline__ void fence_proxy_async() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Lanes of warp 0 copy rows [r_begin, r_end) of a stage (rows < R: weight rows from row0; then the
// x rows), columns k0 .. k0 + min(KC, k - k0). With CLUSTER > 1 the CTA of rank q copies x rows
// i = q, q + CLUSTER, ... into every CTA of its cluster (multicast); its own weight rows as before.
template <int R, int KC, int CLUSTER>
__device__ __forceinline__ void dg_copy_rows(bf16_t* stage, u64* bar, const bf16_t* __restrict__ x,
                                             const bf16_t* __restrict__ w, int row0, int m, int k, int ld, int k0,
                                             int r_begin, int r_end, u32 rank) {
    const u32 bytes = (u32)min(KC, k - k0) * 2;
    for (int r = r_begin + (int)(threadIdx.x & 31); r < r_end; r += 32) {
        if (r < R) {
            bulk_copy(stage + r * (KC + 16), w + (size_t)min(row0 + r, m - 1) * ld + k0, bytes, bar);
        } else if (CLUSTER == 1) {
            bulk_copy(stage + r * (KC + 16), x + (size_t)(r - R) * ld + k0, bytes, bar);
        } else if ((u32)(r - R) % CLUSTER == rank) {
            bulk_copy_multicast(stage + r * (KC + 16), x + (size_t)(r - R) * ld + k0, bytes, bar,
                                (unsigned short)((1u << CLUSTER) - 1));
        }
    }
}

// One k16 step of the warp's CHAINS chains: the x fragment (rows g and g + 8) once, then each
// chain's weight fragment (8 rows apart) from shared memory; slots (2t, 2t+1) hold k0+4t, +1 and
// slots (8+2t, 9+2t) hold k0+4t+2, +3.
template <int CHAINS, int PITCH>
__device__ __forceinline__ void dg_step(float (&d)[CHAINS][4], const uint2* xa, const uint2* xb, const uint2* wq,
                                        int s) {
    const uint2 va = xa[4 * s], vb = xb[4 * s];
#pragma unroll
    for (int c = 0; c < CHAINS; c++) {
        const uint2 wv = wq[c * 2 * PITCH + 4 * s];  // 8 rows of PITCH bf16 = 2 * PITCH uint2
        mma_bf16_16816(d[c], va.x, vb.x, va.y, vb.y, wv.x, wv.y);
    }
}

// Reads the float4 at the same shared-memory offset as `p` in the cluster's CTA of rank `peer`.
__device__ __forceinline__ float4 ld_peer_f32x4(const float4* p, u32 peer) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if __CUDA_ARCH__ >= 900
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(p)), "r"(peer));
    asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
#endif
    return v;
}

// Stores a warp's chains: accumulator q of chain c is row g (+8 for q >= 2) of x and weight row
// wrow0 + 8c + 2t + (q & 1). K split (gridDim.y == 2, clusters of the two halves): the CTA of half 1
// leaves its accumulators in its shared memory (the ring, idle once every thread of both CTAs has
// passed the barrier below: all stages consumed), the CTA of half 0 reads them over the cluster
// (distributed shared memory) and stores d1 + (d0 + beta * out). Every thread of the CTA calls it
// (the cluster barriers count them all); `holds` is false for a thread without accumulators (a
// warp-specialized CTA's copy warp). Thread i's slot is i * CHAINS float4 from the ring's start.
template <int CHAINS>
__device__ __forceinline__ void dg_store(float (&d)[CHAINS][4], bool holds, float* __restrict__ out, int n, int m,
                                         float beta, int wrow0, int g, int t) {
    extern __shared__ __align__(128) unsigned char dg_smem[];
    float d1[CHAINS][4] = {};  // half 1's accumulators (K split only)
    if (gridDim.y == 2) {
        float4* slot = (float4*)(dg_smem + DG_BAR_BYTES) + threadIdx.x * CHAINS;  // [threads][CHAINS]
        __syncthreads();  // every warp of this CTA is done with the ring
        if (blockIdx.y == 1 && holds)
#pragma unroll
            for (int c = 0; c < CHAINS; c++) slot[c] = make_float4(d[c][0], d[c][1], d[c][2], d[c][3]);
        cluster_sync();  // half 1's slots written and visible to half 0
        if (blockIdx.y == 0 && holds)
#pragma unroll
            for (int c = 0; c < CHAINS; c++) {
                const float4 v = ld_peer_f32x4(slot + c, cluster_rank() ^ 1u);
                d1[c][0] = v.x, d1[c][1] = v.y, d1[c][2] = v.z, d1[c][3] = v.w;
            }
        cluster_sync();  // half 0 has read them: half 1 may leave
        if (blockIdx.y == 1) return;
    }
    if (!holds) return;
#pragma unroll
    for (int c = 0; c < CHAINS; c++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int xr = g + (q >= 2 ? 8 : 0), wr = wrow0 + c * 8 + 2 * t + (q & 1);
            if (xr < n && wr < m) {
                float* o = out + (size_t)xr * m + wr;
                const float first = beta == 0.f ? d[c][q] : d[c][q] + beta * *o;
                *o = gridDim.y == 2 ? __fadd_rn(d1[c][q], first) : first;
            }
        }
}

template <int WARPS, int CHAINS, int KC, int STAGES, int CLUSTER = 1>
__device__ __forceinline__ void det_gemv_rows(float* __restrict__ out, const bf16_t* __restrict__ x,
                                              const bf16_t* __restrict__ w, int n, int k, int m, float beta,
                                              int ld) {
    constexpr int R = WARPS * 8 * CHAINS, PITCH = KC + 16;
    // K split: this CTA's half of every row (gridDim.y == 1: all of it).
    x += (size_t)blockIdx.y * k;
    w += (size_t)blockIdx.y * k;
    extern __shared__ __align__(128) unsigned char dg_smem[];
    u64* bars = (u64*)dg_smem;                             // [STAGES]
    bf16_t* ring = (bf16_t*)(dg_smem + DG_BAR_BYTES);      // [STAGES][R + n][PITCH] bf16
    const int stage_elems = (R + n) * PITCH;
    bf16_t* zero = ring + STAGES * stage_elems;            // [PITCH] zeros
    for (int i = threadIdx.x; i < PITCH / 8; i += 32 * WARPS) ((uint4*)zero)[i] = make_uint4(0, 0, 0, 0);
    const int row0 = blockIdx.x * R;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nst = (k + KC - 1) / KC;
    const u32 rank = CLUSTER > 1 ? cluster_rank() : 0;
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) mbar_init(&bars[s]);
    // With a cluster, the other CTAs' copies signal this CTA's barriers: initialised first.
    if (CLUSTER > 1)
        cluster_sync();
    else
        __syncthreads();
    const auto stage_bytes = [&](int s) { return (u32)(R + n) * (u32)min(KC, k - s * KC) * 2; };
    // Weights of the first stages before the wait (nothing earlier in the stream writes them),
    // x only after it.
    if (warp == 0)
        for (int s = 0; s < STAGES && s < nst; s++) {
            if (lane == 0) mbar_expect(&bars[s], stage_bytes(s));
            __syncwarp();
            dg_copy_rows<R, KC, CLUSTER>(ring + s * stage_elems, &bars[s], x, w, row0, m, k, ld, s * KC, 0, R, rank);
        }
    wait_for_prerequisites();
    if (warp == 0)
        for (int s = 0; s < STAGES && s < nst; s++)
            dg_copy_rows<R, KC, CLUSTER>(ring + s * stage_elems, &bars[s], x, w, row0, m, k, ld, s * KC, R, R + n, rank);
    float d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; c++) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.f;
    for (int st = 0; st < nst; st++) {
        mbar_wait(&bars[st % STAGES], (u32)((st / STAGES) & 1));
        const bf16_t* sw = ring + (st % STAGES) * stage_elems;
        const bf16_t* sx = sw + R * PITCH;
        const uint2* wq = (const uint2*)(sw + (warp * 8 * CHAINS + g) * PITCH) + t;
        // x rows past n read the zero row: no branch inside the steps, so their loads run ahead.
        const uint2* xa = (const uint2*)(g < n ? sx + g * PITCH : zero) + t;
        const uint2* xb = (const uint2*)(g + 8 < n ? sx + (g + 8) * PITCH : zero) + t;
        const int steps = min(KC, k - st * KC) / 16;
        if (steps == KC / 16) {
#pragma unroll
            for (int s = 0; s < KC / 16; s++) dg_step<CHAINS, PITCH>(d, xa, xb, wq, s);
        } else {
            for (int s = 0; s < steps; s++) dg_step<CHAINS, PITCH>(d, xa, xb, wq, s);
        }
        const int nx = st + STAGES;
        // Every warp (with a cluster: of every CTA, whose x rows this CTA's copies also write) is
        // done with stage st's buffer, refilled next.
        if (CLUSTER > 1 && nx < nst)
            cluster_sync();
        else
            __syncthreads();
        if (warp == 0 && nx < nst) {
            fence_proxy_async();  // the reads of this buffer before its refill
            const int b = st % STAGES;
            if (lane == 0) mbar_expect(&bars[b], stage_bytes(nx));
            __syncwarp();
            dg_copy_rows<R, KC, CLUSTER>(ring + b * stage_elems, &bars[b], x, w, row0, m, k, ld, nx * KC, 0, R + n, rank);
        }
    }
    allow_dependents_early();
    // No CTA leaves while a copy it issued may still be writing into another's shared memory.
    if (CLUSTER > 1) cluster_sync();
    dg_store<CHAINS>(d, true, out, n, m, beta, row0 + warp * CHAINS * 8, g, t);
}

// The instantiations (DET_GEMV_KERNELS in kernels/src/lib.rs lists them with these arguments; the
// host times them all per product shape and row count and keeps the fastest), named by weight
// rows a CTA. On the H200 (det-gemv-2026-12-03T0942.log) no one tiling wins everywhere: shared
// memory, which grows with the rows of x, sets how many CTAs an SM holds and so the bytes in flight.
// 8 rows: one warp, one chain, 4 stages of 512 columns (1-4 rows of x, short k: o at one row).
extern "C" __global__ void __launch_bounds__(32)
det_gemv_8(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k, int m,
           float beta, int ld) {
    det_gemv_rows<1, 1, 512, 4>(out, x, w, n, k, m, beta, ld);
}

// 16 rows: two warps of one chain (x rows shared by both), 2 stages of 1024 columns (1-8 rows).
extern "C" __global__ void __launch_bounds__(64)
det_gemv_16(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k, int m,
            float beta, int ld) {
    det_gemv_rows<2, 1, 1024, 2>(out, x, w, n, k, m, beta, ld);
}

// 16 rows: one warp of two chains, 2 stages of 1024 columns (1-8 rows, long k: down at one row).
extern "C" __global__ void __launch_bounds__(32)
det_gemv_16_w1(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
               int m, float beta, int ld) {
    det_gemv_rows<1, 2, 1024, 2>(out, x, w, n, k, m, beta, ld);
}

// 32 rows: four warps of one chain, 2 stages of 1024 columns (8-16 rows: x is then a third of
// the bytes in, against half with 16 rows a CTA).
extern "C" __global__ void __launch_bounds__(128)
det_gemv_32(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k, int m,
            float beta, int ld) {
    det_gemv_rows<4, 1, 1024, 2>(out, x, w, n, k, m, beta, ld);
}

// 32 rows in stages of 512 columns: half the shared memory of det_gemv_32, so two CTAs an SM,
// and with K in two parts (twice the CTAs) the grid still one wave at 16 rows of x.
extern "C" __global__ void __launch_bounds__(128)
det_gemv_32_k512(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k,
                 int m, float beta, int ld) {
    det_gemv_rows<4, 1, 512, 2>(out, x, w, n, k, m, beta, ld);
}

// 64 rows: eight warps of one chain, 2 stages of 512 columns (x a fifth of the bytes in at 16
// rows; one CTA an SM, so with K in two parts Llama's o and down are 128 CTAs, one wave).
extern "C" __global__ void __launch_bounds__(256)
det_gemv_64(float* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, int n, int k, int m,
            float beta, int ld) {
    det_gemv_rows<8, 1, 512, 2>(out, x, w, n, k, m, beta, ld);
}
