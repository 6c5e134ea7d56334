// decode_warp_item.cuh: the warp-item form of the tensor-core decode attention
// (paged_decode_attention_mma_warps): one warp takes a whole (kv head, sequence), see the top of
// decode_attention_mma.cu.
//
// Design: the warp streams its context's chunks through its own ring (issue_chunk, attend_chunk),
// makes the newest token's rows itself when the RoPE is fused (warp_fresh_rows: rope_kv_write's
// arithmetic), and ends by normalising and storing its rows (warp_item_store); no barrier, no merge.
//
// The including unit (decode_attention_mma.cu) defines D, G, NWARPS, CHUNK, STAGES, the ring layout
// (STAGE_BYTES, WARP_BYTES, ...) and the helpers used here, before including this file.
#pragma once

// The end of a warp item: this warp's accumulators (rows gid < G: query head kvh * G + gid, dims
// acc_dim) divided by the row sums l, staged as [G][D] f32 in `stage` -- the ring slot of the chunk
// just consumed, which no copy refills before the warp's next issue -- then stored as whole rows:
// out [batch, out_stride] f32, or bf16 rounded as store_act rounds (query head h at h * D).
static_assert(G * D * 4 <= STAGE_BYTES, "a warp item stages its [G][D] f32 output in one ring slot");
__device__ __forceinline__ void warp_item_store(const float (&acc)[D / 8][2], float l, unsigned char* stage, int lane,
                                                void* __restrict__ out, int out_stride, int out_bf16, int seq, int kvh) {
    const int gid = lane >> 2, tig = lane & 3;
    float* o = (float*)stage;  // [G][D] f32
    if (gid < G) {
        const float inv = 1.f / l;  // l >= 1: the first token has weight e^0
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            o[gid * D + acc_dim(nt, tig, 0)] = acc[nt][0] * inv;
            o[gid * D + acc_dim(nt, tig, 1)] = acc[nt][1] * inv;
        }
    }
    __syncwarp();
    const size_t out_base = (size_t)seq * out_stride + (size_t)(kvh * G) * D;  // elements, a multiple of 4
    for (int c = lane; c < G * D / 4; c += 32) {
        const float4 r = ((const float4*)o)[c];
        if (out_bf16)  // four bf16 in one 8-byte store
            ((uint2*)((bf16_t*)out + out_base))[c] =
                make_uint2((u32)f2bf(r.x) | ((u32)f2bf(r.y) << 16), (u32)f2bf(r.z) | ((u32)f2bf(r.w) << 16));
        else
            ((float4*)((float*)out + out_base))[c] = r;
    }
    __syncwarp();  // every lane has read the slot before the next copy into it
}

// The newest token of a warp item, from the raw qkv activation, with the fused RoPE (see
// decode_attention_warp_item): K rotated at position p, V as it is, both rounded for the cache --
// rope_kv_write's arithmetic (rope_kv.cu): bf16, or e4m3 codes with one scale per row
// (kv_quant_inv / kv_quant_scale) -- into the warp's staging (e4m3: fresh_codes [2][D] bytes,
// fresh_scales [2]; bf16: fresh_rows [2][D] bf16), and into the cache at `slot` unless it is
// 0xffffffff. Lane `lane` takes the pairs (j, j + D/2), j = lane + 32 i.
// The CTA form (decode_attention_mma) runs it too, on its warp 0, for the CTA holding the token.
#ifdef KV_FP8
__device__ __forceinline__ void warp_fresh_rows(const float* __restrict__ kr, const float* __restrict__ vr, size_t p,
                                                const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                int lane, unsigned char* fresh_codes, float* fresh_scales, u32 slot,
                                                int kvh, int n_kv_heads, size_t row_bytes, kv_t* __restrict__ k_cache,
                                                kv_t* __restrict__ v_cache) {
    constexpr int PAIRS = (D / 2 + 31) / 32;
#pragma unroll
    for (int kv = 0; kv < 2; kv++) {
        const float* x = kv == 0 ? kr : vr;
        float a[PAIRS], b[PAIRS];
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < PAIRS; i++) {
            const int j = lane + 32 * i;
            a[i] = b[i] = 0.f;
            if (j >= D / 2) continue;
            a[i] = x[j];
            b[i] = x[j + D / 2];
            if (kv == 0) rotate_pair(a[i], b[i], cos_t[p * (D / 2) + j], sin_t[p * (D / 2) + j], &a[i], &b[i]);
            amax = fmaxf(amax, fmaxf(fabsf(a[i]), fabsf(b[i])));
        }
        amax = warp_max(amax);
        const float inv = kv_quant_inv(amax);
#pragma unroll
        for (int i = 0; i < PAIRS; i++) {
            const int j = lane + 32 * i;
            if (j >= D / 2) continue;
            const unsigned short c = f32x2_to_e4m3x2(__fmul_rn(a[i], inv), __fmul_rn(b[i], inv));
            fresh_codes[kv * D + j] = (unsigned char)(c & 0xffu);
            fresh_codes[kv * D + j + D / 2] = (unsigned char)(c >> 8);
        }
        if (lane == 0) fresh_scales[kv] = kv_quant_scale(amax);
    }
    __syncwarp();
    if (slot != 0xffffffffu) {
        const size_t codes_at = kv8_codes_at(slot, kvh, D, row_bytes);
        for (int i = lane; i < 2 * (D / 16); i += 32)
            ((uint4*)((i < D / 16 ? k_cache : v_cache) + codes_at))[i % (D / 16)] = ((const uint4*)fresh_codes)[i];
        if (lane < 2)
            *(float*)((lane == 0 ? k_cache : v_cache) + kv8_scale_at(slot, kvh, n_kv_heads, D, row_bytes)) =
                fresh_scales[lane];
    }
}
#else
__device__ __forceinline__ void warp_fresh_rows(const float* __restrict__ kr, const float* __restrict__ vr, size_t p,
                                                const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                int lane, bf16_t* fresh_rows, u32 slot, size_t row_elems,
                                                size_t head_off, kv_t* __restrict__ k_cache,
                                                kv_t* __restrict__ v_cache) {
    for (int j = lane; j < D / 2; j += 32) {
        float a = kr[j], b = kr[j + D / 2];
        rotate_pair(a, b, cos_t[p * (D / 2) + j], sin_t[p * (D / 2) + j], &a, &b);
        fresh_rows[j] = f2bf(a);
        fresh_rows[j + D / 2] = f2bf(b);
    }
    for (int j = lane; j < D; j += 32) fresh_rows[D + j] = f2bf(vr[j]);
    __syncwarp();
    if (slot != 0xffffffffu) {
        const size_t at = (size_t)slot * row_elems + head_off;
        for (int i = lane; i < 2 * PIECES; i += 32)
            ((uint4*)((i < PIECES ? k_cache : v_cache) + at))[i % PIECES] = ((const uint4*)fresh_rows)[i];
    }
}
#endif

// The warp-item entry point's body (see the top): grid (ceil(n_kv_heads / NWARPS), 1, batch); warp
// w of CTA (x, z) takes kv head x * NWARPS + w (idle past the last head) of sequence z, its whole
// context as one split. Arguments as decode_attention_mma's (part_o, part_ml, counters and
// max_splits are not used). With the fused RoPE (cos_t non-null) the warp rotates its query heads
// as it loads them and makes and writes the newest token's K and V rows itself (warp_fresh_rows):
// no other warp reads that token of this kv head in this step, so no barrier is needed.
__device__ __forceinline__ void decode_attention_warp_item(
    void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,
    kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, const u32* __restrict__ block_tables, int max_blocks,
    const u32* __restrict__ context_lens, int n_kv_heads, int block_size, int split_tokens, float scale,
    const u32* __restrict__ positions, const u32* __restrict__ slots, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t) {
    allow_dependents_early();  // the output projection may start streaming its weights
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.x * NWARPS + warp, seq = blockIdx.z;
    const int ctx = min((int)context_lens[seq], split_tokens);  // the host launches one split
    if (kvh >= n_kv_heads || ctx == 0) return;                  // no barrier follows in this form
    const bool rope = cos_t != nullptr;
    const int fresh = ctx - 1, fresh_chunk = fresh / CHUNK;  // the newest token, and its chunk
    const int n_chunks = (ctx + CHUNK - 1) / CHUNK;
    // ring: [NWARPS][WARP_BYTES], a warp's STAGES slots as in decode_attention_mma.
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* ring_p = smem + warp * WARP_BYTES;
    const u32 ring = (u32)__cvta_generic_to_shared(ring_p);
    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const BlockDiv bdiv = block_div(block_size);
#ifdef KV_FP8
    const size_t row_elems = kv_e4m3_row_bytes(n_kv_heads, D);  // bytes a slot
    __shared__ __align__(16) unsigned char fresh_codes[NWARPS][2 * D];  // a warp's newest K, V codes
    __shared__ float fresh_scales[NWARPS][2];                          // and their scales
#define ISSUE_ARGS_W row_elems, kvh, n_kv_heads
#else
    const size_t row_elems = (size_t)n_kv_heads * D;
    const size_t head_off = (size_t)kvh * D;
    __shared__ __align__(16) bf16_t fresh_rows[NWARPS][2 * D];  // a warp's newest K row, then V row
#define ISSUE_ARGS_W row_elems, head_off
#endif
    const LaneFrag frag = lane_frag(lane);

    // Before the wait (see decode_attention_mma): the first chunks, the newest token left out.
#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < n_chunks)
            issue_chunk(ring + c * STAGE_BYTES, c * CHUNK, lane, ctx, fresh, bt, bdiv, ISSUE_ARGS_W, k_cache, v_cache);
        cp_async_commit();
    }
    wait_for_prerequisites();

    // The newest token's rows: made here (fused RoPE) or copied from the cache, placed into its
    // chunk's slot if that chunk is already in flight (the loop places it otherwise).
    if (rope) {
        const float* kr = q + (size_t)seq * q_stride + (size_t)(n_kv_heads * G + kvh) * D;  // [D] f32
#ifdef KV_FP8
        warp_fresh_rows(kr, kr + (size_t)n_kv_heads * D, positions[seq], cos_t, sin_t, lane, fresh_codes[warp],
                        fresh_scales[warp], slots[seq], kvh, n_kv_heads, row_elems, k_cache, v_cache);
        if (fresh_chunk < STAGES - 1)
            place_fresh8(ring + fresh_chunk * STAGE_BYTES, fresh % CHUNK, lane, fresh_codes[warp], fresh_scales[warp]);
#else
        warp_fresh_rows(kr, kr + (size_t)n_kv_heads * D, positions[seq], cos_t, sin_t, lane, fresh_rows[warp],
                        slots[seq], row_elems, head_off, k_cache, v_cache);
        if (fresh_chunk < STAGES - 1) place_fresh(ring + fresh_chunk * STAGE_BYTES, fresh % CHUNK, lane, fresh_rows[warp]);
#endif
    } else if (fresh_chunk < STAGES - 1) {
        place_fresh_from_cache(ring + fresh_chunk * STAGE_BYTES, fresh % CHUNK, fresh, lane, bt, block_size,
                               ISSUE_ARGS_W, k_cache, v_cache);
    }
    u32 qa[D / 16][2];
    {
        float qf[D / 16][4];
        load_q(q, q_stride, seq, kvh, frag.gid, frag.tig, qf);
        q_operand(qf, frag.gid, frag.tig, scale, rope ? (int)positions[seq] : -1, cos_t, sin_t, qa);
    }
    float acc[D / 8][2];  // O rows gid: dims acc_dim(nt, tig, {0, 1})
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = 0.f;
    float m = -SOV_INF, l = 0.f;  // running max of row gid; this lane's part of its running sum

    for (int c = 0; c < n_chunks; c++) {
        const int next = c + STAGES - 1;
        if (next < n_chunks) {
            // Copies issued after the wait see every token; with the fused RoPE the newest one is
            // still left out (its cache row may not be visible to this warp's copies yet) and
            // placed from the staging.
            issue_chunk(ring + (next % STAGES) * STAGE_BYTES, next * CHUNK, lane, ctx, rope ? fresh : -1, bt, bdiv,
                        ISSUE_ARGS_W, k_cache, v_cache);
            if (rope && next == fresh_chunk)
#ifdef KV_FP8
                place_fresh8(ring + (next % STAGES) * STAGE_BYTES, fresh % CHUNK, lane, fresh_codes[warp],
                             fresh_scales[warp]);
#else
                place_fresh(ring + (next % STAGES) * STAGE_BYTES, fresh % CHUNK, lane, fresh_rows[warp]);
#endif
        }
        cp_async_commit();
        cp_async_wait_stages();
        __syncwarp();  // every lane's copies of this chunk are visible to the whole warp
        const int slot = c % STAGES;
        attend_chunk(frag, ring + slot * STAGE_BYTES, ring_p + slot * STAGE_BYTES, c * CHUNK, ctx, qa, acc, m, l);
        __syncwarp();  // the slot is refilled only after every lane has read it
    }
#undef ISSUE_ARGS_W
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    cp_async_wait_all();  // only empty copy groups can be open here
    warp_item_store(acc, l, ring_p + ((n_chunks - 1) % STAGES) * STAGE_BYTES, lane, out, out_stride, out_bf16, seq,
                    kvh);
}
