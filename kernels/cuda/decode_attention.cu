// decode_attention.cu: paged attention for decode (one new query token per sequence), flash-decoding.
//
// Design: one CTA per (split, kv head, sequence). A split is a contiguous range of `split_tokens`
// context tokens, so long contexts spread over many CTAs (split-K). The GQA_GROUP query heads that
// share a KV head are handled by the same CTA, so each K/V row is read from memory once for all of
// them. Inside a CTA, tiles of 64 tokens: every thread loads its 16-byte chunks of K and V for the
// tile first (many loads in flight), computes scores with a shuffle reduction over the lanes of a
// row, updates an online softmax (running max m and sum l per head), and accumulates P·V in f32.
// With one split the CTA writes the output directly; otherwise it writes an unnormalised partial
// (o, m, l) and the last CTA of the (sequence, kv head) to finish -- found with an atomic counter,
// which it resets for the next launch -- merges the partials. No second kernel launch.
//
// Compile-time: HEAD_DIM (16, 32, 64, 128 or 256) and GQA_GROUP (query heads per KV head, 1..8).
// Cache layout per layer: [num_blocks, block_size, n_kv_heads, HEAD_DIM] bf16.
#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef GQA_GROUP
#error "GQA_GROUP must be defined"
#endif

#define D HEAD_DIM
#define G GQA_GROUP
#define NTHREADS 128
#define TILE 64                  // tokens per tile
#define LPT (D / 8)              // lanes per token row (each lane holds 8 dims = 16 bytes)
#define ROWS (NTHREADS / LPT)    // token rows processed in parallel by the CTA
#define NSTEP (TILE / ROWS)      // token rows per thread per tile

// out: [batch, out_stride] f32, query head h at h * D.  q: [batch, q_stride] f32 likewise (the q part
// of a fused qkv row). block_tables: [batch, max_blocks] u32. context_lens: [batch] u32 (0 = skip).
// part_o: [batch, n_kv_heads, max_splits, G, D] f32; part_ml: [batch, n_kv_heads, max_splits, G, 2] f32;
// counters: [batch, n_kv_heads] u32, zero before the first launch (each launch leaves them zero).
// Grid: (max_splits, n_kv_heads, batch), block: NTHREADS.
extern "C" __global__ void __launch_bounds__(NTHREADS)
paged_decode_attention(float* __restrict__ out, int out_stride, const float* __restrict__ q, int q_stride,
                       const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,
                       const u32* __restrict__ block_tables, int max_blocks,
                       const u32* __restrict__ context_lens, float* __restrict__ part_o,
                       float* __restrict__ part_ml, u32* __restrict__ counters, int n_kv_heads,
                       int block_size, int split_tokens, int max_splits, float scale) {
    const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
    const int ctx = (int)context_lens[seq];
    const int n_splits = (ctx + split_tokens - 1) / split_tokens;
    if (split >= n_splits) return;
    const int t_begin = split * split_tokens;
    const int t_end = min(ctx, t_begin + split_tokens);

    __shared__ float q_s[G][D];
    __shared__ float p_s[G][TILE];
    __shared__ float m_s[G], l_s[G], alpha_s[G];
    __shared__ float red[ROWS][G][D];
    __shared__ int is_last;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = tid / LPT, sub = tid % LPT;

    for (int i = tid; i < G * D; i += NTHREADS) {
        const int g = i / D, d = i % D;
        q_s[g][d] = q[(size_t)seq * q_stride + (size_t)(kvh * G + g) * D + d] * scale;
    }
    if (tid < G) {
        m_s[tid] = -SOV_INF;
        l_s[tid] = 0.f;
    }
    __syncthreads();

    float qr[G][8], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            qr[g][j] = q_s[g][sub * 8 + j];
            acc[g][j] = 0.f;
        }

    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const size_t row_elems = (size_t)n_kv_heads * D;
    const size_t head_off = (size_t)kvh * D + sub * 8;

    for (int t0 = t_begin; t0 < t_end; t0 += TILE) {
        uint4 kreg[NSTEP], vreg[NSTEP];
#pragma unroll
        for (int s = 0; s < NSTEP; s++) {
            const int t = t0 + s * ROWS + row;
            if (t < t_end) {
                const size_t blk = bt[t / block_size];
                const size_t base = ((size_t)blk * block_size + (t % block_size)) * row_elems + head_off;
                kreg[s] = *(const uint4*)(k_cache + base);
                vreg[s] = *(const uint4*)(v_cache + base);
            } else {
                kreg[s] = make_uint4(0, 0, 0, 0);
                vreg[s] = make_uint4(0, 0, 0, 0);
            }
        }
        // Scores for the tile: p_s[g][local token] = q_g . k_t (scale already in q).
#pragma unroll
        for (int s = 0; s < NSTEP; s++) {
            float kf[8];
            unpack8(kreg[s], kf);
            const int t_local = s * ROWS + row;
            const bool valid = t0 + t_local < t_end;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) dot = fmaf(qr[g][j], kf[j], dot);
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (sub == 0) p_s[g][t_local] = valid ? dot : -SOV_INF;
            }
        }
        __syncthreads();
        // Online softmax update, one warp per head.
        for (int g = warp; g < G; g += NTHREADS / 32) {
            const float v0 = p_s[g][lane], v1 = p_s[g][lane + 32];
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
            const float e0 = __expf(v0 - m_new), e1 = __expf(v1 - m_new);
            p_s[g][lane] = e0;
            p_s[g][lane + 32] = e1;
            const float sum = warp_sum(e0 + e1);
            if (lane == 0) {
                const float alpha = __expf(m_old - m_new);
                alpha_s[g] = alpha;
                l_s[g] = l_s[g] * alpha + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float a = alpha_s[g];
#pragma unroll
            for (int j = 0; j < 8; j++) acc[g][j] *= a;
        }
#pragma unroll
        for (int s = 0; s < NSTEP; s++) {
            float vf[8];
            unpack8(vreg[s], vf);
            const int t_local = s * ROWS + row;
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = p_s[g][t_local];
#pragma unroll
                for (int j = 0; j < 8; j++) acc[g][j] = fmaf(p, vf[j], acc[g][j]);
            }
        }
        __syncthreads();
    }

    // Reduce the ROWS partial accumulators of the CTA.
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int j = 0; j < 8; j++) red[row][g][sub * 8 + j] = acc[g][j];
    __syncthreads();

    const size_t part_base = ((size_t)seq * n_kv_heads + kvh) * max_splits;
    for (int i = tid; i < G * D; i += NTHREADS) {
        const int g = i / D, d = i % D;
        float o = 0.f;
        for (int r = 0; r < ROWS; r++) o += red[r][g][d];
        if (n_splits == 1) {
            out[(size_t)seq * out_stride + (size_t)(kvh * G + g) * D + d] = o / l_s[g];
        } else {
            part_o[((part_base + split) * G + g) * D + d] = o;
        }
    }
    if (n_splits == 1) return;
    if (tid < G) {
        part_ml[((part_base + split) * G + tid) * 2] = m_s[tid];
        part_ml[((part_base + split) * G + tid) * 2 + 1] = l_s[tid];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const u32 prev = atomicAdd(&counters[(size_t)seq * n_kv_heads + kvh], 1u);
        is_last = prev == (u32)(n_splits - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();

    // Merge the partials of all splits: o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
    for (int i = tid; i < G * D; i += NTHREADS) {
        const int g = i / D, d = i % D;
        float M = -SOV_INF;
        for (int s = 0; s < n_splits; s++) M = fmaxf(M, __ldcg(&part_ml[((part_base + s) * G + g) * 2]));
        float num = 0.f, den = 0.f;
        for (int s = 0; s < n_splits; s++) {
            const float w = __expf(__ldcg(&part_ml[((part_base + s) * G + g) * 2]) - M);
            den += w * __ldcg(&part_ml[((part_base + s) * G + g) * 2 + 1]);
            num += w * __ldcg(&part_o[((part_base + s) * G + g) * D + d]);
        }
        out[(size_t)seq * out_stride + (size_t)(kvh * G + g) * D + d] = num / den;
    }
    if (tid == 0) counters[(size_t)seq * n_kv_heads + kvh] = 0;
}
