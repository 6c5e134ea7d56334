// fp8.cu: FP8 (e4m3) W8A8 products: per-row quantization, a small-M product on tensor cores, a
// scalar product for any shape, and the rescale of an unscaled product.
//
// Design (the FP8-dynamic scheme of the widely used Llama-3.1-8B FP8 checkpoints): a weight
// [m, k] is stored as e4m3 with one f32 scale per output row (channel); a product's input [n, k]
// is quantized per token (row) right before the product. Both use quantize_rows_*: for a row of
// absolute maximum a > 0, scale = a / 448 and q = e4m3(x * (448 / a)) (round to nearest even,
// saturated to +-448: cvt.rn.satfinite), both with IEEE f32 division and multiplication (no
// fast math); a row of zeros gets scale 1 and zeros. elementwise.cu's `_e4m3` RMSNorm and
// SwiGLU kernels quantize the rows they produce with quantize_rows_vec's arithmetic (the same
// row_quant_* of common.cuh, the same product and rounding): a change here must be made there.
// A product is then
//   out[r, j] = (sum_k qx[r, k] * qw[j, k]) * sx[r] * sw[j]
// with the sum accumulated in f32 (each e4m3 product is exact in f32), the scales applied in that
// order. Every path below computes exactly that; they differ only in the order of the sum.
//
// fp8_gemm_small: n <= 32 rows on tensor cores (mma.sync m16n8k32 e4m3 x e4m3 -> f32). A CTA of 8
// warps (16 in the `_wide` form) owns 16 weight rows; its warps take every 8th (16th) chunk of k
// (SMALL_CHUNK = 4 * SMALL_SPAN columns, 128 by default) and their partial sums are added in warp
// order through shared memory.
// In a chunk, lane (g = lane / 4, t = lane % 4) loads SMALL_SPAN contiguous bytes (32 by default)
// of weight rows g and g + 8 and of x row g at k offset t * SMALL_SPAN -- 16-byte loads instead
// of the 4-byte pieces of the mma fragment layout. The two mmas of each 16 bytes take their four
// 4-byte words as if they were the fragment's k positions: A and B use the same permutation of k,
// so the dot product is the same. Needs k % 16 == 0 (16-byte rows).
// Up to 4 n-tiles of 8 rows (n <= 32) share each weight load. Launched with programmatic
// serialization after quantize_rows (which lets it start at once): its first weight loads are in
// flight while the input is still being quantized.
// fp8_gemm_scalar: one thread per output, any k (odd shapes and the reference for the others).
// fp8_rescale: out[r, j] *= sx[r] * sw[j], for cuBLASLt products run with unit scales.
#include "common.cuh"

typedef unsigned char u8;
typedef unsigned short u16;

#define SMALL_WARPS 8
#define SMALL_MAX_TILES 4  // n-tiles of 8 rows: n <= 32
#define QUANT_THREADS 256

// One e4m3 byte to f32 (exact).
__device__ __forceinline__ float e4m3_to_f32(u8 v) {
#if __CUDA_ARCH__ >= 890
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"((u16)v));
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"((u16)(h & 0xffffu)));
    return f;
#else
    __trap();
    return 0.f;
#endif
}

template <typename T>
__device__ __forceinline__ float load_as_f32(const T* p, size_t i);
template <>
__device__ __forceinline__ float load_as_f32<float>(const float* p, size_t i) {
    return p[i];
}
template <>
__device__ __forceinline__ float load_as_f32<bf16_t>(const bf16_t* p, size_t i) {
    return bf2f(p[i]);
}

// q: [rows, k] e4m3, scale: [rows] f32, x: [rows, k]. Grid: rows CTAs of QUANT_THREADS.
template <typename T>
__device__ __forceinline__ void quantize_rows(u8* __restrict__ q, float* __restrict__ scale,
                                              const T* __restrict__ x, int k) {
    __shared__ float red[32];
    // Launched with programmatic serialization: the product after this one may start loading its
    // weights at once (its CTAs wait before they read q), and x is the previous kernel's output.
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    const T* xr = x + row * (size_t)k;
    u8* qr = q + row * (size_t)k;
    float a = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) a = fmaxf(a, fabsf(load_as_f32(xr, i)));
    a = block_max(a, red);
    const float inv = row_quant_inv(a);
    if (threadIdx.x == 0) scale[row] = row_quant_scale(a);
    for (int i = 2 * threadIdx.x; i < k; i += 2 * blockDim.x) {
        const float v0 = __fmul_rn(load_as_f32(xr, i), inv);
        const float v1 = i + 1 < k ? __fmul_rn(load_as_f32(xr, i + 1), inv) : 0.f;
        const u16 p = f32x2_to_e4m3x2(v0, v1);
        qr[i] = (u8)(p & 0xff);
        if (i + 1 < k) qr[i + 1] = (u8)(p >> 8);
    }
}

// Eight consecutive values (16-byte aligned for bf16, 32 for f32) as f32.
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16_t* p, float* v) { unpack8(*(const uint4*)p, v); }

// Eight values times inv, each product rounded to e4m3 as quantize_rows rounds it, in order.
__device__ __forceinline__ uint2 e4m3x8(const float* v, float inv) {
    u32 w[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float* p = v + 4 * h;
        const u32 lo = f32x2_to_e4m3x2(__fmul_rn(p[0], inv), __fmul_rn(p[1], inv));
        const u32 hi = f32x2_to_e4m3x2(__fmul_rn(p[2], inv), __fmul_rn(p[3], inv));
        w[h] = lo | (hi << 16);
    }
    return make_uint2(w[0], w[1]);
}

#define QUANT_VEC_CHUNKS 8  // 8-value chunks a thread holds: k <= QUANT_THREADS * 64 = 16384

// quantize_rows for k % 8 == 0 and k <= 16384: the same values (the same max, the same product
// and rounding of each element), with the row read once into registers, 16- or 32-byte loads
// and 8-byte stores (the byte-wise kernel took 13 us for one row of 14336).
template <typename T>
__device__ __forceinline__ void quantize_rows_vec(u8* __restrict__ q, float* __restrict__ scale,
                                                  const T* __restrict__ x, int k) {
    __shared__ float red[32];
    allow_dependents_early();  // as quantize_rows
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    const T* xr = x + row * (size_t)k;
    u8* qr = q + row * (size_t)k;
    const int chunks = k / 8;
    float v[QUANT_VEC_CHUNKS][8];
    float a = 0.f;
#pragma unroll
    for (int c = 0; c < QUANT_VEC_CHUNKS; c++) {
        const int idx = threadIdx.x + c * QUANT_THREADS;
        if (idx < chunks) {
            load8(xr + (size_t)idx * 8, v[c]);
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(v[c][j]));
        }
    }
    a = block_max(a, red);
    const float inv = row_quant_inv(a);
    if (threadIdx.x == 0) scale[row] = row_quant_scale(a);
#pragma unroll
    for (int c = 0; c < QUANT_VEC_CHUNKS; c++) {
        const int idx = threadIdx.x + c * QUANT_THREADS;
        if (idx < chunks) *(uint2*)(qr + (size_t)idx * 8) = e4m3x8(v[c], inv);
    }
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
quantize_rows_vec_f32(u8* __restrict__ q, float* __restrict__ scale, const float* __restrict__ x, int k) {
    quantize_rows_vec<float>(q, scale, x, k);
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
quantize_rows_vec_bf16(u8* __restrict__ q, float* __restrict__ scale, const bf16_t* __restrict__ x, int k) {
    quantize_rows_vec<bf16_t>(q, scale, x, k);
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
quantize_rows_f32(u8* __restrict__ q, float* __restrict__ scale, const float* __restrict__ x, int k) {
    quantize_rows<float>(q, scale, x, k);
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
quantize_rows_bf16(u8* __restrict__ q, float* __restrict__ scale, const bf16_t* __restrict__ x, int k) {
    quantize_rows<bf16_t>(q, scale, x, k);
}

// out: [n, m] f32; qx: [n, k], qw: [m, k] e4m3; sx: [n], sw: [m]. Grid: ceil(n * m / 256) x 256.
extern "C" __global__ void fp8_gemm_scalar(float* __restrict__ out, const u8* __restrict__ qx,
                                           const float* __restrict__ sx, const u8* __restrict__ qw,
                                           const float* __restrict__ sw, int n, int k, int m) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * m) return;
    const int r = (int)(idx / m), j = (int)(idx % m);
    const u8* xr = qx + (size_t)r * k;
    const u8* wr = qw + (size_t)j * k;
    float acc = 0.f;
    for (int i = 0; i < k; i++) acc = fmaf(e4m3_to_f32(xr[i]), e4m3_to_f32(wr[i]), acc);
    out[idx] = acc * sx[r] * sw[j];
}

// out[r, j] *= sx[r] * sw[j] over [n, m]. Grid: ceil(n * m / 256) x 256.
extern "C" __global__ void fp8_rescale(float* __restrict__ out, const float* __restrict__ sx,
                                       const float* __restrict__ sw, int n, int m) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * m) return;
    const int r = (int)(idx / m), j = (int)(idx % m);
    out[idx] = out[idx] * sx[r] * sw[j];
}

__device__ __forceinline__ void mma_e4m3(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

#ifndef SMALL_LOAD
#define SMALL_LOAD __ldg  // the weight loads' cache hint
#endif
__device__ __forceinline__ uint4 load16_or_zero(const u8* p, bool ok) {
    return ok ? SMALL_LOAD((const uint4*)p) : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ uint4 x16_or_zero(const u8* p, bool ok) {
    return ok ? __ldg((const uint4*)p) : make_uint4(0, 0, 0, 0);
}

// Chunks a warp loads before it multiplies, and bytes of a row a lane reads in one: 2 of 32 since
// 2026-12-04 (H200, bench_fp8_matmuls, one call, us at 1 / 16 rows, quantization included: down
// 22.6 / 28.8, gate/up 34.9 / 43.5 against 27.7 / 34.8 and 36.4 / 50.6 with 4 of 16; 4 of 16 had
// replaced 2 of 16, under which down took 38 us at one row; 6 or 8 of 16 were slower).
#ifndef SMALL_UNROLL
#define SMALL_UNROLL 2
#endif
#ifndef SMALL_SPAN
#define SMALL_SPAN 32  // 16 or 32
#endif
#define SMALL_PIECES (SMALL_SPAN / 16)           // 16-byte loads a lane makes per row and chunk
#define SMALL_CHUNK (4 * SMALL_SPAN)             // k columns of a chunk (4 lanes a row)
#define SMALL_LOADS (SMALL_UNROLL * SMALL_PIECES)  // 16-byte loads per row a lane holds
// Column of piece q (chunk c0 + (q / SMALL_PIECES) * WARPS, piece q % SMALL_PIECES) of lane t, in a
// CTA of WARPS warps (each takes every WARPS-th chunk).
template <int WARPS = SMALL_WARPS>
__device__ __forceinline__ int small_col(int c0, int q, int t) {
    return (c0 + (q / SMALL_PIECES) * WARPS) * SMALL_CHUNK + t * SMALL_SPAN + (q % SMALL_PIECES) * 16;
}

// The SMALL_LOADS pieces of the two weight rows a lane reads, from chunk c0 (zeros past k).
template <int WARPS = SMALL_WARPS>
__device__ __forceinline__ void small_loads(uint4* alo, uint4* ahi, const u8* wlo, const u8* whi, bool w_lo,
                                            bool w_hi, int c0, int k, int t) {
#pragma unroll
    for (int q = 0; q < SMALL_LOADS; q++) {
        const int kk = small_col<WARPS>(c0, q, t);
        alo[q] = load16_or_zero(wlo + kk, kk < k && w_lo);
        ahi[q] = load16_or_zero(whi + kk, kk < k && w_hi);
    }
}

// See the file comment. Grid: ceil(m / 16) CTAs of 32 * WARPS threads. TILES = ceil(n / 8).
template <int TILES, int WARPS>
__device__ __forceinline__ void gemm_small(float* __restrict__ out, const u8* __restrict__ qx,
                                           const float* __restrict__ sx, const u8* __restrict__ qw,
                                           const float* __restrict__ sw, int n, int k, int m) {
    __shared__ float part[WARPS][TILES][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const bool w_lo = row0 + g < m, w_hi = row0 + g + 8 < m;
    const u8* wlo = qw + (size_t)(row0 + g) * k;
    const u8* whi = qw + (size_t)(row0 + g + 8) * k;
    float acc[TILES][4];
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    const int chunks = (k + SMALL_CHUNK - 1) / SMALL_CHUNK;
    for (int c0 = warp; c0 < chunks; c0 += WARPS * SMALL_UNROLL) {
        uint4 alo[SMALL_LOADS], ahi[SMALL_LOADS];
        small_loads<WARPS>(alo, ahi, wlo, whi, w_lo, w_hi, c0, k, t);
        wait_for_prerequisites();
#pragma unroll
        for (int q = 0; q < SMALL_LOADS; q++) {
            const int kk = small_col<WARPS>(c0, q, t);
            const bool in_k = kk < k;
#pragma unroll
            for (int tile = 0; tile < TILES; tile++) {
                const int r = tile * 8 + g;
                const uint4 b = x16_or_zero(qx + (size_t)r * k + kk, in_k && r < n);
                mma_e4m3(acc[tile], alo[q].x, ahi[q].x, alo[q].y, ahi[q].y, b.x, b.y);
                mma_e4m3(acc[tile], alo[q].z, ahi[q].z, alo[q].w, ahi[q].w, b.z, b.w);
            }
        }
    }
    wait_for_prerequisites();  // for k == 0 (the loop never ran)
    allow_dependents_early();
#pragma unroll
    for (int tile = 0; tile < TILES; tile++)
#pragma unroll
        for (int j = 0; j < 4; j++) part[warp][tile][j][lane] = acc[tile][j];
    __syncthreads();
    // Thread i of the CTA finishes output i of the CTA's [TILES * 8 rows, 16 weight rows] block:
    // accumulator j of lane l holds weight row g + 8 * (j / 2), x row 2 * t + j % 2 of its tile.
    for (int i = threadIdx.x; i < TILES * 128; i += blockDim.x) {
        const int tile = i / 128, j = (i / 32) % 4, l = i % 32;
        const int wrow = row0 + (l >> 2) + 8 * (j >> 1);
        const int xrow = tile * 8 + 2 * (l & 3) + (j & 1);
        if (wrow >= m || xrow >= n) continue;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += part[w][tile][j][l];
        out[(size_t)xrow * m + wrow] = s * sx[xrow] * sw[wrow];
    }
}

// One entry point per number of 8-row tiles, in CTAs of SMALL_WARPS warps, and (`_wide`) of
// SMALL_WIDE_WARPS for products of few weight rows (qkv, o and down of an 8B layer: 256-384 CTAs),
// where the 8-warp grid keeps about 15 warps on an SM (ncu, H100, one row: o at 1.63 TB/s and down
// at 2.31 with 23% achieved occupancy, gate/up's 1792 CTAs at 2.67 with 56%). Twice the warps split
// k in twice the pieces; the partial sums are still added in warp order, so each form gives the
// same bits at any row count (not each other's). It gained 0.7% at batch 1 (kernels/docs/fp8.md).
#define SMALL_WIDE_WARPS 16
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_gemm_small_1(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<1, SMALL_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_gemm_small_2(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<2, SMALL_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_gemm_small_3(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<3, SMALL_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_gemm_small_4(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<4, SMALL_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WIDE_WARPS)
fp8_gemm_small_wide_1(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<1, SMALL_WIDE_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WIDE_WARPS)
fp8_gemm_small_wide_2(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<2, SMALL_WIDE_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WIDE_WARPS)
fp8_gemm_small_wide_3(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<3, SMALL_WIDE_WARPS>(out, qx, sx, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WIDE_WARPS)
fp8_gemm_small_wide_4(float* __restrict__ out, const u8* __restrict__ qx, const float* __restrict__ sx,
                  const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k, int m) {
    gemm_small<4, SMALL_WIDE_WARPS>(out, qx, sx, qw, sw, n, k, m);
}

// ---------------------------------------------------------------------------------------------
// fp8_small_q_* / fp8_swiglu_small_q_*: the small-M product for n <= 8 rows that quantizes its own
// input, so no quantize_rows kernel runs between the input's producer and the product (at batch 1
// four launches a layer fewer). Every CTA reads the n rows of x (f32 or bf16, k % 16 == 0) after
// its first weight loads and its wait, quantizes them with quantize_rows_vec's arithmetic (the same
// absolute maximum, scale and rounding of each value) into shared memory, and multiplies as
// gemm_small does (the same chunks per warp, mma steps and warp order of the partial sums): its
// outputs equal quantize_rows_vec + fp8_gemm_small_1 (8 warps) bit for bit. The x bytes every CTA
// re-reads come from L2 (k * n * 4 bytes a CTA at most, against 16 * k weight bytes).
// fp8_swiglu_small_q_*: the same for w = [Wg; Wu] (2f rows): CTA b takes gate rows 8b .. 8b + 7 as
// the mma's rows g and the matching up rows f + 8b .. as its rows g + 8, and writes swiglu(gate,
// up) as silu_mul does: the product into gate_up, then silu_mul, bit for bit. Dynamic shared
// memory: n * k bytes (the codes; the host keeps it <= 32 KiB). Grid: ceil(m / 16) CTAs (swiglu:
// ceil(f / 8)) of 32 * SMALL_WARPS threads.
__device__ __forceinline__ void store_small(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_small(bf16_t* p, float v) { *p = f2bf(v); }

// Quantizes rows [0, n) of x ([n, k]) into q ([n, k] e4m3, shared memory) and their scales into
// sx: quantize_rows_vec's values, read twice from global memory instead of held in registers.
template <typename T>
__device__ __forceinline__ void quantize_into_shared(u8* q, float* sx, const T* __restrict__ x, int n, int k,
                                                     float* red) {
    const int vecs = k / 8;
    for (int r = 0; r < n; r++) {
        const T* xr = x + (size_t)r * k;
        float a = 0.f;
        for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
            float v[8];
            load8(xr + (size_t)i * 8, v);
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaxf(a, fabsf(v[j]));
        }
        a = block_max(a, red);
        const float inv = row_quant_inv(a);
        if (threadIdx.x == 0) sx[r] = row_quant_scale(a);
        for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
            float v[8];
            load8(xr + (size_t)i * 8, v);
            *(uint2*)(q + (size_t)r * k + (size_t)i * 8) = e4m3x8(v, inv);
        }
    }
}

template <typename T, typename OutT, bool SWIGLU>
__device__ __forceinline__ void gemm_small_q(OutT* __restrict__ out, const T* __restrict__ x,
                                             const u8* __restrict__ qw, const float* __restrict__ sw, int n, int k,
                                             int m) {
    extern __shared__ __align__(16) u8 qx_s[];  // [n, k] e4m3: this CTA's quantized x
    __shared__ float part[SMALL_WARPS][4][32];  // each warp's accumulators
    __shared__ float red[32];
    __shared__ float sx_s[8];  // [n] the rows' scales
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // Weight rows of the mma's rows g and g + 8 (SWIGLU: m is f, and w holds 2f rows).
    const int rlo = SWIGLU ? blockIdx.x * 8 + g : blockIdx.x * 16 + g;
    const int rhi = SWIGLU ? m + rlo : rlo + 8;
    const bool w_lo = rlo < m, w_hi = SWIGLU ? w_lo : rhi < m;
    const u8* wlo = qw + (size_t)(w_lo ? rlo : 0) * k;
    const u8* whi = qw + (size_t)(w_hi ? rhi : 0) * k;
    const int chunks = (k + SMALL_CHUNK - 1) / SMALL_CHUNK;
    uint4 alo[SMALL_LOADS], ahi[SMALL_LOADS];
    small_loads(alo, ahi, wlo, whi, w_lo, w_hi, warp, k, t);  // weights: before the wait
    wait_for_prerequisites();
    quantize_into_shared(qx_s, sx_s, x, n, k, red);
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const u8* xrow = qx_s + (size_t)(g < n ? g : 0) * k;
    for (int c0 = warp; c0 < chunks; c0 += SMALL_WARPS * SMALL_UNROLL) {
#pragma unroll
        for (int q = 0; q < SMALL_LOADS; q++) {
            const int kk = small_col(c0, q, t);
            const uint4 b = kk < k && g < n ? *(const uint4*)(xrow + kk) : make_uint4(0, 0, 0, 0);
            mma_e4m3(acc, alo[q].x, ahi[q].x, alo[q].y, ahi[q].y, b.x, b.y);
            mma_e4m3(acc, alo[q].z, ahi[q].z, alo[q].w, ahi[q].w, b.z, b.w);
        }
        const int next = c0 + SMALL_WARPS * SMALL_UNROLL;
        if (next < chunks) small_loads(alo, ahi, wlo, whi, w_lo, w_hi, next, k, t);
    }
    allow_dependents_early();
#pragma unroll
    for (int j = 0; j < 4; j++) part[warp][j][lane] = acc[j];
    __syncthreads();
    // As gemm_small: accumulator j of lane l holds mma row g + 8 * (j / 2), x row 2 * t + j % 2.
    if (!SWIGLU) {
        for (int i = threadIdx.x; i < 128; i += blockDim.x) {
            const int j = i / 32, l = i % 32;
            const int wrow = blockIdx.x * 16 + (l >> 2) + 8 * (j >> 1), xr = 2 * (l & 3) + (j & 1);
            if (wrow >= m || xr >= n) continue;
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < SMALL_WARPS; w++) s += part[w][j][l];
            store_small(&out[(size_t)xr * m + wrow], s * sx_s[xr] * sw[wrow]);
        }
    } else {
        // Thread i: x row 2 * t + jj of lane l's gate (accumulator jj) and up (jj + 2) sums.
        for (int i = threadIdx.x; i < 64; i += blockDim.x) {
            const int jj = i / 32, l = i % 32;
            const int col = blockIdx.x * 8 + (l >> 2), xr = 2 * (l & 3) + jj;
            if (col >= m || xr >= n) continue;
            float sg = 0.f, su = 0.f;
#pragma unroll
            for (int w = 0; w < SMALL_WARPS; w++) {
                sg += part[w][jj][l];
                su += part[w][jj + 2][l];
            }
            const float gate = sg * sx_s[xr] * sw[col], up = su * sx_s[xr] * sw[m + col];
            store_small(&out[(size_t)xr * m + col], swiglu(gate, up));
        }
    }
}

// out: [n, m] f32; x: [n, k] f32 or bf16; qw: [m, k] e4m3, sw: [m].
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_small_q_f32(float* __restrict__ out, const float* __restrict__ x, const u8* __restrict__ qw,
                const float* __restrict__ sw, int n, int k, int m) {
    gemm_small_q<float, float, false>(out, x, qw, sw, n, k, m);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_small_q_bf16(float* __restrict__ out, const bf16_t* __restrict__ x, const u8* __restrict__ qw,
                 const float* __restrict__ sw, int n, int k, int m) {
    gemm_small_q<bf16_t, float, false>(out, x, qw, sw, n, k, m);
}
// out: [n, f] (f32 or bf16, the second suffix); x: [n, k] (the first); qw: [2f, k] e4m3, sw: [2f].
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_swiglu_small_q_f32_f32(float* __restrict__ out, const float* __restrict__ x, const u8* __restrict__ qw,
                           const float* __restrict__ sw, int n, int k, int f) {
    gemm_small_q<float, float, true>(out, x, qw, sw, n, k, f);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_swiglu_small_q_f32_bf16(bf16_t* __restrict__ out, const float* __restrict__ x, const u8* __restrict__ qw,
                            const float* __restrict__ sw, int n, int k, int f) {
    gemm_small_q<float, bf16_t, true>(out, x, qw, sw, n, k, f);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_swiglu_small_q_bf16_f32(float* __restrict__ out, const bf16_t* __restrict__ x, const u8* __restrict__ qw,
                            const float* __restrict__ sw, int n, int k, int f) {
    gemm_small_q<bf16_t, float, true>(out, x, qw, sw, n, k, f);
}
extern "C" __global__ void __launch_bounds__(32 * SMALL_WARPS)
fp8_swiglu_small_q_bf16_bf16(bf16_t* __restrict__ out, const bf16_t* __restrict__ x, const u8* __restrict__ qw,
                             const float* __restrict__ sw, int n, int k, int f) {
    gemm_small_q<bf16_t, bf16_t, true>(out, x, qw, sw, n, k, f);
}
