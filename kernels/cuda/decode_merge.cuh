// decode_merge.cuh: the end of a paged decode-attention CTA, shared by both decode kernels
// (decode_attention.cu on CUDA cores, decode_attention_mma.cu on tensor cores).
//
// Design: every warp of the CTA leaves an online-softmax state in shared memory (running max m,
// running sum l and the unnormalised P·V accumulator of each of the GQA_GROUP query heads). The CTA
// merges those states. With one split it writes the normalised output directly; otherwise it writes
// an unnormalised partial (o, m, l), and the last CTA of the (sequence, kv head) to finish -- found
// with an atomic counter, which it resets for the next launch -- merges the partials of all splits
// with all its threads (flash-decoding's reduction without a second kernel launch).
//
// The including unit defines D (head dim), G (query heads per KV head), NTHREADS and NWARPS.
#pragma once

#define MAX_SPLITS 256  // the host never plans more splits

// What one CTA of a decode launch covers: grid (split, kv head, sequence); tokens [t_begin, t_end)
// of the sequence's context, cut into n_splits splits of split_tokens. `active` is false for a CTA
// past its sequence's last split (it returns at once). context_lens: [batch] u32.
struct DecodeWork {
    int split, kvh, seq, n_splits, t_begin, t_end;
    bool active;
};
__device__ __forceinline__ DecodeWork decode_work(const u32* __restrict__ context_lens, int split_tokens) {
    DecodeWork w;
    w.split = blockIdx.x;
    w.kvh = blockIdx.y;
    w.seq = blockIdx.z;
    const int ctx = (int)context_lens[w.seq];
    w.n_splits = (ctx + split_tokens - 1) / split_tokens;
    w.active = w.split < w.n_splits;
    w.t_begin = w.split * split_tokens;
    w.t_end = min(ctx, w.t_begin + split_tokens);
    return w;
}

// w_m, w_l: [NWARPS][G] f32 and w_acc: [NWARPS][G][D] f32 in shared memory, complete (a barrier
// passed) before the call; a warp that saw no token leaves m = -inf, l = 0, acc = 0.
// out: [batch, out_stride] f32, or bf16 when out_bf16 (query head h at h * D; store_act). part_o: [batch, n_kv_heads, max_splits, G, D]
// f32; part_ml: [batch, n_kv_heads, max_splits, G, 2] f32; counters: [batch, n_kv_heads] u32.
// Every thread of the CTA calls this.
__device__ __forceinline__ void decode_finish(const float* w_m, const float* w_l, const float* w_acc,
                                              void* __restrict__ out, int out_stride, int out_bf16,
                                              float* __restrict__ part_o, float* __restrict__ part_ml,
                                              u32* __restrict__ counters, int seq, int kvh, int n_kv_heads,
                                              int split, int n_splits, int max_splits) {
    __shared__ float s_m[G], s_l[G];
    __shared__ int is_last;
    const int tid = threadIdx.x;
    if (tid < G) {
        float M = -SOV_INF;
        for (int w = 0; w < NWARPS; w++) M = fmaxf(M, w_m[w * G + tid]);
        float L = 0.f;
        for (int w = 0; w < NWARPS; w++)
            L += w_m[w * G + tid] == -SOV_INF ? 0.f : __expf(w_m[w * G + tid] - M) * w_l[w * G + tid];
        s_m[tid] = M;
        s_l[tid] = L;
    }
    __syncthreads();

    const size_t part_base = ((size_t)seq * n_kv_heads + kvh) * max_splits;
    for (int i = tid; i < G * D; i += NTHREADS) {
        const int g = i / D, d = i % D;
        const float M = s_m[g];
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; w++)
            if (w_m[w * G + g] != -SOV_INF) o += __expf(w_m[w * G + g] - M) * w_acc[(w * G + g) * D + d];
        if (n_splits == 1) {
            store_act(out, out_bf16, (size_t)seq * out_stride + (size_t)(kvh * G + g) * D + d, o / s_l[g]);
        } else {
            part_o[((part_base + split) * G + g) * D + d] = o;
        }
    }
    if (n_splits == 1) return;
    if (tid < G) {
        part_ml[((part_base + split) * G + tid) * 2] = s_m[tid];
        part_ml[((part_base + split) * G + tid) * 2 + 1] = s_l[tid];
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

    // Merge the partials of all splits: o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s. The merge
    // is a chain of L2 round trips on the launch's critical path (every other CTA is done), so each
    // pass keeps as many loads in flight as it can: (m, l) of every split in one pass, then each
    // thread streams one float4 column of o over the splits, MERGE_BATCH loads at a time (16: 9.9 us
    // a call at (1, 4096) in a replayed graph, 8: 10.2; decode-attention-merge-*-2026-11-30*.log).
    __shared__ float sp_w[MAX_SPLITS][G], sp_l[MAX_SPLITS][G];
    // (m, l) of every split, and the weights e^(m_s - M) and sum L of each head: warp w reduces heads
    // w, w + NWARPS, ..., its lanes taking splits lane, lane + 32, ... (one load each for up to 32
    // splits; the maximum and the sum are warp shuffles, not a serial loop over the splits).
    const float2* ml = (const float2*)part_ml;  // [.., max_splits, G] of (m, l)
    const int lane = tid & 31, warp = tid >> 5;
    for (int g = warp; g < G; g += NWARPS) {
        float M = -SOV_INF;
        for (int s = lane; s < n_splits; s += 32) {
            const float2 v = __ldcg(&ml[(part_base + s) * G + g]);
            sp_w[s][g] = v.x;
            sp_l[s][g] = v.y;
            M = fmaxf(M, v.x);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0.f;
        for (int s = lane; s < n_splits; s += 32) {
            const float w = __expf(sp_w[s][g] - M);
            sp_w[s][g] = w;
            L += w * sp_l[s][g];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        if (lane == 0) s_l[g] = L;
    }
    __syncthreads();
#ifndef MERGE_BATCH
#define MERGE_BATCH 16
#endif
    const float4* po4 = (const float4*)(part_o + part_base * G * D);  // [max_splits, G * D / 4]
    const size_t out_base = (size_t)seq * out_stride + (size_t)(kvh * G) * D;  // elements, a multiple of 4
    for (int c = tid; c < G * D / 4; c += NTHREADS) {
        const int g = c / (D / 4);
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < n_splits; s0 += MERGE_BATCH) {
            float4 v[MERGE_BATCH];
#pragma unroll
            for (int j = 0; j < MERGE_BATCH; j++)
                v[j] = s0 + j < n_splits ? __ldcg(&po4[(size_t)(s0 + j) * (G * D / 4) + c]) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < MERGE_BATCH; j++) {
                const float w = s0 + j < n_splits ? sp_w[s0 + j][g] : 0.f;
                num.x += w * v[j].x;
                num.y += w * v[j].y;
                num.z += w * v[j].z;
                num.w += w * v[j].w;
            }
        }
        const float L = s_l[g];
        const float4 r = make_float4(num.x / L, num.y / L, num.z / L, num.w / L);
        if (out_bf16)  // four bf16 in one 8-byte store, rounded as store_act rounds
            ((uint2*)((bf16_t*)out + out_base))[c] =
                make_uint2((u32)f2bf(r.x) | ((u32)f2bf(r.y) << 16), (u32)f2bf(r.z) | ((u32)f2bf(r.w) << 16));
        else
            ((float4*)((float*)out + out_base))[c] = r;
    }
    if (tid == 0) counters[(size_t)seq * n_kv_heads + kvh] = 0;
}
