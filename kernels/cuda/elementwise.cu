// elementwise.cu: RMSNorm (optionally fused with the residual add), SiLU-mul, embedding gather,
// bias add, row gather, the f32 -> bf16 cast that feeds the matrix products, and an L2-evicting
// read.
//
// Activations are f32 (the Backend contract); weights and the KV cache are bf16. Row reductions use
// one block per row; element-wise kernels use grid-stride loops. The producers of matrix-product
// inputs (RMSNorm, SiLU-mul) also come in a `_bf16` form that stores its f32 result rounded to bf16
// (round to nearest even, as cast_f32_bf16), for products that multiply in bf16 anyway
// (Backend::matmul_input_dtype): the values cuBLAS multiplies are the same, without the cast kernel
// and with half the bytes written; gather_rows_bf16 widens such rows back to f32. For FP8 products
// (Backend::takes_quantized_rows) they come in an `_e4m3` form too: the bf16 form's values,
// quantized per row exactly as fp8.cu's quantize_rows_vec_bf16 quantizes a bf16 row (the same max,
// the same product and rounding of each element), so the codes and scales are the bits the bf16
// form + that kernel give, with one kernel and no bf16 row written or read. Rows whose product
// input is f32 (Backend::matmul_input_dtype: decode steps of a few rows) take the `_f32_e4m3` form
// instead: the f32 form's values quantized as quantize_rows_vec_f32 does. Quantized rows q: [n, d]
// e4m3, scales: [n] f32 (the caller places them after the codes). The SiLU-mul kernels read the
// gate/up rows in f32, or (`_from_bf16`) in bf16 where an FP8 product wrote them so
// (CudaTuning::fp8_gate_up_bf16): half the bytes written by the product and read here. Likewise the
// add + RMSNorm kernels read the residual's delta in f32, or (`_dbf16`) in bf16 where an FP8 o or
// down product wrote it so (CudaTuning::fp8_delta_bf16).
#include "common.cuh"

typedef unsigned char u8;

// One value times inv, rounded to e4m3 as quantize_rows rounds it.
__device__ __forceinline__ u8 e4m3_of(float v, float inv) {
    return (u8)(f32x2_to_e4m3x2(__fmul_rn(v, inv), 0.f) & 0xff);
}

// A value as the `_bf16` form stores it, widened back (exact).
__device__ __forceinline__ float as_bf16(float v) { return bf2f(f2bf(v)); }

// Four consecutive values from g[4 q ..]: f32 (16-byte load) or bf16 (8-byte load, widened);
// gate/up rows and residual deltas come in either.
__device__ __forceinline__ float4 load4(const float* g, int q) { return ((const float4*)g)[q]; }
__device__ __forceinline__ float4 load4(const bf16_t* g, int q) {
    const uint2 v = ((const uint2*)g)[q];
    return make_float4(bf2f((bf16_t)(v.x & 0xffff)), bf2f((bf16_t)(v.x >> 16)), bf2f((bf16_t)(v.y & 0xffff)),
                       bf2f((bf16_t)(v.y >> 16)));
}
__device__ __forceinline__ float load1(const float* g, int j) { return g[j]; }
__device__ __forceinline__ float load1(const bf16_t* g, int j) { return bf2f(g[j]); }

// If delta != null: residual[t] += delta[t] (stored). Then
// out[t] = residual[t] * rsqrt(mean(residual[t]^2) + eps) * weight.
// residual: [n, d] f32, delta: [n, d] f32 or null (plain RMSNorm of `residual`), weight: [d] f32,
// out: [n, d] f32 (rmsnorm_residual) or bf16 (rmsnorm_residual_bf16). Grid: n, block: 256..1024
// threads (multiple of 32). Each kernel has a `_dbf16` twin whose delta is [n, d] bf16 (an FP8 o or
// down product written so, CudaTuning::fp8_delta_bf16): the same sums of the widened values.
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
template <typename DeltaT>
__device__ __forceinline__ float rms_row(float* __restrict__ r, const DeltaT* __restrict__ drow,
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
            if (drow != nullptr) keep[j] += load1(drow, i);
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
            v += load1(drow, i);
            r[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)d + eps);
}

// Four consecutive outputs from out[0].
__device__ __forceinline__ void store_out4(float* p, float a, float b, float c, float d) {
    *(float4*)p = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store_out4(bf16_t* p, float a, float b, float c, float d) {
    *(uint2*)p = make_uint2((u32)f2bf(a) | ((u32)f2bf(b) << 16), (u32)f2bf(c) | ((u32)f2bf(d) << 16));
}

// Vector rows: where d % 4 == 0 and the row pointers are 16-byte aligned (every row then is), a
// thread owns the float4 groups g = threadIdx.x + j * blockDim.x of its row and keeps the first
// RMS_VEC_KEEP of them (and their weights) in registers; the launch (ops.rs `rms_norm_config`)
// gives a row d / (4 * RMS_VEC_KEEP) threads (whole warps, 32..1024: 256 holding 16 values each
// for a 4096-wide row) whatever the row count, so a row's sum of squares is added in one order in
// every batch. Design: 16-byte loads and stores, and CTAs small enough that several share an SM
// and one's loads overlap another's reductions; the 1024-thread CTAs of the scalar form ran at
// about 2/3 of copy speed, this form at 0.92-0.95 (kernels/docs/fp8.md, FP8). Each element's
// expression is the scalar form's; only the order of the sum of squares differs.
#define RMS_VEC_KEEP 4

// Whether the vector form applies to a row of d: d % 4 == 0 and every pointer 16-byte aligned.
__device__ __forceinline__ bool rms_vec_rows(int d, const void* a, const void* b, const void* c, const void* e) {
    return (d & 3) == 0 && (((size_t)a | (size_t)b | (size_t)c | (size_t)e) & 15) == 0;
}

// rms_row's vector form: the row's first RMS_VEC_KEEP float4 groups a thread owns kept in keep / w.
template <typename DeltaT>
__device__ __forceinline__ float rms_row4(float* __restrict__ r, const DeltaT* __restrict__ drow,
                                          const float* __restrict__ weight, int d, float eps, float4* keep,
                                          float4* w, float* scratch) {
    const int groups = d >> 2;
    float4* r4 = (float4*)r;
    const float4* w4 = (const float4*)weight;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < RMS_VEC_KEEP; j++) {
        const int g = threadIdx.x + j * blockDim.x;
        keep[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        w[j] = keep[j];
        if (g < groups) {
            keep[j] = r4[g];
            w[j] = w4[g];
            if (drow != nullptr) {
                const float4 x = load4(drow, g);
                keep[j].x += x.x;
                keep[j].y += x.y;
                keep[j].z += x.z;
                keep[j].w += x.w;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < RMS_VEC_KEEP; j++) {
        const int g = threadIdx.x + j * blockDim.x;
        if (g < groups) {
            if (drow != nullptr) r4[g] = keep[j];
            ss = fmaf(keep[j].x, keep[j].x, ss);
            ss = fmaf(keep[j].y, keep[j].y, ss);
            ss = fmaf(keep[j].z, keep[j].z, ss);
            ss = fmaf(keep[j].w, keep[j].w, ss);
        }
    }
    for (int g = threadIdx.x + RMS_VEC_KEEP * blockDim.x; g < groups; g += blockDim.x) {
        float4 v = r4[g];
        if (drow != nullptr) {
            const float4 x = load4(drow, g);
            v.x += x.x;
            v.y += x.y;
            v.z += x.z;
            v.w += x.w;
            r4[g] = v;
        }
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)d + eps);
}

// A kept group's normalized values, keep * inv * w element by element.
__device__ __forceinline__ float4 rms_scale4(float4 v, float inv, float4 w) {
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}

template <typename OutT, typename DeltaT>
__device__ __forceinline__ void rmsnorm_rows(OutT* __restrict__ out, float* __restrict__ residual,
                                             const DeltaT* __restrict__ delta, const float* __restrict__ weight,
                                             int d, float eps) {
    __shared__ float scratch[32];
    allow_dependents_early();  // a GEMV after this may start streaming its weights
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const size_t row = blockIdx.x;
    float* r = residual + row * d;
    const DeltaT* drow = delta != nullptr ? delta + row * d : nullptr;
    OutT* o = out + row * d;
    if (rms_vec_rows(d, out, residual, delta, weight)) {
        const int groups = d >> 2;
        float4 keep[RMS_VEC_KEEP], w[RMS_VEC_KEEP];
        const float inv = rms_row4(r, drow, weight, d, eps, keep, w, scratch);
#pragma unroll
        for (int j = 0; j < RMS_VEC_KEEP; j++) {
            const int g = threadIdx.x + j * blockDim.x;
            if (g < groups) {
                const float4 v = rms_scale4(keep[j], inv, w[j]);
                store_out4(o + 4 * g, v.x, v.y, v.z, v.w);
            }
        }
        for (int g = threadIdx.x + RMS_VEC_KEEP * blockDim.x; g < groups; g += blockDim.x) {
            const float4 v = rms_scale4(((const float4*)r)[g], inv, ((const float4*)weight)[g]);
            store_out4(o + 4 * g, v.x, v.y, v.z, v.w);
        }
        return;
    }
    float keep[RMS_KEEP], w[RMS_KEEP];
    const float inv = rms_row(r, drow, weight, d, eps, keep, w, scratch);
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < d) store_out(&o[i], keep[j] * inv * w[j]);
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x) store_out(&o[i], r[i] * inv * weight[i]);
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

// The two with a bf16 delta.
extern "C" __global__ void rmsnorm_residual_dbf16(float* __restrict__ out, float* __restrict__ residual,
                                                  const bf16_t* __restrict__ delta,
                                                  const float* __restrict__ weight, int d, float eps) {
    rmsnorm_rows(out, residual, delta, weight, d, eps);
}
extern "C" __global__ void rmsnorm_residual_bf16_dbf16(bf16_t* __restrict__ out, float* __restrict__ residual,
                                                       const bf16_t* __restrict__ delta,
                                                       const float* __restrict__ weight, int d, float eps) {
    rmsnorm_rows(out, residual, delta, weight, d, eps);
}

// Four values times inv, each rounded to e4m3 as quantize_rows rounds it, the first in the low
// byte.
__device__ __forceinline__ u32 e4m3x4_of(float4 v, float inv) {
    const u32 lo = f32x2_to_e4m3x2(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv));
    const u32 hi = f32x2_to_e4m3x2(__fmul_rn(v.z, inv), __fmul_rn(v.w, inv));
    return lo | (hi << 16);
}

// A group's normalized values as the `_bf16` form stores them, widened back.
__device__ __forceinline__ float4 as_bf16x4(float4 v) {
    return make_float4(as_bf16(v.x), as_bf16(v.y), as_bf16(v.z), as_bf16(v.w));
}

__device__ __forceinline__ float absmax4(float a, float4 v) {
    return fmaxf(fmaxf(a, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// A group's normalized values as the form quantized stores them: rounded to bf16 (BF16_VALUES)
// or as f32.
template <bool BF16_VALUES>
__device__ __forceinline__ float4 stored4(float4 v) {
    return BF16_VALUES ? as_bf16x4(v) : v;
}
template <bool BF16_VALUES>
__device__ __forceinline__ float stored1(float v) {
    return BF16_VALUES ? as_bf16(v) : v;
}

// rmsnorm_residual_e4m3's vector form (rms_vec_rows); returns after writing the row.
template <bool BF16_VALUES, typename DeltaT>
__device__ __forceinline__ void rmsnorm_e4m3_vec(u8* __restrict__ qr, float* __restrict__ scale, float* __restrict__ r,
                                                 const DeltaT* __restrict__ drow, const float* __restrict__ weight,
                                                 int d, float eps, float* scratch) {
    const int groups = d >> 2;
    float4 keep[RMS_VEC_KEEP], w[RMS_VEC_KEEP];
    const float inv = rms_row4(r, drow, weight, d, eps, keep, w, scratch);
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < RMS_VEC_KEEP; j++) {
        keep[j] = stored4<BF16_VALUES>(rms_scale4(keep[j], inv, w[j]));  // zeros past the row: no effect on a
        a = absmax4(a, keep[j]);
    }
    for (int g = threadIdx.x + RMS_VEC_KEEP * blockDim.x; g < groups; g += blockDim.x)
        a = absmax4(a, stored4<BF16_VALUES>(rms_scale4(((const float4*)r)[g], inv, ((const float4*)weight)[g])));
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) *scale = row_quant_scale(a);
#pragma unroll
    for (int j = 0; j < RMS_VEC_KEEP; j++) {
        const int g = threadIdx.x + j * blockDim.x;
        if (g < groups) ((u32*)qr)[g] = e4m3x4_of(keep[j], qi);
    }
    for (int g = threadIdx.x + RMS_VEC_KEEP * blockDim.x; g < groups; g += blockDim.x)
        ((u32*)qr)[g] =
            e4m3x4_of(stored4<BF16_VALUES>(rms_scale4(((const float4*)r)[g], inv, ((const float4*)weight)[g])), qi);
}

// The same as e4m3 rows: rmsnorm_residual_bf16's values (BF16_VALUES) or rmsnorm_residual's,
// quantized per row (see the top). q: [n, d] e4m3, scales: [n] f32. The vector form takes 62
// registers, so the scalar form (odd widths only) runs one 1024-thread CTA an SM.
template <bool BF16_VALUES, typename DeltaT>
__device__ __forceinline__ void rmsnorm_e4m3_rows(u8* __restrict__ q, float* __restrict__ scales,
                                                  float* __restrict__ residual, const DeltaT* __restrict__ delta,
                                                  const float* __restrict__ weight, int d, float eps) {
    __shared__ float scratch[32];
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    float* r = residual + row * d;
    const DeltaT* drow = delta != nullptr ? delta + row * d : nullptr;
    u8* qr = q + row * d;
    if (rms_vec_rows(d, q, residual, delta, weight)) {
        rmsnorm_e4m3_vec<BF16_VALUES, DeltaT>(qr, scales + row, r, drow, weight, d, eps, scratch);
        return;
    }
    float keep[RMS_KEEP], w[RMS_KEEP];
    const float inv = rms_row(r, drow, weight, d, eps, keep, w, scratch);
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        keep[j] = i < d ? stored1<BF16_VALUES>(keep[j] * inv * w[j]) : 0.f;
        a = fmaxf(a, fabsf(keep[j]));
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x)
        a = fmaxf(a, fabsf(stored1<BF16_VALUES>(r[i] * inv * weight[i])));
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) scales[row] = row_quant_scale(a);
#pragma unroll
    for (int j = 0; j < RMS_KEEP; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < d) qr[i] = e4m3_of(keep[j], qi);
    }
    for (int i = threadIdx.x + RMS_KEEP * blockDim.x; i < d; i += blockDim.x)
        qr[i] = e4m3_of(stored1<BF16_VALUES>(r[i] * inv * weight[i]), qi);
}

// rmsnorm_residual_bf16's values as e4m3 rows.
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_residual_e4m3(u8* __restrict__ q, float* __restrict__ scales,
                                                 float* __restrict__ residual, const float* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    rmsnorm_e4m3_rows<true>(q, scales, residual, delta, weight, d, eps);
}

// rmsnorm_residual's (f32) values as e4m3 rows.
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_residual_f32_e4m3(u8* __restrict__ q, float* __restrict__ scales,
                                                 float* __restrict__ residual, const float* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    rmsnorm_e4m3_rows<false>(q, scales, residual, delta, weight, d, eps);
}

// The two with a bf16 delta.
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_residual_e4m3_dbf16(u8* __restrict__ q, float* __restrict__ scales,
                                                 float* __restrict__ residual, const bf16_t* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    rmsnorm_e4m3_rows<true>(q, scales, residual, delta, weight, d, eps);
}
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_residual_f32_e4m3_dbf16(u8* __restrict__ q, float* __restrict__ scales,
                                                 float* __restrict__ residual, const bf16_t* __restrict__ delta,
                                                 const float* __restrict__ weight, int d, float eps) {
    rmsnorm_e4m3_rows<false>(q, scales, residual, delta, weight, d, eps);
}


// out[t, j] = silu(gate_up[t, j]) * gate_up[t, f + j]; gate_up: [n, 2f] InT (f32, or bf16 where an
// FP8 product wrote it so), out: [n, f] OutT.
// Grid: (x, y) with y over rows (strided past gridDim.y), x over the row's columns: four a
// thread with 16-byte (8-byte for bf16) loads where f % 4 == 0 (rows then aligned), else one a
// thread. Each output is the same expression either way, so the bits do not depend on the path.
// Design: a 2-D grid, no division per element; the flat grid-stride loop this replaced divided
// a 64-bit index by f for every element and moved 1.8 TB/s on the H200 (1000 requests 128/256,
// bf16, one call, 2026-12-04: 19085.2 output tok/s with this form against 18410.1).
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

#define SILU_Q_MAX_GROUPS 4096  // groups of 4 values a row may have: f <= 16384
#define SILU_Q_PHASE 4           // groups a thread loads before computing their SwiGLUs
#define SILU_Q_MIN_THREADS 256   // the fewest threads fp8_inputs.rs gives a CTA

// silu_mul_bf16's values as e4m3 rows (see the top): q: [n, f] e4m3, scales: [n] f32,
// gate_up: [n, 2f] InT (f32 or bf16). Grid: n, block: any multiple of 32 up to 1024
// (fp8_inputs.rs: 256, or 1024 where the rows are no more than the SMs); f % 4 == 0, f <= 16384.
// Design: gate_up is read once. A thread issues the loads of SILU_Q_PHASE of its groups of 4
// before their SwiGLUs (the IEEE division's slow-path call in between would otherwise keep one
// group's loads in flight at a time) and parks the rounded values in shared memory until the row's
// max is known, so registers stay few enough for four 256-thread CTAs an SM, and the CTA size is
// free: rows no more than the SMs take 1024 threads (their latency is the step's). At 1024 x 14336
// on the H100 (`bench_row_kernels`) this ran 39.0 us (0.63 of copy speed); the same loop fully
// unrolled for a fixed 256 threads ran 30.7 us (0.80) in another call, the values held in
// registers (256 threads) 34.2 us: kernels/docs/fp8.md, FP8.
template <typename InT>
__device__ __forceinline__ void silu_mul_e4m3_row(u8* __restrict__ q, float* __restrict__ scales,
                                                  const InT* __restrict__ gate_up, int f) {
    __shared__ float scratch[32];
    // The row's SwiGLU values as the bf16 the `_bf16` form would store, each at its group's
    // index: a thread reads back only what it wrote, so no barrier is needed for them.
    __shared__ uint2 vals[SILU_Q_MAX_GROUPS];  // [f / 4] groups of 4 bf16
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    const InT* g = gate_up + row * 2 * (size_t)f;
    const InT* u = g + f;
    const int groups = f >> 2, stride = blockDim.x;
    float a = 0.f;
    // Unrolled over the most phases a SILU_Q_MIN_THREADS CTA needs, so the compiler schedules the
    // phases' loads as it does for a fixed stride (a loop over a run-time count of phases compiled
    // its loads to branches and ran at 0.63-0.65 of copy speed on the H100).
#pragma unroll
    for (int c0 = 0; c0 < SILU_Q_MAX_GROUPS / SILU_Q_MIN_THREADS; c0 += SILU_Q_PHASE) {
        const int base = threadIdx.x + c0 * stride;
        float4 x[SILU_Q_PHASE], y[SILU_Q_PHASE];
#pragma unroll
        for (int c = 0; c < SILU_Q_PHASE; c++) {
            const int idx = base + c * stride;
            if (idx < groups) {
                x[c] = load4(g, idx);
                y[c] = load4(u, idx);
            }
        }
#pragma unroll
        for (int c = 0; c < SILU_Q_PHASE; c++) {
            const int idx = base + c * stride;
            if (idx < groups) {
                const bf16_t b0 = f2bf(swiglu(x[c].x, y[c].x)), b1 = f2bf(swiglu(x[c].y, y[c].y));
                const bf16_t b2 = f2bf(swiglu(x[c].z, y[c].z)), b3 = f2bf(swiglu(x[c].w, y[c].w));
                vals[idx] = make_uint2((u32)b0 | ((u32)b1 << 16), (u32)b2 | ((u32)b3 << 16));
                a = fmaxf(fmaxf(a, fmaxf(fabsf(bf2f(b0)), fabsf(bf2f(b1)))), fmaxf(fabsf(bf2f(b2)), fabsf(bf2f(b3))));
            }
        }
    }
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) scales[row] = row_quant_scale(a);
    u32* qr = (u32*)(q + row * (size_t)f);
    for (int idx = threadIdx.x; idx < groups; idx += stride) {
        const uint2 v = vals[idx];
        const float4 x = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                     __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
        qr[idx] = e4m3x4_of(x, qi);
    }
}

// gate_up: [n, 2f] f32.
extern "C" __global__ void __launch_bounds__(1024)
silu_mul_e4m3(u8* __restrict__ q, float* __restrict__ scales, const float* __restrict__ gate_up, int f) {
    silu_mul_e4m3_row(q, scales, gate_up, f);
}

// gate_up: [n, 2f] bf16.
extern "C" __global__ void __launch_bounds__(1024)
silu_mul_e4m3_from_bf16(u8* __restrict__ q, float* __restrict__ scales, const bf16_t* __restrict__ gate_up, int f) {
    silu_mul_e4m3_row(q, scales, gate_up, f);
}

#define SILU_F32_Q_KEEP 4  // groups of 4 values a silu_mul_f32_e4m3 thread holds in registers

// The SwiGLU of four gate and four up values.
__device__ __forceinline__ float4 swiglu4(float4 g, float4 u) {
    return make_float4(swiglu(g.x, u.x), swiglu(g.y, u.y), swiglu(g.z, u.z), swiglu(g.w, u.w));
}

// silu_mul's (f32) values as e4m3 rows, for rows whose product input is f32 (see the top): the
// codes and scales of silu_mul + quantize_rows_vec_f32. q: [n, f] e4m3, scales: [n] f32, gate_up:
// [n, 2f] f32, f % 4 == 0. Grid: n, block: any multiple of 32 up to 1024 (fp8_inputs.rs gives
// these few rows 1024 threads). A thread loads its first SILU_F32_Q_KEEP groups before any
// SwiGLU and keeps their values in registers until the row's max is known (all of a row of up to
// 16384 at 1024 threads); groups past those are computed twice, the second time from L2.
extern "C" __global__ void __launch_bounds__(1024)
silu_mul_f32_e4m3(u8* __restrict__ q, float* __restrict__ scales, const float* __restrict__ gate_up, int f) {
    __shared__ float scratch[32];
    allow_dependents_early();
    wait_for_prerequisites();
    const size_t row = blockIdx.x;
    const float* g = gate_up + row * 2 * (size_t)f;
    const float* u = g + f;
    const int groups = f >> 2, stride = blockDim.x;
    float4 x[SILU_F32_Q_KEEP], y[SILU_F32_Q_KEEP];
#pragma unroll
    for (int c = 0; c < SILU_F32_Q_KEEP; c++) {
        const int idx = threadIdx.x + c * stride;
        if (idx < groups) {
            x[c] = load4(g, idx);
            y[c] = load4(u, idx);
        }
    }
    float a = 0.f;
#pragma unroll
    for (int c = 0; c < SILU_F32_Q_KEEP; c++) {
        if (threadIdx.x + c * stride < groups) {
            x[c] = swiglu4(x[c], y[c]);
            a = absmax4(a, x[c]);
        }
    }
    for (int idx = threadIdx.x + SILU_F32_Q_KEEP * stride; idx < groups; idx += stride)
        a = absmax4(a, swiglu4(load4(g, idx), load4(u, idx)));
    a = block_max(a, scratch);
    const float qi = row_quant_inv(a);
    if (threadIdx.x == 0) scales[row] = row_quant_scale(a);
    u32* qr = (u32*)(q + row * (size_t)f);
#pragma unroll
    for (int c = 0; c < SILU_F32_Q_KEEP; c++) {
        const int idx = threadIdx.x + c * stride;
        if (idx < groups) qr[idx] = e4m3x4_of(x[c], qi);
    }
    for (int idx = threadIdx.x + SILU_F32_Q_KEEP * stride; idx < groups; idx += stride)
        qr[idx] = e4m3x4_of(swiglu4(load4(g, idx), load4(u, idx)), qi);
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

// hi[i] = bf16(in[i]), lo[i] = bf16(in[i] - hi[i]): a two-term bf16 expansion of f32 values, so
// that W @ hi + W @ lo reproduces an f32-input product to about 2^-16 relative error (precise
// matmul).
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
