// decode_attention_mma.cu: paged decode attention (one new query token per sequence) on tensor cores.
//
// Design: the grid and the split-K contract are those of decode_attention.cu -- one CTA per (split,
// kv head, sequence), four independent warps, the warps' states and the splits merged by
// decode_merge.cuh -- but the arithmetic runs on mma.sync m16n8k16 (bf16 in, f32 accumulate), as
// FlashInfer does for grouped-query decode. On CUDA cores the shuffles, bf16 unpacking and FMAs of
// the GQA_GROUP dot products cost about as much issue time as streaming the KV bytes; on tensor
// cores they are a few instructions per 16 tokens, so the loop is bound by the KV stream.
//
// A warp takes chunks of 16 tokens. Its lanes copy the chunk's K and V rows (16-byte pieces, each
// token row contiguous) into a private ring of STAGES slots in shared memory with cp.async, STAGES
// - 1 chunks in flight; a piece lands at column (piece ^ (token & 7)) so that ldmatrix reads 8 rows
// without bank conflicts (mma_tiles.cuh). Per chunk:
//   S [16 heads x 16 tokens] = Q [16 x D] . K^T  -- Q in registers as the A operand (query heads
//       0..G-1 in rows 0..G-1, zero rows above), K^T from ldmatrix as the B operand, D/16 k-steps
//       for each of 2 n-tiles of 8 tokens;
//   online softmax along each row (a row is spread over the 4 lanes of a quad: 2 shuffles);
//   O [16 heads x D] += P [16 x 16 tokens] . V -- P re-used from S's accumulator registers as the A
//       operand (bf16), V from ldmatrix.trans as the B operand, one mma per 8 output dims.
// Rows G..15 of S and O are padding: their A rows are zero, their accumulators are never kept.
//
// Launched with programmatic dependent launch, a CTA issues its first chunks' copies before it waits
// for the kernel before it: every token but each sequence's newest is already in the cache, so only
// that one token's rows are placed after the wait (from the cache, or computed here with the fused
// RoPE + KV write, see decode_attention_mma() below). The CTA form has two entry points, so the host
// can give grids of at most one CTA per SM their own shared-memory carveout (attention.rs); warp
// items (below) are the third.
//
// An e4m3 cache (-DKV_FP8, layout in common.cuh): a ring slot holds the chunk's codes ([2][CHUNK, D]
// bytes, K rows at k8_offset, V rows at v8_offset: 16-byte pieces at swizzled columns) and its
// per-token scales ([2][CHUNK] f32), and the mma operands are f16, widened from the codes in
// registers (cvt.f16x2.e4m3x2), never written back to shared memory. K: a lane reads 4 consecutive
// codes of a token -- dims ks * 16 + tig * 4 .. + 3 of k-step ks -- as its B fragment, so the
// k-step's 16 dims are taken in a permuted order, and Q's A fragment is loaded in the same order
// (the dot product does not depend on it). V: the B fragment of P.V needs one dim of 4 tokens, which
// are 4 different rows; a lane reads 4 bytes (dims 4 gid .. + 3 of a group of 32) of each of its 4
// tokens (2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9: P's columns in its A fragment) and transposes the
// 4 x 4 bytes with byte permutes, so n-tile j of a group holds dims 4 n + j: the output dims are
// permuted within each group of 32 (acc_dim) and put back in order when the warps' states are
// stored. Each score is multiplied by its token's K scale and each P by its token's V scale before
// P is packed. The fused write quantizes the newest token's rows with rope_kv_write_e4m3's
// arithmetic (kv_quant_inv, kv_quant_scale), so the cache holds the same bytes.
//
// Warp items (the third entry point, paged_decode_attention_mma_warps): at wide grids -- many
// sequences, one split each -- each warp takes a whole (kv head, sequence) on its own instead of
// sharing it with its CTA's other warps: a CTA is NWARPS kv heads of one sequence. A warp then
// streams 4x the chunks for one start-up (Q loads, the first chunk's latency) and one end, and
// needs no merge of warp states: it normalises its accumulators and stores the rows itself. The
// chunks are visited in order by one warp, so the sums round differently from the CTA form; the
// host uses this form only outside deterministic mode, with one split. The fused RoPE + KV write
// needs no barrier here: the warp that reads a (sequence, kv head) is the only one that needs its
// newest token, so it rotates and writes that token itself (decode_attention_warp_item).
//
// Compile-time: HEAD_DIM (64, 128 or 256), GQA_GROUP (1..8), a bf16 or (KV_FP8) e4m3 cache; STAGES
// (ring depth, default 2) and MIN_BLOCKS (occupancy hint). Dynamic shared memory: NWARPS *
// WARP_BYTES (sov_kernels::decode_mma_shared_bytes).
#include "common.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef GQA_GROUP
#error "GQA_GROUP must be defined"
#endif
#if HEAD_DIM != 64 && HEAD_DIM != 128 && HEAD_DIM != 256
#error "the tensor-core decode kernel needs HEAD_DIM 64, 128 or 256"
#endif
#ifdef KV_F32
#error "the tensor-core decode kernel reads a bf16 or e4m3 cache"
#endif

#define D HEAD_DIM
#define G GQA_GROUP
#define NTHREADS 128
#define NWARPS (NTHREADS / 32)
#define CHUNK 16                         // tokens per warp chunk: the mma's k (P.V) and 2 n-tiles (Q.K^T)
#define PIECES (D / 8)                   // 16-byte pieces per K or V row
#define PIECES_PER_LANE (CHUNK * PIECES / 32)
#define SLOT (CHUNK * D)                 // bf16 elements of K (or V) per ring slot
#ifndef STAGES
#define STAGES 2
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2
#endif
#include "decode_merge.cuh"

#define SLOT_BYTES (SLOT * 2)
#include "mma_tiles.cuh"

#ifdef KV_FP8
#define CODE_BYTES (CHUNK * D)                              // e4m3 codes of K (or V) of a chunk
#define STAGE_BYTES (2 * CODE_BYTES + 2 * CHUNK * 4)        // K codes, V codes, K scales, V scales
#define WARP_BYTES (STAGES * STAGE_BYTES)
#define PIECES8 (D / 16)                                    // 16-byte pieces of codes per K or V row
#define SWZ8 ((PIECES8 < 8 ? PIECES8 : 8) - 1)
// Byte offset of 16-byte piece `piece` of K codes row `tok` in a staged chunk: swizzled so that
// the 8 tokens a k-step's loads touch (rows gid, or gid + 8) fall into different banks.
__device__ __forceinline__ u32 k8_offset(int tok, int piece) {
    return (u32)(tok * D + ((piece ^ (tok & SWZ8)) << 4));
}
// The same for V codes row `tok` (from the V codes' start): the 4 tokens 2 tig + r (tig = 0..3) of
// one of P.V's loads land in different banks.
__device__ __forceinline__ u32 v8_offset(int tok, int piece) {
    return (u32)(tok * D + ((piece ^ ((((tok >> 1) & 3) << 1) & SWZ8)) << 4));
}
// The output dim of accumulator column e (0, 1) of n-tile nt for the lane in quad position tig.
__device__ __forceinline__ int acc_dim(int nt, int tig, int e) { return (nt >> 2) * 32 + 4 * (tig * 2 + e) + (nt & 3); }
#else
#define STAGE_BYTES (2 * SLOT_BYTES)                        // K then V tile, bf16, swizzled
#define WARP_BYTES (STAGES * STAGE_BYTES)
__device__ __forceinline__ int acc_dim(int nt, int tig, int e) { return nt * 8 + tig * 2 + e; }
#endif

__device__ __forceinline__ void cp_async_wait_stages() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
}

// c[0..1] += A . B for the rows groupID of a 16x8 tile (f32 accumulate). A's rows groupID + 8 are
// zero, so the tile's other two accumulators stay zero and are dropped. a_lo / a_hi: columns
// tig*2.. and 8 + tig*2.. of row groupID; b0, b1: the B fragment.
__device__ __forceinline__ void mma_top_rows(float* c, u32 a_lo, u32 a_hi, u32 b0, u32 b1) {
    float drop0, drop1;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(drop0), "=f"(drop1)
        : "r"(a_lo), "r"(0u), "r"(a_hi), "r"(0u), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(0.f), "f"(0.f));
}

// Token t's cache block and offset in it without an integer division (one compiles to about 35
// instructions on sm_90, paid once a chunk): the block size's f32 reciprocal gives the quotient to
// within one for any t < 2^24, and one correction step makes it exact.
struct BlockDiv {
    int size;
    float inv;  // 1 / size
};
__device__ __forceinline__ BlockDiv block_div(int block_size) { return {block_size, __frcp_rn((float)block_size)}; }
__device__ __forceinline__ void split_token(int t, BlockDiv d, int& blk, int& off) {
    blk = __float2int_rz((float)t * d.inv);
    off = t - blk * d.size;
    if (off >= d.size) {
        blk++;
        off -= d.size;
    } else if (off < 0) {
        blk--;
        off += d.size;
    }
}

// Copies the K and V rows of the warp chunk starting at token t0 into the ring slot at shared
// address ks (K) and ks + SLOT_BYTES (V); pieces of tokens at or past t_end are zero-filled without
// being read; the token `skip` (-1: none) is left alone, neither read nor zero-filled. Lane `lane`
// copies piece lane % PIECES of tokens lane / PIECES + i * TOK_STEP. When the chunk lies inside one
// cache block one block-table entry serves all its tokens (and when every token is valid and none
// left out, its copies take no per-row tests); otherwise each token looks its block up. (Chunks
// start at multiples of 16 because splits start at multiples of the host's 64-token tile, so with
// block sizes that are multiples of 16 the single-block path is always taken.)
#define TOK_STEP (32 / PIECES)
#ifndef KV_FP8
__device__ __forceinline__ void issue_chunk(u32 ks, int t0, int lane, int t_end, int skip,
                                            const u32* __restrict__ bt, BlockDiv bdiv, size_t row_elems,
                                            size_t head_off, const bf16_t* __restrict__ k_cache,
                                            const bf16_t* __restrict__ v_cache) {
    const int tok0 = lane / PIECES, piece = lane % PIECES;
    const int block_size = bdiv.size;
    int blk, off;
    split_token(t0, bdiv, blk, off);
    if (off + CHUNK <= block_size) {
        const size_t base = ((size_t)bt[blk] * block_size + off + tok0) * row_elems + head_off + piece * 8;
        const bf16_t* kp = k_cache + base;
        const bf16_t* vp = v_cache + base;
        const size_t step = (size_t)TOK_STEP * row_elems;
        if (t0 + CHUNK <= t_end && (skip < t0 || skip >= t0 + CHUNK)) {  // every row, none left out
#pragma unroll
            for (int i = 0; i < PIECES_PER_LANE; i++) {
                const u32 so = ks + slot_offset(tok0 + i * TOK_STEP, piece);
                cp_async16(so, kp + i * step, true);
                cp_async16(so + SLOT_BYTES, vp + i * step, true);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < PIECES_PER_LANE; i++) {
            const int tok = tok0 + i * TOK_STEP;
            const bool valid = t0 + tok < t_end;
            const u32 so = ks + slot_offset(tok, piece);
            if (t0 + tok != skip) {
                cp_async16(so, valid ? kp : k_cache, valid);
                cp_async16(so + SLOT_BYTES, valid ? vp : v_cache, valid);
            }
            kp += step;
            vp += step;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < PIECES_PER_LANE; i++) {
        const int tok = tok0 + i * TOK_STEP;
        const int t = t0 + tok;
        if (t == skip) continue;
        const bool valid = t < t_end;
        size_t at = 0;
        if (valid) at = ((size_t)bt[t / block_size] * block_size + (t % block_size)) * row_elems + head_off + piece * 8;
        cp_async16(ks + slot_offset(tok, piece), k_cache + at, valid);
        cp_async16(ks + SLOT_BYTES + slot_offset(tok, piece), v_cache + at, valid);
    }
}
#else
// e4m3 cache: the chunk's codes (K row tok at st + k8_offset(tok, .), V row tok at st + CODE_BYTES
// + v8_offset(tok, .)) and scales (K at st + 2 * CODE_BYTES + tok * 4, V CHUNK * 4 on), the same
// tokens zero-filled or left alone as above. Lane `lane` copies piece lane % PIECES8 of tokens
// lane / PIECES8 + i * TOK_STEP8, and the K (lanes < 16) or V scale of token lane % 16. When the
// chunk's 16 slots are one slot group (common.cuh; always, the block size being a multiple of 16
// and the chunk starting at a multiple of 16), the head's codes of the chunk are one contiguous
// 16 * D run and its scales 64 bytes: one block lookup for the chunk. row_bytes: kv_e4m3_row_bytes.
#define TOK_STEP8 (32 / PIECES8)
__device__ __forceinline__ void issue_chunk(u32 st, int t0, int lane, int t_end, int skip,
                                            const u32* __restrict__ bt, BlockDiv bdiv, size_t row_bytes,
                                            int kvh, int n_kv_heads, const kv_t* __restrict__ k_cache,
                                            const kv_t* __restrict__ v_cache) {
    const int tok0 = lane / PIECES8, piece = lane % PIECES8;
    const int block_size = bdiv.size;
    int blk, off;
    split_token(t0, bdiv, blk, off);
    const int stok = lane & (CHUNK - 1), st_ = t0 + stok;
    const u32 s_dst = st + 2 * CODE_BYTES + (u32)((lane >> 4) * CHUNK * 4 + stok * 4);
    const kv_t* s_cache = lane < 16 ? k_cache : v_cache;
    if (off + CHUNK <= block_size && off % KV8_GROUP == 0) {
        const size_t slot0 = (size_t)bt[blk] * block_size + off;
        const size_t at0 = kv8_codes_at(slot0, kvh, D, row_bytes) + (size_t)lane * 16;  // piece lane of the run
        if (t0 + CHUNK <= t_end && (skip < t0 || skip >= t0 + CHUNK)) {  // every token, none left out
#pragma unroll
            for (int i = 0; i < CHUNK * PIECES8 / 32; i++) {
                const int tok = tok0 + i * TOK_STEP8;
                cp_async16(st + k8_offset(tok, piece), k_cache + at0 + i * 512, true);
                cp_async16(st + CODE_BYTES + v8_offset(tok, piece), v_cache + at0 + i * 512, true);
            }
            cp_async4(s_dst, s_cache + kv8_scale_at(slot0, kvh, n_kv_heads, D, row_bytes) + (size_t)stok * 4, true);
            return;
        }
#pragma unroll
        for (int i = 0; i < CHUNK * PIECES8 / 32; i++) {
            const int tok = tok0 + i * TOK_STEP8;
            const bool valid = t0 + tok < t_end;
            const size_t at = valid ? at0 + (size_t)i * 512 : 0;
            if (t0 + tok != skip) {
                cp_async16(st + k8_offset(tok, piece), k_cache + at, valid);
                cp_async16(st + CODE_BYTES + v8_offset(tok, piece), v_cache + at, valid);
            }
        }
        if (st_ != skip) {
            const bool valid = st_ < t_end;
            const size_t at = valid ? kv8_scale_at(slot0, kvh, n_kv_heads, D, row_bytes) + (size_t)stok * 4 : 0;
            cp_async4(s_dst, s_cache + at, valid);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < CHUNK * PIECES8 / 32; i++) {
        const int tok = tok0 + i * TOK_STEP8;
        const int t = t0 + tok;
        if (t == skip) continue;
        const bool valid = t < t_end;
        size_t at = 0;
        if (valid) {
            const size_t slot = (size_t)bt[t / block_size] * block_size + t % block_size;
            at = kv8_codes_at(slot, kvh, D, row_bytes) + piece * 16;
        }
        cp_async16(st + k8_offset(tok, piece), k_cache + at, valid);
        cp_async16(st + CODE_BYTES + v8_offset(tok, piece), v_cache + at, valid);
    }
    if (st_ != skip) {
        const bool valid = st_ < t_end;
        size_t at = 0;
        if (valid) {
            const size_t slot = (size_t)bt[st_ / block_size] * block_size + st_ % block_size;
            at = kv8_scale_at(slot, kvh, n_kv_heads, D, row_bytes);
        }
        cp_async4(s_dst, s_cache + at, valid);
    }
}
#endif

// The newest token's K and V rows (fresh: [2][D] bf16 in shared memory) into row `tok` of the ring
// slot at ks, where issue_chunk left them out. Lanes < PIECES copy one piece each.
__device__ __forceinline__ void place_fresh(u32 ks, int tok, int lane, const bf16_t* fresh) {
    for (int piece = lane; piece < PIECES; piece += 32) {
        const u32 so = ks + slot_offset(tok, piece);
        st_shared16(so, ((const uint4*)fresh)[piece]);
        st_shared16(so + SLOT_BYTES, ((const uint4*)(fresh + D))[piece]);
    }
}
#ifdef KV_FP8
// e4m3: the newest token's codes (fresh: [2][D] bytes, K then V) and scales (fresh_s: [2]) into
// row `tok` of the staged chunk at st.
__device__ __forceinline__ void place_fresh8(u32 st, int tok, int lane, const unsigned char* fresh,
                                             const float* fresh_s) {
    for (int i = lane; i < 2 * (D / 16); i += 32) {
        const int kv = i / (D / 16), piece = i % (D / 16);
        const u32 at = kv == 0 ? k8_offset(tok, piece) : CODE_BYTES + v8_offset(tok, piece);
        st_shared16(st + at, ((const uint4*)(fresh + kv * D))[piece]);
    }
    if (lane < 2) {
        const u32 at = st + 2 * CODE_BYTES + (u32)(lane * CHUNK * 4 + tok * 4);
        const float v = fresh_s[lane];
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(v) : "memory");
    }
}

#endif

// The newest token `fresh` of a sequence (block table bt), which a chunk issued before the wait
// left out, copied from the cache (written by the kernel before) into row `tok` of the ring slot
// at st. Arguments after block_size as issue_chunk's.
#ifdef KV_FP8
__device__ __forceinline__ void place_fresh_from_cache(u32 st, int tok, int fresh, int lane, const u32* __restrict__ bt,
                                                       int block_size, size_t row_bytes, int kvh, int n_kv_heads,
                                                       const kv_t* __restrict__ k_cache,
                                                       const kv_t* __restrict__ v_cache) {
    const size_t slot = (size_t)bt[fresh / block_size] * block_size + fresh % block_size;
    const size_t codes_at = kv8_codes_at(slot, kvh, D, row_bytes);
    for (int i = lane; i < 2 * (D / 16); i += 32) {
        const int piece = i % (D / 16);
        const kv_t* src = (i < D / 16 ? k_cache : v_cache) + codes_at;
        const u32 so = i < D / 16 ? k8_offset(tok, piece) : CODE_BYTES + v8_offset(tok, piece);
        st_shared16(st + so, __ldcg((const uint4*)src + piece));
    }
    if (lane < 2) {
        const float sc = __ldcg(
            (const float*)((lane == 0 ? k_cache : v_cache) + kv8_scale_at(slot, kvh, n_kv_heads, D, row_bytes)));
        const u32 so = st + 2 * CODE_BYTES + (u32)(lane * CHUNK * 4 + tok * 4);
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(so), "f"(sc) : "memory");
    }
}
#else
__device__ __forceinline__ void place_fresh_from_cache(u32 ks, int tok, int fresh, int lane, const u32* __restrict__ bt,
                                                       int block_size, size_t row_elems, size_t head_off,
                                                       const bf16_t* __restrict__ k_cache,
                                                       const bf16_t* __restrict__ v_cache) {
    const size_t at = ((size_t)bt[fresh / block_size] * block_size + fresh % block_size) * row_elems + head_off;
    for (int piece = lane; piece < PIECES; piece += 32) {
        st_shared16(ks + slot_offset(tok, piece), __ldcg((const uint4*)(k_cache + at) + piece));
        st_shared16(ks + SLOT_BYTES + slot_offset(tok, piece), __ldcg((const uint4*)(v_cache + at) + piece));
    }
}
#endif

// A lane's fixed coordinates: its row group and place in the group in the mma fragments, and (bf16
// cache) its ldmatrix row addresses. The lane names row (lane & 7) of matrix (lane >> 3). K matrices
// are tokens 0-7 / 8-15 (mat >> 1) x pieces 2k / 2k + 1 (mat & 1); V matrices are tokens 0-7 / 8-15
// (mat & 1) x pieces 2n / 2n + 1 (mat >> 1). Piece 2k + b lands at (2k + b) ^ (tok & 7), which is
// 2k ^ (b ^ (tok & 7)) since 2k has no low bit: one XOR per step with a per-lane constant.
struct LaneFrag {
    int gid, tig;
#ifndef KV_FP8
    u32 k_row, v_row;  // byte offsets of the lane's K and V rows in a slot
    int k_swz, v_swz;
#endif
};
__device__ __forceinline__ LaneFrag lane_frag(int lane) {
    LaneFrag f;
    f.gid = lane >> 2;
    f.tig = lane & 3;
#ifndef KV_FP8
    const int mat = lane >> 3, mrow = lane & 7;
    const int k_tok = (mat >> 1) * 8 + mrow, v_tok = (mat & 1) * 8 + mrow;
    f.k_row = (u32)(k_tok * D * 2);
    f.v_row = (u32)(v_tok * D * 2);
    f.k_swz = (mat & 1) ^ (k_tok & 7);
    f.v_swz = (mat >> 1) ^ (v_tok & 7);
#endif
    return f;
}

// One warp chunk: S = Q . K^T over the 16 tokens from t0 staged at ring slot `slot` (shared address;
// `stp` is the same slot as a generic pointer), tokens at or past t_end masked; the online softmax;
// O += P . V. qa: Q as the A operand; acc, m, l: this lane's running state (see the caller).
__device__ __forceinline__ void attend_chunk(const LaneFrag& f, u32 slot, const unsigned char* stp, int t0, int t_end,
                                             const u32 (&qa)[D / 16][2], float (&acc)[D / 8][2], float& m, float& l) {
    const int gid = f.gid, tig = f.tig;
#ifdef KV_FP8
    (void)slot;
    // The scales of this lane's tokens n * 8 + tig * 2 + j: k_sc for the scores, v_sc for P.
    float k_sc[2][2], v_sc[2][2];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float* sc = (const float*)(stp + 2 * CODE_BYTES) + n * 8 + tig * 2 + j;
            k_sc[n][j] = sc[0];
            v_sc[n][j] = sc[CHUNK];
        }
#else
    (void)stp;
    const u32 ks = slot, vs = slot + SLOT_BYTES;
#endif

    // S = Q . K^T: s[n][j] is row gid, token n * 8 + tig * 2 + j of the chunk.
    float s[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int kstep = 0; kstep < D / 16; kstep++) {
#ifdef KV_FP8
        // Codes of tokens gid and gid + 8, dims kstep * 16 + tig * 4 .. + 3, widened.
        const u32 w0 = *(const u32*)(stp + k8_offset(gid, kstep) + tig * 4);
        const u32 w1 = *(const u32*)(stp + k8_offset(gid + 8, kstep) + tig * 4);
        const u32 b[4] = {e4m3x2_to_f16x2((unsigned short)(w0 & 0xffffu)), e4m3x2_to_f16x2((unsigned short)(w0 >> 16)),
                          e4m3x2_to_f16x2((unsigned short)(w1 & 0xffffu)), e4m3x2_to_f16x2((unsigned short)(w1 >> 16))};
#else
        // Matrices: tokens 0-7 / 8-15 (mat >> 1) x dims kstep*16 + 0-7 / 8-15 (mat & 1).
        u32 b[4];
        ldsm_x4(b, ks + f.k_row + (((kstep * 2) ^ f.k_swz) << 4));
#endif
        mma_top_rows(s[0], qa[kstep][0], qa[kstep][1], b[0], b[1]);
        mma_top_rows(s[1], qa[kstep][0], qa[kstep][1], b[2], b[3]);
    }
#ifdef KV_FP8
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) s[n][j] *= k_sc[n][j];
#endif
    // Online softmax along row gid (its 16 tokens live in the 4 lanes of this quad).
    float mx = -SOV_INF;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (t0 + n * 8 + tig * 2 + j >= t_end) s[n][j] = -SOV_INF;
            mx = fmaxf(mx, s[n][j]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);  // finite: the chunk's first token is valid
    const float alpha = __expf(m - m_new);
    float ps = 0.f;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            s[n][j] = __expf(s[n][j] - m_new);
            ps += s[n][j];
        }
    l = l * alpha + ps;
    m = m_new;
    if (__any_sync(0xffffffffu, alpha != 1.f)) {  // after the first chunks the max rarely moves
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            acc[nt][0] *= alpha;
            acc[nt][1] *= alpha;
        }
    }
    // O += P . V: P (tokens 0-7 | 8-15 of row gid) as the A operand.
#ifdef KV_FP8
    const u32 p_lo = pack_ab(s[0][0] * v_sc[0][0], s[0][1] * v_sc[0][1]);
    const u32 p_hi = pack_ab(s[1][0] * v_sc[1][0], s[1][1] * v_sc[1][1]);
    const unsigned char* vc = stp + CODE_BYTES;  // the chunk's V codes
#pragma unroll
    for (int gr = 0; gr < D / 32; gr++) {
        // Dims gr * 32 + 4 gid .. + 3 of tokens 2 tig, 2 tig + 1 (P's columns in p_lo) and
        // 2 tig + 8, 2 tig + 9 (p_hi), a u32 of codes each; transposed by byte permutes into
        // token pairs of one dim: n-tile 4 gr + j holds dim gr * 32 + 4 gid + j (acc_dim).
        const int piece = 2 * gr + (gid >> 2);
        const u32 col = (u32)((gid & 3) * 4);
        const u32 w0 = *(const u32*)(vc + v8_offset(2 * tig, piece) + col);
        const u32 w1 = *(const u32*)(vc + v8_offset(2 * tig + 1, piece) + col);
        const u32 w2 = *(const u32*)(vc + v8_offset(2 * tig + 8, piece) + col);
        const u32 w3 = *(const u32*)(vc + v8_offset(2 * tig + 9, piece) + col);
        const u32 lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w0, w1, 0x7362);  // dims 0, 1 | 2, 3
        const u32 hi01 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
        mma_top_rows(acc[4 * gr], p_lo, p_hi, e4m3x2_to_f16x2((unsigned short)(lo01 & 0xffffu)),
                     e4m3x2_to_f16x2((unsigned short)(hi01 & 0xffffu)));
        mma_top_rows(acc[4 * gr + 1], p_lo, p_hi, e4m3x2_to_f16x2((unsigned short)(lo01 >> 16)),
                     e4m3x2_to_f16x2((unsigned short)(hi01 >> 16)));
        mma_top_rows(acc[4 * gr + 2], p_lo, p_hi, e4m3x2_to_f16x2((unsigned short)(lo23 & 0xffffu)),
                     e4m3x2_to_f16x2((unsigned short)(hi23 & 0xffffu)));
        mma_top_rows(acc[4 * gr + 3], p_lo, p_hi, e4m3x2_to_f16x2((unsigned short)(lo23 >> 16)),
                     e4m3x2_to_f16x2((unsigned short)(hi23 >> 16)));
    }
#else
    const u32 p_lo = pack_ab(s[0][0], s[0][1]), p_hi = pack_ab(s[1][0], s[1][1]);
#pragma unroll
    for (int np = 0; np < D / 16; np++) {
        // Matrices: tokens 0-7 / 8-15 (mat & 1) x dims (2 np + (mat >> 1)) * 8 + 0-7, transposed.
        u32 b[4];
        ldsm_x4_trans(b, vs + f.v_row + (((np * 2) ^ f.v_swz) << 4));
        mma_top_rows(acc[2 * np], p_lo, p_hi, b[0], b[1]);
        mma_top_rows(acc[2 * np + 1], p_lo, p_hi, b[2], b[3]);
    }
#endif
}

// Q of query heads kvh * G + gid (rows gid >= G: repeats of the last) of sequence seq, as f32: a
// lane holds dims ks * 16 + tig * 2 + {0, 1, 8, 9} of every k-step ks (e4m3 cache: tig * 4 .. + 3,
// the order its K codes come in), so both dims of each rotated pair (j, j + D/2), D/2 being D/32
// k-steps. Split from q_operand so the loads can be issued early.
__device__ __forceinline__ void load_q(const float* __restrict__ q, int q_stride, int seq, int kvh, int gid, int tig,
                                       float (&qf)[D / 16][4]) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const float* qp = q + (size_t)seq * q_stride + (size_t)(kvh * G + min(gid, G - 1)) * D + ks * 16 + tig * 2;
#ifdef KV_FP8
        qf[ks][0] = qp[tig * 2];
        qf[ks][1] = qp[tig * 2 + 1];
        qf[ks][2] = qp[tig * 2 + 2];
        qf[ks][3] = qp[tig * 2 + 3];
#else
        qf[ks][0] = qp[0];
        qf[ks][1] = qp[1];
        qf[ks][2] = qp[8];
        qf[ks][3] = qp[9];
#endif
    }
}

// load_q's values as the A operand (rows gid >= G zero): rotated at position pos (pos < 0: not
// rotated) as rope_kv_write rotates them, then pre-scaled.
__device__ __forceinline__ void q_operand(float (&qf)[D / 16][4], int gid, int tig, float scale, int pos,
                                          const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                          u32 (&qa)[D / 16][2]) {
    if (pos >= 0) {
        const size_t p = (size_t)pos;
#pragma unroll
        for (int ks = 0; ks < D / 32; ks++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
#ifdef KV_FP8
                const int j = ks * 16 + tig * 4 + e;
#else
                const int j = ks * 16 + tig * 2 + (e & 1) + (e >> 1) * 8;
#endif
                rotate_pair(qf[ks][e], qf[ks + D / 32][e], cos_t[p * (D / 2) + j], sin_t[p * (D / 2) + j],
                            &qf[ks][e], &qf[ks + D / 32][e]);
            }
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        qa[ks][0] = gid < G ? pack_ab(qf[ks][0] * scale, qf[ks][1] * scale) : 0u;
        qa[ks][1] = gid < G ? pack_ab(qf[ks][2] * scale, qf[ks][3] * scale) : 0u;
    }
}

#include "decode_warp_item.cuh"

// The body of both entry points below. Arguments, shapes and grid as paged_decode_attention in
// decode_attention.cu (bf16 cache), plus dynamic shared memory of NWARPS * STAGES * 2 * SLOT bf16,
// and the fused RoPE + KV write (all four null/absent: q and the cache already hold the rotated
// rows): positions, slots: [batch] u32 (slot 0xffffffff: no cache write); cos_t, sin_t:
// [max_pos, D/2] f32. With them, q is the raw qkv activation [batch, q_stride] (q heads, then k,
// then v heads); this kernel rotates its q heads as it loads them, and the CTA holding a
// sequence's newest token rotates that token's k head, stores it and the v head into the cache, and
// uses them straight from shared memory -- exactly rope_kv_write's arithmetic (rope_kv.cu), so the
// results are those of rope_kv_write followed by this kernel.
__device__ __forceinline__ void decode_attention_mma(
    void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,
    kv_t* __restrict__ k_cache,
    kv_t* __restrict__ v_cache, const u32* __restrict__ block_tables, int max_blocks,
    const u32* __restrict__ context_lens, float* __restrict__ part_o, float* __restrict__ part_ml,
    u32* __restrict__ counters, int n_kv_heads, int block_size, int split_tokens, int max_splits, float scale,
    const u32* __restrict__ positions, const u32* __restrict__ slots, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t) {
    allow_dependents_early();  // the output projection's GEMV may start streaming its weights
    // Launched with programmatic serialization, this CTA may run while the kernel before it (the
    // RoPE + KV write, or with the fused RoPE the qkv product) is still running. Until
    // wait_for_prerequisites() it reads only what no kernel of the decode step writes: the context
    // lengths and block tables (uploaded before the step's first kernel) and the cache rows of every
    // token but each sequence's newest. So the first chunks' K/V loads are in flight before the
    // wait; the newest token's rows are placed after it.
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const DecodeWork work = decode_work(context_lens, split_tokens);
    if (!work.active) return;
    const int split = work.split, kvh = work.kvh, seq = work.seq, n_splits = work.n_splits;
    const int t_begin = work.t_begin, t_end = work.t_end;
    const int fresh = split == n_splits - 1 ? t_end - 1 : -1;  // the newest token, if in this split
    const bool rope = cos_t != nullptr;
    // Tokens between a warp's consecutive chunks: the CTA's warps interleave their chunks.
    constexpr int CSTEP = NWARPS * CHUNK;

    // ring: [NWARPS][WARP_BYTES] (bf16: [STAGES][2 (K, V)][CHUNK, D]; e4m3: see WARP_BYTES);
    // reused as w_acc [NWARPS][G][D] f32 at the end.
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float w_m[NWARPS][G], w_l[NWARPS][G];
    const int gid = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group
    const u32 ring = (u32)__cvta_generic_to_shared(smem) + (u32)(warp * WARP_BYTES);

    const u32* bt = block_tables + (size_t)seq * max_blocks;
    const BlockDiv bdiv = block_div(block_size);
#ifdef KV_FP8
    const size_t row_elems = kv_e4m3_row_bytes(n_kv_heads, D);  // bytes a slot
    __shared__ __align__(16) unsigned char fresh_q[2 * D];  // the newest token's codes, K then V
    __shared__ float fresh_s[2];                             // and their scales
#define ISSUE_ARGS row_elems, kvh, n_kv_heads
#else
    const size_t row_elems = (size_t)n_kv_heads * D;
    const size_t head_off = (size_t)kvh * D;
    __shared__ __align__(16) bf16_t fresh_kv[2 * D];  // the newest token's K row, then its V row
#define ISSUE_ARGS row_elems, head_off
#endif
    const int first = t_begin + warp * CHUNK;
    const int my_chunks = first < t_end ? (t_end - first + CSTEP - 1) / CSTEP : 0;
    // The warp chunk holding the newest token, if this warp has it (it is then the warp's last).
    const int fresh_chunk = fresh >= first && (fresh - first) % CSTEP < CHUNK ? (fresh - first) / CSTEP : -1;
    const LaneFrag frag = lane_frag(lane);

#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < my_chunks) {
            issue_chunk(ring + c * STAGE_BYTES, first + c * CSTEP, lane, t_end, fresh, bt, bdiv,
                        ISSUE_ARGS, k_cache, v_cache);
        }
        cp_async_commit();
    }
    wait_for_prerequisites();

    // Q as the A operand, loaded while the first chunks are in flight: row gid = query head
    // kvh * G + gid (zero for gid >= G), rotated if the RoPE is fused, then pre-scaled. A lane holds
    // dims ks * 16 + tig * 2 + {0, 1, 8, 9} of every k-step ks, so both dims of each rotated pair
    // (j, j + D/2), D/2 being D/32 k-steps. The loads are issued first, so their latency overlaps
    // the newest token's below.
    float qf[D / 16][4];
    load_q(q, q_stride, seq, kvh, gid, tig, qf);

    // The newest token's K and V rows. Fused RoPE: warp 0 makes them from qkv (warp_fresh_rows, as a
    // warp item does), stores them into the cache and stages them in fresh_q / fresh_s (e4m3) or
    // fresh_kv (bf16), from which the warp whose chunk holds the token places them into its ring
    // slot (here for a chunk issued above, in the loop otherwise). Unfused: only a chunk issued
    // above left the row out; its warp copies it from the cache now (the loop's chunks are issued
    // after the wait and copy it as any other row).
    if (rope && fresh >= 0) {  // the same for the whole CTA: the barrier below is reached by all
        const float* kr = q + (size_t)seq * q_stride + (size_t)(n_kv_heads * G + kvh) * D;  // [D] f32
        const float* vr = kr + (size_t)n_kv_heads * D;                                    // [D] f32
#ifdef KV_FP8
        if (warp == 0)
            warp_fresh_rows(kr, vr, positions[seq], cos_t, sin_t, lane, fresh_q, fresh_s, slots[seq], kvh, n_kv_heads,
                            row_elems, k_cache, v_cache);
        __syncthreads();
        if (fresh_chunk >= 0 && fresh_chunk < STAGES - 1)
            place_fresh8(ring + fresh_chunk * STAGE_BYTES, fresh - (first + fresh_chunk * CSTEP), lane, fresh_q,
                         fresh_s);
#else
        if (warp == 0)
            warp_fresh_rows(kr, vr, positions[seq], cos_t, sin_t, lane, fresh_kv, slots[seq], row_elems, head_off,
                            k_cache, v_cache);
        __syncthreads();
        if (fresh_chunk >= 0 && fresh_chunk < STAGES - 1)
            place_fresh(ring + fresh_chunk * STAGE_BYTES, fresh - (first + fresh_chunk * CSTEP), lane, fresh_kv);
#endif
    } else if (fresh_chunk >= 0 && fresh_chunk < STAGES - 1) {
        place_fresh_from_cache(ring + fresh_chunk * STAGE_BYTES, fresh - (first + fresh_chunk * CSTEP), fresh, lane, bt,
                               block_size, ISSUE_ARGS, k_cache, v_cache);
    }

    u32 qa[D / 16][2];  // [k-step][cols tig*2.. | 8 + tig*2..]
    q_operand(qf, gid, tig, scale, rope ? (int)positions[seq] : -1, cos_t, sin_t, qa);
    float acc[D / 8][2];  // O rows gid: dims nt * 8 + tig * 2 + {0, 1}
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = 0.f;
    float m = -SOV_INF, l = 0.f;  // running max of row gid; this lane's part of its running sum

    for (int c = 0; c < my_chunks; c++) {
        const int t0 = first + c * CSTEP;
        const int next = c + STAGES - 1;
        if (next < my_chunks) {
            issue_chunk(ring + (next % STAGES) * STAGE_BYTES, first + next * CSTEP, lane, t_end,
                        rope ? fresh : -1, bt, bdiv, ISSUE_ARGS, k_cache, v_cache);
            if (rope && next == fresh_chunk)
#ifdef KV_FP8
                place_fresh8(ring + (next % STAGES) * STAGE_BYTES, fresh - (first + next * CSTEP), lane,
                             fresh_q, fresh_s);
#else
                place_fresh(ring + (next % STAGES) * STAGE_BYTES, fresh - (first + next * CSTEP), lane,
                            fresh_kv);
#endif
        }
        cp_async_commit();
        cp_async_wait_stages();
        __syncwarp();  // every lane's copies of this chunk are visible to the whole warp
        const u32 slot = ring + (c % STAGES) * STAGE_BYTES;
        attend_chunk(frag, slot, smem + warp * WARP_BYTES + (c % STAGES) * STAGE_BYTES, t0, t_end, qa, acc, m, l);
        __syncwarp();  // the slot is refilled only after every lane has read it
    }

    // Row sums: add the quad's parts. Then the warps' states go to shared memory (w_acc over the ring).
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    cp_async_wait_all();
    __syncthreads();
    float* w_acc = (float*)smem;  // [NWARPS][G][D]
    if (gid < G) {
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            w_acc[(warp * G + gid) * D + acc_dim(nt, tig, 0)] = acc[nt][0];
            w_acc[(warp * G + gid) * D + acc_dim(nt, tig, 1)] = acc[nt][1];
        }
        if (tig == 0) {
            w_m[warp][gid] = m;
            w_l[warp][gid] = l;
        }
    }
    __syncthreads();
    decode_finish(&w_m[0][0], &w_l[0][0], w_acc, out, out_stride, out_bf16, part_o, part_ml, counters, seq, kvh, n_kv_heads,
                  split, n_splits, max_splits);
}

// The entry points' parameters (decode_attention_mma's), and the call of the body with them.
#define DECODE_PARAMS                                                                                              \
    void* __restrict__ out, int out_stride, int out_bf16, const float* __restrict__ q, int q_stride,              \
        kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache, const u32* __restrict__ block_tables,             \
        int max_blocks, const u32* __restrict__ context_lens, float* __restrict__ part_o,                         \
        float* __restrict__ part_ml, u32* __restrict__ counters, int n_kv_heads, int block_size, int split_tokens, \
        int max_splits, float scale, const u32* __restrict__ positions, const u32* __restrict__ slots,            \
        const float* __restrict__ cos_t, const float* __restrict__ sin_t
#define DECODE_BODY                                                                                                \
    decode_attention_mma(out, out_stride, out_bf16, q, q_stride, k_cache, v_cache, block_tables, max_blocks,       \
                         context_lens, part_o, part_ml, counters, n_kv_heads, block_size, split_tokens, max_splits, \
                         scale, positions, slots, cos_t, sin_t)

// Grids of more CTAs than SMs (batch >= 2 or long contexts).
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) paged_decode_attention_mma(DECODE_PARAMS) {
    DECODE_BODY;
}

// The same kernel for grids of at most one CTA per SM (batch 1, short contexts). A separate entry
// so the host can give it its own shared-memory carveout (attention.rs).
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) paged_decode_attention_mma_few(DECODE_PARAMS) {
    DECODE_BODY;
}

// Warp items (see the top and decode_attention_warp_item): grid (ceil(n_kv_heads / NWARPS), 1,
// batch), one split per sequence. Its own carveout (DecodeCarveout::warps).
extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) paged_decode_attention_mma_warps(DECODE_PARAMS) {
    (void)part_o;
    (void)part_ml;
    (void)counters;
    (void)max_splits;
    decode_attention_warp_item(out, out_stride, out_bf16, q, q_stride, k_cache, v_cache, block_tables, max_blocks,
                               context_lens, n_kv_heads, block_size, split_tokens, scale, positions, slots, cos_t,
                               sin_t);
}
