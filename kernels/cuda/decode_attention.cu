// decode_attention.cu: paged attention for decode (one new query token per sequence), flash-decoding.
//
// Design: one CTA per (split, kv head, sequence). A split is a contiguous range of `split_tokens`
// context tokens, so long contexts spread over many CTAs (split-K). The GQA_GROUP query heads that
// share a KV head are handled by the same CTA, so each K/V row is read from memory once for all of
// them. Inside a CTA the four warps work independently (no block barrier in the main loop): a warp
// takes chunks of tokens, every lane first loads its 16-byte pieces of K and V for the chunk (many
// loads in flight), computes scores with a shuffle reduction over the lanes of a token row, updates
// its own online softmax (running max m and sum l per head) and accumulates P·V in f32 registers.
// The warps' states are merged through shared memory at the end, and the splits of a sequence are
// merged by the last CTA to finish (decode_merge.cuh, shared with the tensor-core kernel in
// decode_attention_mma.cu, which the host prefers for bf16 caches with GQA).
//
// Compile-time: HEAD_DIM (16, 32, 64, 128 or 256), GQA_GROUP (query heads per KV head, 1..8) and
// KV_F32 (f32 cache, precise mode). Cache layout per layer: [num_blocks, block_size, n_kv_heads,
// HEAD_DIM] of bf16 (or f32). Loading: with a bf16 cache and GQA_GROUP * HEAD_DIM <= 512 (Llama-3:
// 4 x 128) each warp streams its chunks through a private ring of STAGES slots in shared memory with
// cp.async, STAGES - 1 chunks in flight without holding registers (measured fastest on the H200 at
// batch >= 64; kernels/bench/logs). Otherwise, or with REG_LOADS, K/V go straight into registers;
// PREFETCH then issues the next chunk's loads before this chunk is computed. WSTEPS (token-row
// steps per chunk) and MIN_BLOCKS (occupancy hint) tune either path.
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
#define NWARPS (NTHREADS / 32)
#define LPT (D / 8)              // lanes per token row (each lane holds 8 dims = 16 bytes)
#define TPW (32 / LPT)           // token rows per warp step
#if !defined(REG_LOADS) && !defined(KV_F32) && HEAD_DIM * GQA_GROUP <= 512 && GQA_GROUP <= 4
#define USE_CP_ASYNC 1
#ifndef STAGES
#define STAGES 3                 // chunks per warp in the cp.async ring (STAGES - 1 in flight)
#endif
#ifndef WSTEPS
#define WSTEPS 2
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 4
#endif
#endif
#ifndef WSTEPS
#define WSTEPS 4                 // steps per warp chunk
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1             // __launch_bounds__ occupancy hint
#endif
#define WCHUNK (TPW * WSTEPS)    // tokens per warp chunk
#include "decode_merge.cuh"

// Loads the K and V pieces of one warp chunk starting at token t0 (zeros past t_end).
__device__ __forceinline__ void load_chunk(kv8* kreg, kv8* vreg, int t0, int row, int t_end,
                                           const u32* __restrict__ bt, int block_size, size_t row_elems,
                                           size_t head_off, const kv_t* __restrict__ k_cache,
                                           const kv_t* __restrict__ v_cache) {
#pragma unroll
    for (int s = 0; s < WSTEPS; s++) {
        const int t = t0 + s * TPW + row;
        if (t < t_end) {
            const size_t blk = bt[t / block_size];
            const size_t base = (blk * block_size + (t % block_size)) * row_elems + head_off;
            kreg[s] = kv8_load(k_cache + base);
            vreg[s] = kv8_load(v_cache + base);
        } else {
            kreg[s] = kv8_zero();
            vreg[s] = kv8_zero();
        }
    }
}

#ifdef USE_CP_ASYNC
// 16-byte asynchronous copy global -> shared (zero-filled when !valid; nothing is read then).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    const int src_size = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_stages() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
}

// Issues the copies of one warp chunk starting at token t0 into ring slot (ks, vs): every lane copies
// the same 16-byte pieces it later reads back, so no synchronisation beyond its own wait is needed.
__device__ __forceinline__ void issue_chunk(uint4* ks, uint4* vs, int t0, int row, int lane, int t_end,
                                            const u32* __restrict__ bt, int block_size, size_t row_elems,
                                            size_t head_off, const kv_t* __restrict__ k_cache,
                                            const kv_t* __restrict__ v_cache) {
#pragma unroll
    for (int s = 0; s < WSTEPS; s++) {
        const int t = t0 + s * TPW + row;
        const bool valid = t < t_end;
        size_t base = 0;
        if (valid) {
            const size_t blk = bt[t / block_size];
            base = (blk * block_size + (t % block_size)) * row_elems + head_off;
        }
        cp_async16(&ks[s * 32 + lane], k_cache + base, valid);
        cp_async16(&vs[s * 32 + lane], v_cache + base, valid);
    }
}
#endif

// out: [batch, out_stride] f32, or bf16 when out_bf16 (store_act), query head h at h * D.  q: [batch, q_stride] f32 likewise (the q part
// of a fused qkv row). block_tables: [batch, max_blocks] u32. context_lens: [batch] u32 (0 = skip).
// part_o: [batch, n_kv_heads, max_splits, G, D] f32; part_ml: [batch, n_kv_heads, max_splits, G, 2] f32;
// counters: [batch, n_kv_heads] u32, zero before the first launch (each launch leaves them zero).
// Grid: (max_splits, n_kv_heads, batch), block: NTHREADS.
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
paged_decode_attention(void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,
                       const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                       const u32* __restrict__ block_tables, int max_blocks,
                       const u32* __restrict__ context_lens, float* __restrict__ part_o,
                       float* __restrict__ part_ml, u32* __restrict__ counters, int n_kv_heads,
                       int block_size, int split_tokens, int max_splits, float scale) {
    allow_dependents_early();  // the output projection's GEMV may start streaming its weights
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    const DecodeWork work = decode_work(context_lens, split_tokens);
    if (!work.active) return;
    const int split = work.split, kvh = work.kvh, seq = work.seq, n_splits = work.n_splits;
    const int t_begin = work.t_begin, t_end = work.t_end;

    __shared__ float w_m[NWARPS][G], w_l[NWARPS][G];
    __shared__ float w_acc[NWARPS][G][D];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = lane / LPT, sub = lane % LPT;

    float qr[G][8], acc[G][8], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float4* qp = (const float4*)(q + (size_t)seq * q_stride + (size_t)(kvh * G + g) * D + sub * 8);
        const float4 a = qp[0], b = qp[1];
        qr[g][0] = a.x * scale; qr[g][1] = a.y * scale; qr[g][2] = a.z * scale; qr[g][3] = a.w * scale;
        qr[g][4] = b.x * scale; qr[g][5] = b.y * scale; qr[g][6] = b.z * scale; qr[g][7] = b.w * scale;
        m[g] = -SOV_INF;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[g][j] = 0.f;
    }

    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const size_t row_elems = (size_t)n_kv_heads * D;
    const size_t head_off = (size_t)kvh * D + sub * 8;

#ifdef USE_CP_ASYNC
    // Each warp streams its chunks through a private ring of STAGES slots in shared memory.
    __shared__ __align__(16) uint4 ring_k[NWARPS][STAGES][WSTEPS * 32];
    __shared__ __align__(16) uint4 ring_v[NWARPS][STAGES][WSTEPS * 32];
    const int first = t_begin + warp * WCHUNK;
    const int my_chunks = first < t_end ? (t_end - first + NWARPS * WCHUNK - 1) / (NWARPS * WCHUNK) : 0;
#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < my_chunks)
            issue_chunk(ring_k[warp][c], ring_v[warp][c], first + c * NWARPS * WCHUNK, row, lane, t_end, bt,
                        block_size, row_elems, head_off, k_cache, v_cache);
        cp_async_commit();
    }
    for (int c = 0; c < my_chunks; c++) {
        const int t0 = first + c * NWARPS * WCHUNK;
        const int next = c + STAGES - 1;
        if (next < my_chunks)
            issue_chunk(ring_k[warp][next % STAGES], ring_v[warp][next % STAGES], first + next * NWARPS * WCHUNK,
                        row, lane, t_end, bt, block_size, row_elems, head_off, k_cache, v_cache);
        cp_async_commit();
        cp_async_wait_stages();
        kv8 kreg[WSTEPS], vreg[WSTEPS];
#pragma unroll
        for (int s = 0; s < WSTEPS; s++) {
            kreg[s] = ring_k[warp][c % STAGES][s * 32 + lane];
            vreg[s] = ring_v[warp][c % STAGES][s * 32 + lane];
        }
#else
#ifdef PREFETCH
    // Software pipelining: the next chunk's loads are in flight while this chunk is computed.
    kv8 knext[WSTEPS], vnext[WSTEPS];
    load_chunk(knext, vnext, t_begin + warp * WCHUNK, row, t_end, bt, block_size, row_elems, head_off,
               k_cache, v_cache);
#endif
    for (int t0 = t_begin + warp * WCHUNK; t0 < t_end; t0 += NWARPS * WCHUNK) {
        kv8 kreg[WSTEPS], vreg[WSTEPS];
#ifdef PREFETCH
#pragma unroll
        for (int s = 0; s < WSTEPS; s++) {
            kreg[s] = knext[s];
            vreg[s] = vnext[s];
        }
        load_chunk(knext, vnext, t0 + NWARPS * WCHUNK, row, t_end, bt, block_size, row_elems, head_off,
                   k_cache, v_cache);
#else
        load_chunk(kreg, vreg, t0, row, t_end, bt, block_size, row_elems, head_off, k_cache, v_cache);
#endif
#endif
        // Scores: every lane of a token row ends with the full dot product.
        float sc[WSTEPS][G];
#pragma unroll
        for (int s = 0; s < WSTEPS; s++) {
            float kf[8];
            kv8_unpack(kreg[s], kf);
            const bool valid = t0 + s * TPW + row < t_end;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) dot = fmaf(qr[g][j], kf[j], dot);
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                sc[s][g] = valid ? dot : -SOV_INF;
            }
        }
        // Online softmax over the chunk (the warp's token rows: xor over lane bits >= LPT).
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = sc[0][g];
#pragma unroll
            for (int s = 1; s < WSTEPS; s++) mx = fmaxf(mx, sc[s][g]);
#pragma unroll
            for (int o = 16; o >= LPT; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m[g], mx);  // finite: the chunk's first token is valid
            const float alpha = __expf(m[g] - m_new);
            float ps = 0.f;
#pragma unroll
            for (int s = 0; s < WSTEPS; s++) {
                sc[s][g] = __expf(sc[s][g] - m_new);
                ps += sc[s][g];
            }
#pragma unroll
            for (int o = 16; o >= LPT; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[g] = l[g] * alpha + ps;
            m[g] = m_new;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[g][j] *= alpha;
        }
#pragma unroll
        for (int s = 0; s < WSTEPS; s++) {
            float vf[8];
            kv8_unpack(vreg[s], vf);
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[g][j] = fmaf(sc[s][g], vf[j], acc[g][j]);
        }
    }

    // Sum the warp's token rows, then merge the warps through shared memory.
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int o = 16; o >= LPT; o >>= 1) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], o);
    if (lane < LPT) {
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int j = 0; j < 8; j++) w_acc[warp][g][sub * 8 + j] = acc[g][j];
    }
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            w_m[warp][g] = m[g];
            w_l[warp][g] = l[g];
        }
    }
    __syncthreads();
    decode_finish(&w_m[0][0], &w_l[0][0], &w_acc[0][0][0], out, out_stride, out_bf16, part_o, part_ml, counters, seq, kvh,
                  n_kv_heads, split, n_splits, max_splits);
}
