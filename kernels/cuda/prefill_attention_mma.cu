// prefill_attention_mma.cu: causal attention of prompt chunks (and of decode rows mixed with them)
// over the paged KV cache, on tensor cores: the grid, arguments and results of prefill_attention.cu,
// with mma.sync m16n8k16 (bf16 in, f32 accumulate) in place of f32 FMAs (FlashAttention-2's loop).
//
// Design: one CTA per (query tile, kv head, sequence); a query tile holds QT = 64 / GQA_GROUP
// consecutive new tokens of one sequence and the GQA_GROUP query heads of the kv head: R <= 64
// rows, row r = token r / G, head r % G. Each of the 4 warps owns 16 rows as the A operand of its
// mmas (Q in registers, scaled then rounded to bf16 as the decode kernels round it). The CTA walks
// the keys visible to the tile, [0, key_end), in stages of KCH tokens: every thread copies a share
// of the stage's K and V rows (16-byte pieces through the block table, swizzled as mma_tiles.cuh
// says) with cp.async, the next stage in flight while the current one is used; each warp then runs
// the stage's 16-token sub-tiles it can see:
//   S [16 rows x 16 tokens] = Q . K^T   -- K^T from ldmatrix, D/16 k-steps for each of 2 n-tiles;
//   causal mask by absolute position, online softmax along each row (4 lanes hold a row's 16);
//   O [16 rows x D] += P . V            -- P from S's accumulators (bf16), V from ldmatrix.trans.
// Rows past the tile (R < 64, or the chunk's last tile) have q_pos -1: fully masked, never stored.
// A decode row (a one-token chunk) is a tile of one token: only warp 0 has a row, the others copy.
//
// An e4m3 cache (-DKV_FP8, layout in common.cuh): a stage holds the keys' codes (unswizzled) and
// per-token scales; once it has landed the CTA widens the codes to f16 into one swizzled stage of
// its own (widen_rows) and the loop runs as above on f16 operands, each score multiplied by its
// key's K scale and each P by its key's V scale before P is packed (decode_attention_mma.cu alike).
//
// Compile-time: HEAD_DIM (64, 128 or 256), GQA_GROUP (1..8), a bf16 or (KV_FP8) e4m3 cache.
// Dynamic shared memory: 2 stages of STAGE_BYTES, and with KV_FP8 one widened stage
// (sov_kernels::prefill_mma_shared_bytes).
#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef GQA_GROUP
#error "GQA_GROUP must be defined"
#endif
#if HEAD_DIM != 64 && HEAD_DIM != 128 && HEAD_DIM != 256
#error "the tensor-core prefill kernel needs HEAD_DIM 64, 128 or 256"
#endif
#ifdef KV_F32
#error "the tensor-core prefill kernel reads a bf16 or e4m3 cache"
#endif

#define D HEAD_DIM
#define G GQA_GROUP
#define NTHREADS 128
#define QT (64 / G)             // query tokens per tile
#define R (QT * G)              // query rows per tile (<= 64)
#define KCH 32                  // keys per stage
#define PIECES (D / 8)          // 16-byte pieces per K or V row
#define SLOT_BYTES (KCH * D * 2)
#include "mma_tiles.cuh"
#ifdef KV_FP8
#define CODE_BYTES (KCH * D)                          // e4m3 codes of the stage's K (or V) rows
#define STAGE_BYTES (2 * CODE_BYTES + 2 * KCH * 4)    // K codes, V codes, K scales, V scales
#define WIDE_OFF (2 * STAGE_BYTES)                    // the stage in use, widened: [2][KCH, D] f16
#else
#define STAGE_BYTES (2 * SLOT_BYTES)                  // K then V tile, bf16, swizzled
#endif

__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// c[0..3] += A . B over one 16x8 tile (f32 accumulate): a[0..3] the A fragment (rows gid, gid + 8
// x columns tig*2.., 8 + tig*2..), b0, b1 the B fragment.
__device__ __forceinline__ void mma_16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The K and V rows of keys k0 .. k0 + KCH - 1 into the stage at shared address `stage` (K tile, then
// V tile); keys at or past key_end are zero-filled without being read. Every thread of the CTA
// copies its share of pieces.
#ifndef KV_FP8
__device__ __forceinline__ void issue_stage(u32 stage, int k0, int key_end, int tid, const u32* __restrict__ bt,
                                            int block_size, size_t row_elems, size_t head_off,
                                            const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache) {
    for (int i = tid; i < KCH * PIECES; i += NTHREADS) {
        const int tok = i / PIECES, piece = i % PIECES;
        const int t = k0 + tok;
        const bool valid = t < key_end;
        size_t at = 0;
        if (valid) at = ((size_t)bt[t / block_size] * block_size + t % block_size) * row_elems + head_off + piece * 8;
        const u32 so = stage + slot_offset(tok, piece);
        cp_async16(so, k_cache + at, valid);
        cp_async16(so + SLOT_BYTES, v_cache + at, valid);
    }
}
#else
// e4m3: codes (key row tok at stage + tok * D, V codes CODE_BYTES on) and scales (K at stage +
// 2 * CODE_BYTES + tok * 4, V KCH * 4 on), each token's through its slot (kv8_codes_at,
// kv8_scale_at: common.cuh's slot-group layout). row_bytes: kv_e4m3_row_bytes.
__device__ __forceinline__ void issue_stage(u32 stage, int k0, int key_end, int tid, const u32* __restrict__ bt,
                                            int block_size, size_t row_bytes, int kvh, int n_kv_heads,
                                            const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache) {
    for (int i = tid; i < KCH * (D / 16); i += NTHREADS) {
        const int tok = i / (D / 16), piece = i % (D / 16);
        const int t = k0 + tok;
        const bool valid = t < key_end;
        size_t at = 0;
        if (valid) {
            const size_t slot = (size_t)bt[t / block_size] * block_size + t % block_size;
            at = kv8_codes_at(slot, kvh, D, row_bytes) + piece * 16;
        }
        const u32 so = stage + (u32)(tok * D + piece * 16);
        cp_async16(so, k_cache + at, valid);
        cp_async16(so + CODE_BYTES, v_cache + at, valid);
    }
    if (tid < 2 * KCH) {
        const int tok = tid % KCH, t = k0 + tok;
        const bool valid = t < key_end;
        size_t at = 0;
        if (valid) {
            const size_t slot = (size_t)bt[t / block_size] * block_size + t % block_size;
            at = kv8_scale_at(slot, kvh, n_kv_heads, D, row_bytes);
        }
        cp_async4(stage + 2 * CODE_BYTES + (u32)(tid * 4), (tid < KCH ? k_cache : v_cache) + at, valid);
    }
}
#endif

// out: [n_tokens, out_stride] f32, or bf16 when out_bf16 (store_act), query head h at h * D; q:
// [n_tokens, q_stride] f32 likewise (the q part of a fused qkv row); q_starts: [n_seqs + 1] u32 first
// token row of each sequence's chunk; ctx_lens: [n_seqs] u32 context length after the step (the
// chunk is the last n_new positions); block_tables: [n_seqs, max_blocks] u32; the chunk's own K/V
// already in the cache. Grid: (ceil(max_q_len / QT), n_kv_heads, n_seqs), block: NTHREADS; a CTA
// whose query tile lies beyond its sequence's chunk exits at once.
extern "C" __global__ void __launch_bounds__(NTHREADS)
prefill_attention_mma(void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,
                      const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                      const u32* __restrict__ block_tables, int max_blocks, const u32* __restrict__ q_starts,
                      const u32* __restrict__ ctx_lens, int n_kv_heads, int block_size, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];  // [2 stages][STAGE_BYTES] (+ widened stage)
    const int kvh = blockIdx.y, seq = blockIdx.z;
    const int q0 = blockIdx.x * QT;
    const int tok0 = (int)q_starts[seq];
    const int n_new = (int)q_starts[seq + 1] - tok0;
    if (q0 >= n_new) return;
    const int n_q = min(QT, n_new - q0);
    const int pos0 = (int)ctx_lens[seq] - n_new + q0;  // absolute position of the tile's first query
    const int key_end = pos0 + n_q;                    // keys [0, key_end) are visible to some row
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group
    const u32 ring = (u32)__cvta_generic_to_shared(smem);
    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const size_t head_off = (size_t)kvh * D;
#ifdef KV_FP8
    const size_t row_elems = kv_e4m3_row_bytes(n_kv_heads, D);  // bytes a slot
#define ISSUE_ARGS row_elems, kvh, n_kv_heads
#else
    const size_t row_elems = (size_t)n_kv_heads * D;
#define ISSUE_ARGS row_elems, head_off
#endif

    // This lane's rows of the warp's 16: h = 0 is row gid, h = 1 row gid + 8.
    int q_pos[2];     // absolute position of the row's query, -1 for a row past the tile
    size_t q_row[2];  // element offset of the row's query head in q (and its output in out, with out_stride)
    size_t o_row[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rg = warp * 16 + gid + h * 8;
        const int qi = rg / G, g = rg % G;
        const bool valid = rg < R && qi < n_q;
        q_pos[h] = valid ? pos0 + qi : -1;
        q_row[h] = valid ? (size_t)(tok0 + q0 + qi) * q_stride + (size_t)(kvh * G + g) * D : 0;
        o_row[h] = valid ? (size_t)(tok0 + q0 + qi) * out_stride + (size_t)(kvh * G + g) * D : 0;
    }
    // The last key any row of this warp sees (-1: the warp has no row).
    const int warp_rows_end = min(warp * 16 + 16, R);
    const int warp_last_q = min((warp_rows_end - 1) / G, n_q - 1);
    const int warp_key_last = warp * 16 < R && (warp * 16) / G < n_q ? pos0 + warp_last_q : -1;

    const int n_stages = (key_end + KCH - 1) / KCH;
    issue_stage(ring, 0, key_end, tid, bt, block_size, ISSUE_ARGS, k_cache, v_cache);
    cp_async_commit();

    // Q as the A operand, scaled then rounded to bf16, loaded while the first stage is in flight.
    u32 qa[D / 16][4];  // [k-step][a0..a3]: rows gid / gid + 8 x dims ks*16 + tig*2.. / + 8..
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float f[4] = {0.f, 0.f, 0.f, 0.f};
            if (q_pos[h] >= 0) {
                const float* qp = q + q_row[h] + ks * 16 + tig * 2;
                f[0] = qp[0];
                f[1] = qp[1];
                f[2] = qp[8];
                f[3] = qp[9];
            }
            qa[ks][h] = pack_ab(f[0] * scale, f[1] * scale);
            qa[ks][2 + h] = pack_ab(f[2] * scale, f[3] * scale);
        }
    }
    float acc[D / 8][4];  // O: rows gid (0, 1) and gid + 8 (2, 3), dims nt * 8 + tig * 2 + {0, 1}
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    float m[2] = {-SOV_INF, -SOV_INF};  // running max of each row
    float l[2] = {0.f, 0.f};            // this lane's part of each row's running sum

    // ldmatrix row addresses, as in decode_attention_mma.cu: this lane names row (lane & 7) of
    // matrix (lane >> 3). K matrices are tokens 0-7 / 8-15 (mat >> 1) x pieces 2k / 2k + 1 (mat & 1);
    // V matrices are tokens 0-7 / 8-15 (mat & 1) x pieces 2n / 2n + 1 (mat >> 1).
    const int mat = lane >> 3, mrow = lane & 7;
    const int k_tok = (mat >> 1) * 8 + mrow, v_tok = (mat & 1) * 8 + mrow;
    const u32 k_row = (u32)(k_tok * D * 2), v_row = (u32)(v_tok * D * 2);
    const int k_swz = (mat & 1) ^ (k_tok & 7), v_swz = (mat >> 1) ^ (v_tok & 7);

    for (int c = 0; c < n_stages; c++) {
        if (c + 1 < n_stages)
            issue_stage(ring + ((c + 1) & 1) * STAGE_BYTES, (c + 1) * KCH, key_end, tid, bt, block_size, ISSUE_ARGS,
                        k_cache, v_cache);
        cp_async_commit();
        cp_async_wait_one();  // this thread's copies of stage c have landed
        __syncthreads();      // and everyone's
#ifdef KV_FP8
        const u32 codes = ring + (c & 1) * STAGE_BYTES;
        const u32 stage = ring + WIDE_OFF;
        widen_rows(codes, stage, 2 * KCH, tid, NTHREADS);  // K rows then V rows: CODE_BYTES = KCH rows apart
        __syncthreads();
#else
        const u32 stage = ring + (c & 1) * STAGE_BYTES;
#endif
#pragma unroll
        for (int sub = 0; sub < KCH / 16; sub++) {
            const int t0 = c * KCH + sub * 16;
            if (t0 > warp_key_last) break;  // no row of this warp sees these keys (warp-uniform)
            const u32 ks = stage + (u32)(sub * 16 * D * 2);
            const u32 vs = ks + SLOT_BYTES;
            float s[2][4];  // n-tile (tokens 0-7 | 8-15) x (row gid: tig*2 + {0, 1}; row gid + 8: same)
#pragma unroll
            for (int n = 0; n < 2; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kstep = 0; kstep < D / 16; kstep++) {
                u32 b[4];
                ldsm_x4(b, ks + k_row + (((kstep * 2) ^ k_swz) << 4));
                mma_16816(s[0], qa[kstep], b[0], b[1]);
                mma_16816(s[1], qa[kstep], b[2], b[3]);
            }
#ifdef KV_FP8
            // The scales of this lane's keys sub * 16 + n * 8 + tig * 2 + (j & 1).
            float v_sc[2][2];
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const u32 at = codes + 2 * CODE_BYTES + (u32)((sub * 16 + n * 8 + tig * 2 + e) * 4);
                    const float k_sc = ld_shared_f32(at);
                    v_sc[n][e] = ld_shared_f32(at + KCH * 4);
                    s[n][e] *= k_sc;
                    s[n][2 + e] *= k_sc;
                }
#endif
            // Causal mask and online softmax, per row (a row's 16 scores live in the 4 lanes of a quad).
            float mx[2] = {-SOV_INF, -SOV_INF};
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int h = j >> 1;
                    if (t0 + n * 8 + tig * 2 + (j & 1) > q_pos[h]) s[n][j] = -SOV_INF;
                    mx[h] = fmaxf(mx[h], s[n][j]);
                }
            float alpha[2], m_new[2], ps[2] = {0.f, 0.f};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                m_new[h] = fmaxf(m[h], mx[h]);
                // A row that sees no key yet keeps m = -inf: guard the exponentials.
                alpha[h] = m_new[h] == -SOV_INF ? 1.f : __expf(m[h] - m_new[h]);
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int h = j >> 1;
                    s[n][j] = m_new[h] == -SOV_INF ? 0.f : __expf(s[n][j] - m_new[h]);
                    ps[h] += s[n][j];
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                l[h] = l[h] * alpha[h] + ps[h];
                m[h] = m_new[h];
            }
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                acc[nt][0] *= alpha[0];
                acc[nt][1] *= alpha[0];
                acc[nt][2] *= alpha[1];
                acc[nt][3] *= alpha[1];
            }
            // O += P . V: P's A fragment is S's accumulators of the two n-tiles, rounded to bf16.
#ifdef KV_FP8
            const u32 pa[4] = {pack_ab(s[0][0] * v_sc[0][0], s[0][1] * v_sc[0][1]),
                               pack_ab(s[0][2] * v_sc[0][0], s[0][3] * v_sc[0][1]),
                               pack_ab(s[1][0] * v_sc[1][0], s[1][1] * v_sc[1][1]),
                               pack_ab(s[1][2] * v_sc[1][0], s[1][3] * v_sc[1][1])};
#else
            const u32 pa[4] = {pack_ab(s[0][0], s[0][1]), pack_ab(s[0][2], s[0][3]),
                               pack_ab(s[1][0], s[1][1]), pack_ab(s[1][2], s[1][3])};
#endif
#pragma unroll
            for (int np = 0; np < D / 16; np++) {
                // Matrices: tokens 0-7 / 8-15 (mat & 1) x dims (2 np + (mat >> 1)) * 8 + 0-7, transposed.
                u32 b[4];
                ldsm_x4_trans(b, vs + v_row + (((np * 2) ^ v_swz) << 4));
                mma_16816(acc[2 * np], pa, b[0], b[1]);
                mma_16816(acc[2 * np + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // the stage is refilled (two iterations on) only after every warp has read it
    }
    cp_async_wait_all();

#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        if (q_pos[h] < 0) continue;
        const float inv = 1.f / l[h];
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            const size_t o = o_row[h] + nt * 8 + tig * 2;
            store_act(out, out_bf16, o, acc[nt][2 * h] * inv);
            store_act(out, out_bf16, o + 1, acc[nt][2 * h + 1] * inv);
        }
    }
}
