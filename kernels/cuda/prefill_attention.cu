// prefill_attention.cu: causal attention for prompt chunks over the paged KV cache, flash-attention
// style (tiled, online softmax, nothing of size n^2 in memory), several sequences of different
// lengths in one launch.
//
// Design: one CTA per (query tile, kv head). A query tile holds QT consecutive new tokens of one
// sequence and the GQA_GROUP query heads of the kv head: R = QT * GQA_GROUP <= 64 rows, so each K/V
// tile loaded into shared memory serves all query heads of the group. Key tiles of 32 tokens are read
// through the sequence's block table (the chunk's own K/V must already be written to the cache), the
// scores of a row are split over a thread pair, masked causally by absolute position, and folded into
// a running max / sum per row; the pair then accumulates its half of the row's output in registers.
// The query chunk of sequence s covers absolute positions start_pos[s] .. start_pos[s] + n_new - 1,
// so a chunk continuing an earlier prefix (chunked prefill) is handled by the same kernel.
//
// Compile-time: HEAD_DIM (multiple of 8, <= 256), GQA_GROUP (1..8) and KV_F32 (f32 cache). Dynamic shared memory:
// (64 + 2 * 32) * (HEAD_DIM + 4) * 4 + 64 * 33 * 4 bytes (opt-in above 48 KiB).
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
#define QT (64 / G)          // query tokens per tile
#define R (QT * G)           // query rows per tile (<= 64)
#define KT 32                // keys per tile
#define DS (D + 4)           // padded row stride of the f32 tiles in shared memory
#define HALF (D / 2)         // output dims per thread of a pair

// out: [n_tokens, out_stride] f32, or bf16 when out_bf16 (store_act), query head h at h * D; q: [n_tokens, q_stride] f32 likewise (the q
// part of a fused qkv row). q_starts: [n_seqs + 1] u32 first token row of each sequence's chunk;
// ctx_lens: [n_seqs] u32 context length after the step (the chunk is the last n_new positions);
// block_tables: [n_seqs, max_blocks] u32. Grid: (ceil(max_q_len / QT), n_kv_heads, n_seqs), block:
// NTHREADS; a CTA whose query tile lies beyond its sequence's chunk exits at once.
extern "C" __global__ void __launch_bounds__(NTHREADS)
prefill_attention(void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,
                  const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                  const u32* __restrict__ block_tables, int max_blocks, const u32* __restrict__ q_starts,
                  const u32* __restrict__ ctx_lens, int n_kv_heads, int block_size, float scale) {
    extern __shared__ float smem[];
    float* q_s = smem;                 // [R][DS]
    float* k_s = q_s + 64 * DS;        // [KT][DS]
    float* v_s = k_s + KT * DS;        // [KT][DS]
    float* p_s = v_s + KT * DS;        // [64][KT + 1]

    const int kvh = blockIdx.y, seq = blockIdx.z;
    const int q0 = blockIdx.x * QT;
    const int tok0 = (int)q_starts[seq];
    const int n_new = (int)q_starts[seq + 1] - tok0;
    if (q0 >= n_new) return;
    const int n_q = min(QT, n_new - q0);
    const int pos0 = (int)ctx_lens[seq] - n_new + q0;  // absolute position of the tile's first query
    const int key_end = pos0 + n_q;                // keys [0, key_end) are visible to some row
    const int tid = threadIdx.x;

    // Load Q (scaled) for rows r = qi * G + g.
    for (int i = tid; i < R * (D / 8); i += NTHREADS) {
        const int r = i / (D / 8), c = i % (D / 8);
        const int qi = r / G, g = r % G;
        float f[8];
        if (qi < n_q) {
            const float4* src = (const float4*)(q + (size_t)(tok0 + q0 + qi) * q_stride + (size_t)(kvh * G + g) * D + c * 8);
            const float4 a = src[0], b = src[1];
            f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
            f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) q_s[r * DS + c * 8 + j] = f[j] * scale;
    }

    const int r = tid >> 1, half = tid & 1;            // this thread's row and half
    const bool row_valid = r < R && (r / G) < n_q;
    const int q_pos = pos0 + r / G;                     // absolute position of this row's query
    float m = -SOV_INF, l = 0.f;
    float acc[HALF];
#pragma unroll
    for (int j = 0; j < HALF; j++) acc[j] = 0.f;

    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const size_t row_elems = (size_t)n_kv_heads * D;

    for (int k0 = 0; k0 < key_end; k0 += KT) {
        __syncthreads();  // previous tile fully consumed (and Q written, first time)
        for (int i = tid; i < KT * (D / 8); i += NTHREADS) {
            const int kk = i / (D / 8), c = i % (D / 8);
            const int t = k0 + kk;
            float kf[8], vf[8];
            if (t < key_end) {
                const size_t blk = bt[t / block_size];
                const size_t base = ((size_t)blk * block_size + (t % block_size)) * row_elems + (size_t)kvh * D + c * 8;
                kv8_unpack(kv8_load(k_cache + base), kf);
                kv8_unpack(kv8_load(v_cache + base), vf);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) kf[j] = vf[j] = 0.f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                k_s[kk * DS + c * 8 + j] = kf[j];
                v_s[kk * DS + c * 8 + j] = vf[j];
            }
        }
        __syncthreads();

        // Scores of row r against keys half*16 .. half*16+15.
        float s[KT / 2];
#pragma unroll
        for (int kk = 0; kk < KT / 2; kk++) s[kk] = 0.f;
        if (r < R) {
            for (int d = 0; d < D; d += 4) {
                const float4 qv = *(const float4*)(q_s + r * DS + d);
#pragma unroll
                for (int kk = 0; kk < KT / 2; kk++) {
                    const float4 kv = *(const float4*)(k_s + (half * (KT / 2) + kk) * DS + d);
                    s[kk] = fmaf(qv.x, kv.x, fmaf(qv.y, kv.y, fmaf(qv.z, kv.z, fmaf(qv.w, kv.w, s[kk]))));
                }
            }
        }
        float tile_max = -SOV_INF;
#pragma unroll
        for (int kk = 0; kk < KT / 2; kk++) {
            const int t = k0 + half * (KT / 2) + kk;
            if (!row_valid || t > q_pos) s[kk] = -SOV_INF;
            tile_max = fmaxf(tile_max, s[kk]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        const float m_new = fmaxf(m, tile_max);
        // A row with no visible key yet in this tile keeps m = -inf; guard the exponentials.
        const float alpha = m_new == -SOV_INF ? 1.f : __expf(m - m_new);
        float psum = 0.f;
#pragma unroll
        for (int kk = 0; kk < KT / 2; kk++) {
            const float p = m_new == -SOV_INF ? 0.f : __expf(s[kk] - m_new);
            psum += p;
            if (r < 64) p_s[r * (KT + 1) + half * (KT / 2) + kk] = p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * alpha + psum;
        m = m_new;
        __syncwarp();  // p_s row written by the pair, read by the pair only

#pragma unroll
        for (int j = 0; j < HALF; j++) acc[j] *= alpha;
        if (r < R) {
            for (int kk = 0; kk < KT; kk++) {
                const float p = p_s[r * (KT + 1) + kk];
                const float* vrow = v_s + kk * DS + half * HALF;
#pragma unroll
                for (int j = 0; j < HALF; j += 4) {
                    const float4 vv = *(const float4*)(vrow + j);
                    acc[j] = fmaf(p, vv.x, acc[j]);
                    acc[j + 1] = fmaf(p, vv.y, acc[j + 1]);
                    acc[j + 2] = fmaf(p, vv.z, acc[j + 2]);
                    acc[j + 3] = fmaf(p, vv.w, acc[j + 3]);
                }
            }
        }
    }

    if (row_valid) {
        const int qi = r / G, g = r % G;
        const size_t o = (size_t)(tok0 + q0 + qi) * out_stride + (size_t)(kvh * G + g) * D + half * HALF;
        const float inv = 1.f / l;
#pragma unroll
        for (int j = 0; j < HALF; j++) store_act(out, out_bf16, o + j, acc[j] * inv);
    }
}
