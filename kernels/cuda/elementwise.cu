// elementwise.cu: RMSNorm (optionally fused with the residual add), SiLU-mul, embedding gather, bias
// add, row gather, the f32 -> bf16 cast that feeds the matrix products, and an L2-evicting read.
//
// Activations are f32 (the Backend contract); weights and the KV cache are bf16. Row reductions use
// one block per row; element-wise kernels use grid-stride loops. The producers of matrix-product
// inputs (RMSNorm, SiLU-mul) also come in a `_bf16` form that stores its f32 result rounded to bf16
// (round to nearest even, as cast_f32_bf16), for products that multiply in bf16 anyway
// (Backend::matmul_input_dtype): the values cuBLAS multiplies are the same, without the cast kernel
// and with half the bytes written; gather_rows_bf16 widens such rows back to f32.
// For FP8 products (Backend::takes_quantized_rows) they come in an `_e4m3` form too: the bf16
// form's values, quantized per row exactly as fp8.cu's quantize_rows_vec_bf16 quantizes a bf16 row
// (the same max, the same product and rounding of each element), so the codes and scales are the
// bits the bf16 form + that kernel give, with one kernel and no bf16 row written or read.
// Quantized rows q: [n, d] e4m3, scales: [n] f32 (the caller places them after the codes).
// The SiLU-mul kernels read the gate/up rows in f32, or (`_from_bf16`) in bf16 where an FP8 product
// wrote them so (CudaTuning::fp8_gate_up_bf16): half the bytes written by the product and read here.
#include "common.cuh"

typedef unsigned char u8;

// One value times inv, rounded to e4m3 as quantize_rows rounds it.
__device__ __forceinline__ u8 e4m3_of(float v, float inv) {
    return (u8)(f32x2_to_e4m3x2(__fmul_rn(v, inv), 0.f) & 0xff);
}

// A value as the `_bf16` form stores it, widened back (exact).
__device__ __forceinline__ float as_bf16(float v) { return bf2f(f2bf(v)); }

// If delta != null: residual[t] += delta[t] (stored). Then
// out[t] = residual[t] * rsqrt(mean(residual[t]^2) + eps) * weight.
// residual: [n, d] f32, delta: [n, d] f32 or null (plain RMSNorm of `residual`), weight: [d] f32,
// out: [n, d] f32 (rmsnorm_residual) or bf16 (rmsnorm_residual_bf16). Grid: n, block: 256..1024
// threads (multiple of 32).
// A thread keeps its first RMS_KEEP elements (and their weights, loaded before the reduction) in
// registers, so a row of up to RMS_KEEP * blockDim elements (4096 with 1024 threads) is read once
// and the weight read overlaps the reduction instead of following it; wider rows re-read the rest.
#define RMS_KEEP 4
// An f32 result into an output element: as is, or rounded to bf16.
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16_t* p, float v) { *p = f2bf(v); }

// The shared first half of the RMSNorm kernels: row `row` of residual (+ delta, stored back), its
// first RMS_KEEP * blockDim elements and their weights kept in keep / w; returns
// rsqrt(mean(x^2) + eps).
__device__ __forceinline__ float rms_row(float* __restrict__ r, const float* __restrict__ drow,
                                         const float* __restrict__ weight, int d, float eps,
                                         float* keep, float* w, float* scratch) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        keep[j] = 0.f;
        w[j] = 0.f;
        if (i < d) {
            keep[j] = r[i];
            w[j] = weight[i];
            if (drow != nullptr) keep[j] += drow[i];
        }
    }
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < d) {
            if (drow != nullptr) r[i] = keep[j];
            ss = fmaf(keep[j], keep[j], ss);
        }
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x) {
        float v = r[i];
        if (drow != nullptr) {
            v += drow[i];
            r[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)d + eps);
}

template <typename OutT>
__device__ __forceinline__ void rmsnorm_rows(OutT* __restrict__ out, float* __restrict__ residual,
                                             const float* __restrict__ delta, const float* __restrict__ weight,
                                             int d, float eps) {
    __shared__ float scratch[32];
    allow_dependents_early();  // a GEMV after this may start streaming its weights
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const size_t row = blockIdx.x;
    float* r = residual + row * d;
    float keep[RMS_KEEP], w[RMS_KEEP];
    const float inv = rms_row(r, delta != nullptr ? delta + row * d : nullptr, weight, d, eps, keep, w, scratch);
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < d) store_out(&out[row * d + i], keep[j] * inv * w[j]);
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x)
        store_out(&out[row * d + i], r[i] * inv * weight[i]);
}

// out: [n, d] f32.
extern "C" __global__ void rmsnorm_residual(float* __restrict__ out, float* __restrict__ residual,
                                            const float* __restrict__ delta,
                                            const float* __restrict__ weight, int d, float eps) {
    rmsnorm_rows(out, residual, delta, weight, d, eps);
}

// The same with out: [n, d] bf16.
extern "C" __global__ void rmsnorm_residual_bf16(bf16_t* __restrict__ out, float* __restrict__ residual,
                                                 const float* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    rmsnorm_rows(out, residual, delta, weight, d, eps);
}

// The same as e4m3 rows: rmsnorm_residual_bf16's values, quantized per row (see the top).
// q: [n, d] e4m3, scales: [n] f32. Bounded to 32 registers a thread, as the other forms compile
// to: two CTAs of 1024 threads an SM (with 36 it ran one, 30.2 us a 1024 x 4096 launch on the
// H200 against the bf16 form's 19.4).
extern "C" __global__ void __launch_bounds__(1024, 2) rmsnorm_residual_e4m3(u8* __restrict__ q, float* __restrict__ scales,
                                                 float* __restrict__ residual, const float* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    __shared__ float scratch[32];
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    float* r = residual + row * d;
    float keep[RMS_KEEP], w[RMS_KEEP];
    const float inv = rms_row(r, delta != nullptr ? delta + row * d : nullptr, weight, d, eps, keep, w, scratch);
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        keep[j] = i < d ? as_bf16(keep[j] * inv * w[j]) : 0.f;
        a = fmaxf(a, fabsf(keep[j]));
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x)
        a = fmaxf(a, fabsf(as_bf16(r[i] * inv * weight[i])));
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) scales[row] = row_quant_scale(a);
    u8* qr = q + row * d;
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < d) qr[i] = e4m3_of(keep[j], qi);
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x)
        qr[i] = e4m3_of(as_bf16(r[i] * inv * weight[i]), qi);
}

// Four consecutive outputs from out[0].
__device__ __forceinline__ void store_out4(float* p, float a, float b, float c, float d) {
    *(float4*)p = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store_out4(bf16_t* p, float a, float b, float c, float d) {
    *(uint2*)p = make_uint2((u32)f2bf(a) | ((u32)f2bf(b) << 16), (u32)f2bf(c) | ((u32)f2bf(d) << 16));
}

// Four consecutive gate/up values from g[4 q ..]: f32 (16-byte load) or bf16 (8-byte load, widened).
__device__ __forceinline__ float4 load4(const float* g, int q) { return ((const float4*)g)[q]; }
__device__ __forceinline__ float4 load4(const bf16_t* g, int q) {
    const uint2 v = ((const uint2*)g)[q];
    return make_float4(bf2f((bf16_t)(v.x & 0xffff)), bf2f((bf16_t)(v.x >> 16)), bf2f((bf16_t)(v.y & 0xffff)),
                       bf2f((bf16_t)(v.y >> 16)));
}
__device__ __forceinline__ float load1(const float* g, int j) { return g[j]; }
__device__ __forceinline__ float load1(const bf16_t* g, int j) { return bf2f(g[j]); }

// out[t, j] = silu(gate_up[t, j]) * gate_up[t, f + j]; gate_up: [n, 2f] InT (f32, or bf16 where an
// FP8 product wrote it so), out: [n, f] OutT.
// Grid: (x, y) with y over rows (strided past gridDim.y), x over the row's columns: four a
// thread with 16-byte (8-byte for bf16) loads where f % 4 == 0 (rows then aligned), else one a
// thread. Each output is the same expression either way, so the bits do not depend on the path.
// Design: a 2-D grid, no division per element; the flat grid-stride loop this replaced divided
// a 64-bit index by f for every element and moved 1.8 TB/s on the H200 (kernels/README.md).
template <typename InT, typename OutT>
__device__ __forceinline__ void silu_mul_rows(OutT* __restrict__ out, const InT* __restrict__ gate_up, int n, int f) {
    allow_dependents_early();  // a GEMV after this may start streaming its weights
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const int lane = blockIdx.x * blockDim.x + threadIdx.x, lanes = gridDim.x * blockDim.x;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const InT* g = gate_up + (size_t)t * 2 * f;
        const InT* u = g + f;
        OutT* o = out + (size_t)t * f;
        if ((f & 3) == 0) {
            for (int q = lane; q < (f >> 2); q += lanes) {
                const float4 a = load4(g, q), b = load4(u, q);
                store_out4(o + 4 * q, swiglu(a.x, b.x), swiglu(a.y, b.y), swiglu(a.z, b.z), swiglu(a.w, b.w));
            }
        } else {
            for (int j = lane; j < f; j += lanes) store_out(&o[j], swiglu(load1(g, j), load1(u, j)));
        }
    }
}

// gate_up: [n, 2f] f32, out: [n, f] f32.
extern "C" __global__ void silu_mul(float* __restrict__ out, const float* __restrict__ gate_up, int n, int f) {
    silu_mul_rows(out, gate_up, n, f);
}

// gate_up: [n, 2f] f32, out: [n, f] bf16.
extern "C" __global__ void silu_mul_bf16(bf16_t* __restrict__ out, const float* __restrict__ gate_up, int n, int f) {
    silu_mul_rows(out, gate_up, n, f);
}

// gate_up: [n, 2f] bf16, out: [n, f] f32.
extern "C" __global__ void silu_mul_from_bf16(float* __restrict__ out, const bf16_t* __restrict__ gate_up, int n,
                                              int f) {
    silu_mul_rows(out, gate_up, n, f);
}

// gate_up: [n, 2f] bf16, out: [n, f] bf16.
extern "C" __global__ void silu_mul_bf16_from_bf16(bf16_t* __restrict__ out, const bf16_t* __restrict__ gate_up,
                                                   int n, int f) {
    silu_mul_rows(out, gate_up, n, f);
}

#define SILU_Q_THREADS 512
#define SILU_Q_GROUPS 8  // groups of 4 values a thread holds: f <= 4 * 512 * 8 = 16384

// silu_mul_bf16's values as e4m3 rows (see the top): q: [n, f] e4m3, scales: [n] f32,
// gate_up: [n, 2f] InT (f32 or bf16). Grid: n, block: SILU_Q_THREADS; f % 4 == 0 and f <= 16384
// (the row is held in registers between its max and its quantization, so gate_up is read once).
template <typename InT>
__device__ __forceinline__ void silu_mul_e4m3_row(u8* __restrict__ q, float* __restrict__ scales,
                                                  const InT* __restrict__ gate_up, int f) {
    __shared__ float scratch[32];
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    const InT* g = gate_up + row * 2 * (size_t)f;
    const InT* u = g + f;
    const int groups = f >> 2;
    float v[SILU_Q_GROUPS][4];
    float a = 0.f;
#pragma unroll
    for (int c = 0; c < SILU_Q_GROUPS; c++) {
        const int idx = threadIdx.x + c * SILU_Q_THREADS;
        if (idx < groups) {
            const float4 x = load4(g, idx), y = load4(u, idx);
            v[c][0] = as_bf16(swiglu(x.x, y.x));
            v[c][1] = as_bf16(swiglu(x.y, y.y));
            v[c][2] = as_bf16(swiglu(x.z, y.z));
            v[c][3] = as_bf16(swiglu(x.w, y.w));
#pragma unroll
            for (int j = 0; j < 4; j++) a = fmaxf(a, fabsf(v[c][j]));
        }
    }
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) scales[row] = row_quant_scale(a);
    u32* qr = (u32*)(q + row * (size_t)f);
#pragma unroll
    for (int c = 0; c < SILU_Q_GROUPS; c++) {
        const int idx = threadIdx.x + c * SILU_Q_THREADS;
        if (idx < groups) {
            const u32 lo = f32x2_to_e4m3x2(__fmul_rn(v[c][0], qi), __fmul_rn(v[c][1], qi));
            const u32 hi = f32x2_to_e4m3x2(__fmul_rn(v[c][2], qi), __fmul_rn(v[c][3], qi));
            qr[idx] = lo | (hi << 16);
        }
    }
}

// gate_up: [n, 2f] f32.
extern "C" __global__ void __launch_bounds__(SILU_Q_THREADS)
silu_mul_e4m3(u8* __restrict__ q, float* __restrict__ scales, const float* __restrict__ gate_up, int f) {
    silu_mul_e4m3_row(q, scales, gate_up, f);
}

// gate_up: [n, 2f] bf16.
extern "C" __global__ void __launch_bounds__(SILU_Q_THREADS)
silu_mul_e4m3_from_bf16(u8* __restrict__ q, float* __restrict__ scales, const bf16_t* __restrict__ gate_up, int f) {
    silu_mul_e4m3_row(q, scales, gate_up, f);
}

// out[t, :] = f32(table[min(ids[t], vocab - 1), :]). table: [vocab, d] bf16, ids: [n] u32,
// out: [n, d] f32. Grid: n.
extern "C" __global__ void embedding_gather(float* __restrict__ out, const bf16_t* __restrict__ table,
                                            const u32* __restrict__ ids, int d, int vocab) {
    allow_dependents_early();
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const size_t row = blockIdx.x;
    const size_t id = min(ids[row], (u32)(vocab - 1));
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[row * d + i] = bf2f(table[id * d + i]);
}

// out[r, :] = x[rows[r], :]. x: [*, d] f32, rows: [n_rows] u32, out: [n_rows, d] f32. Grid: n_rows.
extern "C" __global__ void gather_rows(float* __restrict__ out, const float* __restrict__ x,
                                       const u32* __restrict__ rows, int d) {
    allow_dependents_early();
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const size_t r = blockIdx.x;
    const size_t src = rows[r];
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[r * d + i] = x[src * d + i];
}

// The same from bf16 rows, widened: x: [*, d] bf16, out: [n_rows, d] f32.
extern "C" __global__ void gather_rows_bf16(float* __restrict__ out, const bf16_t* __restrict__ x,
                                            const u32* __restrict__ rows, int d) {
    allow_dependents_early();
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const size_t r = blockIdx.x;
    const size_t src = rows[r];
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[r * d + i] = bf2f(x[src * d + i]);
}

// x[t, j] += bias[j]; x: [n, m] f32, bias: [m] f32.
extern "C" __global__ void add_bias(float* __restrict__ x, const float* __restrict__ bias, int n, int m) {
    const size_t total = (size_t)n * m;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x)
        x[idx] += bias[idx % m];
}

// out[i] = bf16(in[i]) for n elements (round to nearest even).
extern "C" __global__ void cast_f32_bf16(bf16_t* __restrict__ out, const float* __restrict__ in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = f2bf(in[i]);
}

// Reads n 16-byte words and keeps nothing (sink is written only if their xor equals key, which the
// host picks so that it does not): an L2 eviction that leaves clean lines behind, for timing a
// kernel as a decode step meets it (its weights in DRAM, nothing dirty in the L2 to write back).
// in: [n] uint4, sink: [1] u32. Grid-stride.
extern "C" __global__ void read_sweep(const uint4* __restrict__ in, size_t n, u32 key, u32* __restrict__ sink) {
    u32 acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = in[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == key) *sink = acc;
}

// Stands in, when the host times a product's candidates (det_gemv.rs), for the kernel a decode
// step runs before it: lets its dependents launch at once (as RMSNorm does) and then spins for
// `ns` nanoseconds of the global timer, so a candidate launched with programmatic dependent launch
// issues its first weight loads under it, as it would in the step, and cuBLASLt, launched the
// ordinary way, does not. One CTA; no memory touched.
extern "C" __global__ void lead_spin(u32 ns) {
    allow_dependents_early();
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    } while (t - t0 < ns);
}

// out[i] = bf16(scale * u) with u uniform in [-1, 1) from a counter-based hash of (seed, i):
// device-side random weights for benchmarks, without a host round trip. out: [n] bf16.
extern "C" __global__ void fill_random_bf16(bf16_t* __restrict__ out, size_t n, u32 seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        u64 z = (u64)i + ((u64)seed << 40) + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.f / 16777216.f) * 2.f - 1.f;
        out[i] = f2bf(scale * u);
    }
}

// hi[i] = bf16(in[i]), lo[i] = bf16(in[i] - hi[i]): a two-term bf16 expansion of f32 values, so that
// W @ hi + W @ lo reproduces an f32-input product to about 2^-16 relative error (precise matmul).
extern "C" __global__ void split_f32_bf16(bf16_t* __restrict__ hi, bf16_t* __restrict__ lo,
                                          const float* __restrict__ in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float x = in[i];
        const bf16_t h = f2bf(x);
        hi[i] = h;
        lo[i] = f2bf(x - bf2f(h));
    }
}

// Deterministic prefill attention (runtime/src/backend/cuda/attention_rows.rs): the prefill's query
// tokens become rows of the decode-attention kernel, so each is attended exactly as a decode step
// attends it. For rows r = row0 + blockIdx.x of a batch whose sequence s holds token rows
// [q_starts[s], q_starts[s + 1]) and has ctx_lens[s] tokens after the step, row_tables[blockIdx.x]
// gets s's block table and row_ctx[blockIdx.x] the token's context length (its position + 1).
// block_tables: [n_seqs, max_blocks] u32; row_tables: [gridDim.x, max_blocks] u32; row_ctx:
// [gridDim.x] u32. Grid: one block per row; block: any width.
extern "C" __global__ void expand_decode_rows(u32* __restrict__ row_tables, u32* __restrict__ row_ctx,
                                              const u32* __restrict__ block_tables, const u32* __restrict__ q_starts,
                                              const u32* __restrict__ ctx_lens, int n_seqs, int max_blocks, int row0) {
    const u32 r = (u32)row0 + blockIdx.x;
    int lo = 0, hi = n_seqs - 1;  // the last sequence whose first row is <= r (skips empty ones)
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (q_starts[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    const u32 q0 = q_starts[lo], q1 = q_starts[lo + 1];
    if (threadIdx.x == 0) row_ctx[blockIdx.x] = ctx_lens[lo] - (q1 - q0) + (r - q0) + 1;
    for (int i = threadIdx.x; i < max_blocks; i += blockDim.x)
        row_tables[(size_t)blockIdx.x * max_blocks + i] = block_tables[(size_t)lo * max_blocks + i];
}
