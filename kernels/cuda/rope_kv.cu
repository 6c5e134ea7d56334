// rope_kv.cu: rotary position embedding (Hugging Face rotate_half convention) on the q and k heads of
// a fused qkv activation, and the write of new K/V rows into the paged cache -- separately, or
// fused into one launch (rope_kv_write: the decode step's kernel count is what batch 1 pays for).
//
// qkv rows: [(H + 2*KVH) * D] f32, q heads then k heads then v heads. cos/sin tables are
// [max_pos, D/2] f32 computed by the model (Llama-3.1 rope_scaling baked in).
// Paged cache layout, per layer: [num_blocks, block_size, KVH, D] bf16 (f32 in precise mode; for
// an e4m3 cache, kv_e4m3_row_bytes a slot, slots in head-major groups of 16, common.cuh); a
// token's slot is physical_block * block_size + offset_in_block.
#include "common.cuh"

// In place on the first n_rot_heads (= H + KVH) heads of each row: for j < D/2,
// x'[j] = x[j] cos - x[j + D/2] sin, x'[j + D/2] = x[j + D/2] cos + x[j] sin at p = positions[t].
// Grid-stride over n * n_rot_heads * D/2 pairs.
extern "C" __global__ void rope_inplace(float* __restrict__ qkv, const u32* __restrict__ positions,
                                        const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                        int n, int n_rot_heads, int head_dim, int row_stride) {
    const int half = head_dim / 2;
    const size_t total = (size_t)n * n_rot_heads * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int j = idx % half;
        const size_t th = idx / half;
        const int h = th % n_rot_heads;
        const size_t t = th / n_rot_heads;
        const size_t p = positions[t];
        const float c = cos_t[p * half + j], s = sin_t[p * half + j];
        float* x = qkv + t * row_stride + (size_t)h * head_dim;
        rotate_pair(x[j], x[j + half], c, s, x + j, x + j + half);
    }
}

// k_cache[slots[t]] = bf16(qkv[t, H*D .. (H+KVH)*D]), v_cache[slots[t]] = bf16(qkv[t, (H+KVH)*D ..]).
// slots: [n] u32 (0xffffffff skips the token). kv_width = KVH * D, a multiple of 8.
// Grid-stride over 8-element chunks.
extern "C" __global__ void kv_write(bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache,
                                    const float* __restrict__ qkv, const u32* __restrict__ slots, int n,
                                    int q_width, int kv_width, int row_stride) {
    const int chunks = kv_width / 8;
    const size_t total = (size_t)n * chunks;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / chunks;
        const int c = idx % chunks;
        const u32 slot = slots[t];
        if (slot == 0xffffffffu) continue;
        const float* k = qkv + t * row_stride + q_width + c * 8;
        const float* v = k + kv_width;
        const float4 k0 = *(const float4*)k, k1 = *(const float4*)(k + 4);
        const float4 v0 = *(const float4*)v, v1 = *(const float4*)(v + 4);
        const float kf[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
        const float vf[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const size_t dst = (size_t)slot * kv_width + (size_t)c * 8;
        *(uint4*)(k_cache + dst) = pack8(kf);
        *(uint4*)(v_cache + dst) = pack8(vf);
    }
}

// As kv_write, for an f32 cache (precise mode): k_cache[slots[t]] = qkv[t, H*D ..], likewise v.
extern "C" __global__ void kv_write_f32(float* __restrict__ k_cache, float* __restrict__ v_cache,
                                        const float* __restrict__ qkv, const u32* __restrict__ slots, int n,
                                        int q_width, int kv_width, int row_stride) {
    const int chunks = kv_width / 4;
    const size_t total = (size_t)n * chunks;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / chunks;
        const int c = idx % chunks;
        const u32 slot = slots[t];
        if (slot == 0xffffffffu) continue;
        const float* k = qkv + t * row_stride + q_width + c * 4;
        const size_t dst = (size_t)slot * kv_width + (size_t)c * 4;
        *(float4*)(k_cache + dst) = *(const float4*)k;
        *(float4*)(v_cache + dst) = *(const float4*)(k + kv_width);
    }
}

// rope_inplace followed by kv_write (or kv_write_f32) in one launch, with the same results: q and k
// heads are rotated in place, and the rotated k heads and the v heads of each token with a slot are
// stored into the caches. One work item per (token, head of all H + 2*KVH, pair j < D/2); grid-stride.
// qkv: [n, row_stride] f32 (row_stride = (H + 2*KVH) * D), positions, slots: [n] u32 (0xffffffff
// skips the cache write), cos_t/sin_t: [max_pos, D/2] f32, caches: [num_slots, KVH, D] of T.
__device__ __forceinline__ void store_kv(bf16_t* p, float v) { *p = f2bf(v); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }

template <typename T>
__device__ __forceinline__ void rope_kv_write_impl(float* __restrict__ qkv, T* __restrict__ k_cache,
                                                   T* __restrict__ v_cache, const u32* __restrict__ positions,
                                                   const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                   const u32* __restrict__ slots, int n, int n_heads, int n_kv_heads,
                                                   int head_dim, int row_stride) {
    const int half = head_dim / 2, all_heads = n_heads + 2 * n_kv_heads;
    const size_t total = (size_t)n * all_heads * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int j = idx % half;
        const size_t th = idx / half;
        const int h = th % all_heads;
        const size_t t = th / all_heads;
        float* x = qkv + t * row_stride + (size_t)h * head_dim;
        float a = x[j], b = x[j + half];
        if (h < n_heads + n_kv_heads) {
            const size_t p = positions[t];
            const float c = cos_t[p * half + j], s = sin_t[p * half + j];
            rotate_pair(a, b, c, s, &a, &b);
            x[j] = a;
            x[j + half] = b;
        }
        if (h < n_heads) continue;
        const u32 slot = slots[t];
        if (slot == 0xffffffffu) continue;
        T* cache = h < n_heads + n_kv_heads ? k_cache : v_cache;
        const int kvh = (h - n_heads) % n_kv_heads;
        const size_t dst = ((size_t)slot * n_kv_heads + kvh) * head_dim;
        store_kv(cache + dst + j, a);
        store_kv(cache + dst + j + half, b);
    }
}

// bf16 cache.
extern "C" __global__ void rope_kv_write(float* __restrict__ qkv, bf16_t* __restrict__ k_cache,
                                         bf16_t* __restrict__ v_cache, const u32* __restrict__ positions,
                                         const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                         const u32* __restrict__ slots, int n, int n_heads, int n_kv_heads,
                                         int head_dim, int row_stride) {
    allow_dependents_early();  // the attention after this may be scheduled
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    rope_kv_write_impl(qkv, k_cache, v_cache, positions, cos_t, sin_t, slots, n, n_heads, n_kv_heads, head_dim,
                       row_stride);
}

// f32 cache (precise mode).
extern "C" __global__ void rope_kv_write_f32(float* __restrict__ qkv, float* __restrict__ k_cache,
                                             float* __restrict__ v_cache, const u32* __restrict__ positions,
                                             const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                             const u32* __restrict__ slots, int n, int n_heads, int n_kv_heads,
                                             int head_dim, int row_stride) {
    allow_dependents_early();  // the attention after this may be scheduled
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    rope_kv_write_impl(qkv, k_cache, v_cache, positions, cos_t, sin_t, slots, n, n_heads, n_kv_heads, head_dim,
                       row_stride);
}

// e4m3 cache (`--kv-dtype fp8`, slot-group layout in common.cuh): rope_kv_write's rotation, then
// each k and v head of a token with a slot quantized with its own scale (kv_quant_inv /
// kv_quant_scale) into its codes and scale (kv8_codes_at, kv8_scale_at). Without tables (cos_t
// null) nothing is rotated and the q heads are not visited: kv_write for this cache. One warp per
// (token, head), lanes over the pairs (j, j + D/2); grid-stride over warps. caches: num_slots *
// kv_e4m3_row_bytes(KVH, D) bytes; head_dim <= 256.
extern "C" __global__ void rope_kv_write_e4m3(float* __restrict__ qkv, unsigned char* __restrict__ k_cache,
                                              unsigned char* __restrict__ v_cache, const u32* __restrict__ positions,
                                              const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                              const u32* __restrict__ slots, int n, int n_heads, int n_kv_heads,
                                              int head_dim, int row_stride) {
    allow_dependents_early();  // the attention after this may be scheduled
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const int half = head_dim / 2, lane = threadIdx.x & 31;
    const bool rope = cos_t != nullptr;
    const int first = rope ? 0 : n_heads;  // without the rotation only k and v heads have work
    const int heads = n_heads + 2 * n_kv_heads - first;
    const size_t row_bytes = kv_e4m3_row_bytes(n_kv_heads, head_dim);
    const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t w = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5); w < (size_t)n * heads; w += warps) {
        const size_t t = w / heads;
        const int h = first + (int)(w % heads);
        float* x = qkv + t * row_stride + (size_t)h * head_dim;
        const bool rotate = rope && h < n_heads + n_kv_heads;
        float a[4], b[4];  // this lane's pairs j = lane + 32 i
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = lane + 32 * i;
            a[i] = b[i] = 0.f;
            if (j >= half) continue;
            a[i] = x[j];
            b[i] = x[j + half];
            if (rotate) {
                const size_t p = positions[t];
                rotate_pair(a[i], b[i], cos_t[p * half + j], sin_t[p * half + j], &a[i], &b[i]);
                x[j] = a[i];
                x[j + half] = b[i];
            }
            amax = fmaxf(amax, fmaxf(fabsf(a[i]), fabsf(b[i])));
        }
        if (h < n_heads) continue;
        const u32 slot = slots[t];
        if (slot == 0xffffffffu) continue;  // the same for the whole warp
        amax = warp_max(amax);
        const float inv = kv_quant_inv(amax);
        const int kvh = (h - n_heads) % n_kv_heads;
        unsigned char* cache = h < n_heads + n_kv_heads ? k_cache : v_cache;
        unsigned char* codes = cache + kv8_codes_at(slot, kvh, head_dim, row_bytes);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = lane + 32 * i;
            if (j >= half) continue;
            const unsigned short c = f32x2_to_e4m3x2(__fmul_rn(a[i], inv), __fmul_rn(b[i], inv));
            codes[j] = (unsigned char)(c & 0xffu);
            codes[j + half] = (unsigned char)(c >> 8);
        }
        if (lane == 0) *(float*)(cache + kv8_scale_at(slot, kvh, n_kv_heads, head_dim, row_bytes)) = kv_quant_scale(amax);
    }
}
