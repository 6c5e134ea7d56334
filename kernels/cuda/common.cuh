// common.cuh: helpers shared by every sov kernel (prepended to each .cu by sov-kernels, since NVRTC
// compiles one string and the programs must not depend on CUDA's own headers being found).
//
// Storage types: bf16 values travel as `unsigned short` (raw bits) and are widened to f32 for all
// arithmetic; results are rounded back to bf16 with round-to-nearest-even. Accumulation is f32.
#pragma once

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define SOV_INF __int_as_float(0x7f800000)

// bf16 bits -> f32 (exact).
__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((u32)x) << 16); }

// f32 -> bf16 bits, round to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16_t f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Element i of an activation the attention kernels write: f32, or (out_bf16 != 0) rounded to bf16
// as cast_f32_bf16 rounds, for an output projection that multiplies in bf16 (no cast kernel between).
__device__ __forceinline__ void store_act(void* out, int out_bf16, size_t i, float v) {
    if (out_bf16)
        ((bf16_t*)out)[i] = f2bf(v);
    else
        ((float*)out)[i] = v;
}

// Unpack 8 bf16 values held in a uint4 (16 bytes) into f32.
__device__ __forceinline__ void unpack8(const uint4 v, float* out) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Pack 8 f32 values into 8 bf16 (uint4).
__device__ __forceinline__ uint4 pack8(const float* in) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (u32)f2bf(in[2 * i]) | ((u32)f2bf(in[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over all threads of a block (blockDim.x a multiple of 32, <= 1024). `scratch` holds 32 floats.
// Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -SOV_INF;
    return warp_max(v);
}

// SwiGLU of one gate and one up value: silu(g) * u with silu(g) = g / (1 + exp(-g)). The one
// expression of silu_mul (elementwise.cu) and the fused GEMV (gemv.cu), so both give the same bits.
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.f + expf(-g)) * u; }

// (a, b) rotated by the angle with cosine c and sine s: a' = a c - b s, b' = b c + a s, each product
// rounded before the sum (no FMA contraction), as the CPU backend computes it, so rope_inplace,
// rope_kv_write (rope_kv.cu) and the decode attention's fused RoPE give the same bits.
__device__ __forceinline__ void rotate_pair(float a, float b, float c, float s, float* ra, float* rb) {
    *ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// Programmatic dependent launch (sm_90+). The kernels of a decode step (GEMVs, RMSNorm, RoPE + KV
// write, decode attention, SiLU, gathers, argmax) are launched with programmatic stream
// serialization: one may be scheduled while the kernel before it is still running, once that one
// calls allow_dependents_early() (each does so first). It must call wait_for_prerequisites() before
// it reads or writes anything earlier kernels touch; before that it may only read data no kernel of
// the chain still running writes: the weights (the GEMVs issue their first weight loads there), the
// step's inputs uploaded before its first kernel, and the KV rows of earlier steps (the decode
// attention issues its first chunks there). Both are no-ops below sm_90 and for
// kernels launched the ordinary way.
__device__ __forceinline__ void allow_dependents_early() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// FP8 (e4m3, OCP float8_e4m3fn) conversions, sm_89 and newer (they trap below).
// Two f32 to two e4m3 (a in the low byte), round to nearest even, saturated to the finite range.
#define FP8_MAX 448.f
__device__ __forceinline__ unsigned short f32x2_to_e4m3x2(float a, float b) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(b), "f"(a));
    return r;
#else
    __trap();
    return 0;
#endif
}
// Two e4m3 codes (the low byte first) to two f16 in one register (exact: e4m3 is a subset of f16).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(unsigned short v) {
#if __CUDA_ARCH__ >= 890
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(v));
    return h;
#else
    __trap();
    return 0;
#endif
}

// The e4m3 KV cache (-DKV_FP8, `--kv-dtype fp8`). Each slot of one layer's K (or V) cache owns
// kv_e4m3_row_bytes(KVH, D) bytes (sov_kernels::kv_e4m3_row_bytes: KVH * D codes and KVH f32 scales,
// padded to 16), but a slot's bytes are not one row: slots go in groups of KV8_GROUP (16) whose
// 16 * row bytes hold [KVH][16][D] codes, then [KVH][16] f32 scales, then padding, so a head's codes
// of 16 consecutive slots are one contiguous 16 * D run (a whole cache block, its block size being
// a multiple of 16, is whole groups). kv8_codes_at / kv8_scale_at give a (slot, head)'s offsets.
// A head's values x[0..D) are stored as scale = amax / 448, codes e4m3(x * (448 / amax)) (amax =
// max |x|; all zero: scale 0, codes 0), and read back as code * scale. kv_quant_inv /
// kv_quant_scale are the one arithmetic every writer uses (rope_kv.cu, the fused write of
// decode_attention_mma.cu), so they store the same bytes.
#define KV8_GROUP 16
__device__ __forceinline__ size_t kv_e4m3_row_bytes(int n_kv_heads, int d) {
    return (size_t)n_kv_heads * d + (size_t)((4 * n_kv_heads + 15) / 16 * 16);
}
// Byte offset of slot `slot`'s codes of head kvh ([D] contiguous); row_bytes = kv_e4m3_row_bytes.
__device__ __forceinline__ size_t kv8_codes_at(size_t slot, int kvh, int d, size_t row_bytes) {
    return (slot / KV8_GROUP) * KV8_GROUP * row_bytes + ((size_t)kvh * KV8_GROUP + slot % KV8_GROUP) * d;
}
// Byte offset of slot `slot`'s f32 scale of head kvh.
__device__ __forceinline__ size_t kv8_scale_at(size_t slot, int kvh, int n_kv_heads, int d, size_t row_bytes) {
    return (slot / KV8_GROUP) * KV8_GROUP * row_bytes + (size_t)n_kv_heads * KV8_GROUP * d +
           ((size_t)kvh * KV8_GROUP + slot % KV8_GROUP) * 4;
}
// A product-input row of absolute maximum a (fp8.cu's per-token quantization, and the producers
// that write e4m3 rows in elementwise.cu): the factor its values are multiplied by, and its scale
// (1 for a row of zeros).
__device__ __forceinline__ float row_quant_inv(float a) { return a > 0.f ? __fdiv_rn(FP8_MAX, a) : 0.f; }
__device__ __forceinline__ float row_quant_scale(float a) { return a > 0.f ? __fdiv_rn(a, FP8_MAX) : 1.f; }

__device__ __forceinline__ float kv_quant_inv(float amax) { return amax > 0.f ? __fdiv_rn(FP8_MAX, amax) : 0.f; }
__device__ __forceinline__ float kv_quant_scale(float amax) { return __fdiv_rn(amax, FP8_MAX); }

// KV-cache element type: bf16 by default; f32 when compiled with -DKV_F32 (precise mode); e4m3
// codes with -DKV_FP8 (the tensor-core attention units only; no kv8 helpers).
// kv8 holds 8 consecutive elements (16 bytes of bf16 or 32 bytes of f32).
#if defined(KV_FP8)
typedef unsigned char kv_t;
#elif defined(KV_F32)
typedef float kv_t;
struct kv8 {
    float4 a, b;
};
__device__ __forceinline__ kv8 kv8_load(const kv_t* p) { return kv8{((const float4*)p)[0], ((const float4*)p)[1]}; }
__device__ __forceinline__ kv8 kv8_zero() { return kv8{make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)}; }
__device__ __forceinline__ void kv8_unpack(const kv8& v, float* f) {
    f[0] = v.a.x; f[1] = v.a.y; f[2] = v.a.z; f[3] = v.a.w;
    f[4] = v.b.x; f[5] = v.b.y; f[6] = v.b.z; f[7] = v.b.w;
}
#else
typedef bf16_t kv_t;
typedef uint4 kv8;
__device__ __forceinline__ kv8 kv8_load(const kv_t* p) { return *(const uint4*)p; }
__device__ __forceinline__ kv8 kv8_zero() { return make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ void kv8_unpack(const kv8& v, float* f) { unpack8(v, f); }
#endif
