// sampling.cu: next-token choice on the device, so only token ids travel back to the host.
//
// argmax_rows: the greedy choice, the host sampler's `argmax` (largest logit, lowest id on ties).
//
// draw_tokens: the sampled choice, bit for bit the host's `draw` (runtime/src/engine/draw.rs; its
// doc specifies the steps). Every float operation is one IEEE operation written with the _rn / _rz
// intrinsics, so the compiler can neither fuse nor reorder them, and every sum is an integer sum,
// which any order computes alike: the same logits and random bits give the host's token whatever
// the thread count or the order of the atomics. One CTA of NT threads per drawn row:
// - pass A: the largest order-preserving key of `logits / temperature` and its lowest id (the first
//   token of the sorted order; `m`, the largest scaled logit, is that key's value);
// - top-k: a 4-pass radix select (8 bits a pass) counting keys, largest first, finds the key of the
//   k-th token and how many of its ties (the lowest ids) stay;
// - top-p: the same select summing fixed-point weights (u64) over the top-k set finds the key where
//   the sorted prefix reaches top_p of that set's weight; equal keys have equal weights, so the
//   number of its ties that stay follows from the weight alone;
// - pass B: each thread sums the kept weight of a contiguous run of ids (ties kept by rank in id
//   order, min-p applied); an exclusive scan over the threads gives the total S and each run's
//   start, the target is (bits * S) >> 53, and the one thread whose run holds it walks its run.
// Histogram updates are aggregated per warp (lanes with equal digits found with
// __match_any_sync, summed with shuffles), so equal digits do not serialise on shared atomics.
#include "common.cuh"

#define NT 1024
#define WEIGHT_BITS 40
#define NO_INDEX 0x7fffffff

// Order-preserving map of an f32 to a u32 (larger float -> larger key), and back.
__device__ __forceinline__ u32 order_key(float x) {
    const u32 u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// logit / temperature, NaN counted as -inf.
__device__ __forceinline__ float draw_scaled(float logit, float t) {
    const float s = __fdiv_rn(logit, t);
    return s != s ? -SOV_INF : s;
}

// 2^f on (-1, 0]: the host's polynomial in the same Horner steps, no fused multiply-adds.
__device__ __forceinline__ float exp2_fraction(float f) {
    float acc = __int_as_float(0x38e566fb);
    acc = __fadd_rn(__fmul_rn(acc, f), __int_as_float(0x3aa735ef));
    acc = __fadd_rn(__fmul_rn(acc, f), __int_as_float(0x3c1cf5ad));
    acc = __fadd_rn(__fmul_rn(acc, f), __int_as_float(0x3d634a91));
    acc = __fadd_rn(__fmul_rn(acc, f), __int_as_float(0x3e75fd60));
    acc = __fadd_rn(__fmul_rn(acc, f), __int_as_float(0x3f317216));
    return __fadd_rn(__fmul_rn(acc, f), 1.f);
}

// Fixed-point weight of d = s - m (<= 0): exp(d) * 2^40 truncated, 0 below 2^-41 (draw.rs `weight`,
// the same steps: x clamped to [-41, 0], then floor(2^f * 2^24) * 2^48 shifted right by 8 - t).
__device__ __forceinline__ u64 draw_weight(float d) {
    float x = __fmul_rn(d, __int_as_float(0x3fb8aa3b));
    x = x > -41.f ? x : -41.f;  // NaN -> -41
    x = x < 0.f ? x : 0.f;
    const int t = __float2int_rz(x);
    const float f = __fsub_rn(x, __int2float_rn(t));
    const u32 mant = __float2uint_rz(__fmul_rn(exp2_fraction(f), 16777216.f));
    return ((u64)mant << 24) >> (8 - t);
}

__device__ __forceinline__ bool passes_min_p(u64 w, float min_p) {
    return min_p <= 0.f || __ull2double_rn(w) >= __dmul_rn((double)min_p, (double)(1ull << WEIGHT_BITS));
}

// Exclusive scan of one u64 a thread over the block (NT threads); `scratch` holds 32. *total gets
// the block's sum.
__device__ __forceinline__ u64 block_exclusive_scan(u64 v, u64* scratch, u64* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const u64 mine = scratch[lane];
        u64 w = mine;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        scratch[lane] = w - mine;
        if (lane == 31) scratch[32] = w;
    }
    __syncthreads();
    const u64 out = scratch[warp] + incl - v;
    *total = scratch[32];
    return out;
}

// Shared state of one draw.
struct DrawShared {
    u64 hist[256];
    u64 scan[33];
    u64 above, group, total;
    u32 prefix;
    u32 best_key[32];
    int best_id[32];
};

// Radix select over the row's keys, largest first: the key K whose group first makes the running
// total reach the goal, with *above the total over keys > K and *group K's own. Count mode (mass
// false): each token counts 1 and the goal is `count_goal`. Mass mode: each token counts its weight
// and the goal is reached when (double)total >= top_p * (double)Z, Z being the total over every
// counted token. With `floor` set, tokens with key < floor_key are left out and the group of
// floor_key counts `floor_add` (added by thread 0) instead of its tokens.
__device__ u32 select_key(const float* __restrict__ row, int vocab, float t, float m, bool mass,
                          u64 count_goal, float top_p, bool floor, u32 floor_key, u64 floor_add,
                          DrawShared& sh) {
    const int tid = threadIdx.x, lane = tid & 31;
    u32 prefix = 0, mask = 0;
    u64 above = 0;
    double goal = (double)count_goal;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) sh.hist[tid] = 0;
        __syncthreads();
        for (int base = 0; base < vocab; base += NT) {
            const int i = base + tid;
            u64 w = 0;
            bool valid = false;
            u32 key = 0;
            if (i < vocab) {
                const float s = draw_scaled(row[i], t);
                key = order_key(s);
                valid = (key & mask) == prefix && (!floor || key > floor_key);
                if (valid && mass) w = draw_weight(__fsub_rn(s, m));
                if (valid && !mass) w = 1;
            }
            const u32 digit = valid ? (key >> shift) & 255u : 256u;
            const u32 peers = __match_any_sync(0xffffffffu, digit);
            u64 sum = 0;
#pragma unroll
            for (int src = 0; src < 32; src++) {
                const u64 v = __shfl_sync(0xffffffffu, w, src);
                if ((peers >> src) & 1u) sum += v;
            }
            if (valid && sum > 0 && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[digit], sum);
        }
        __syncthreads();
        if (tid == 0) {
            if (floor && (floor_key & mask) == prefix) sh.hist[(floor_key >> shift) & 255u] += floor_add;
            if (mass && shift == 24) {
                u64 z = 0;
                for (int d = 0; d < 256; d++) z += sh.hist[d];
                goal = __dmul_rn((double)top_p, __ull2double_rn(z));
                sh.total = z;
            }
            u64 cum = above;
            int chosen = -1, last = 0;
            for (int d = 255; d >= 0; d--) {
                const u64 h = sh.hist[d];
                if (h == 0) continue;
                const bool reached = mass ? __ull2double_rn(cum + h) >= goal : (double)(cum + h) >= goal;
                last = d;
                if (reached) {
                    chosen = d;
                    break;
                }
                cum += h;
            }
            if (chosen < 0) {
                // Never reached (the goal is never above the total): the last group stays.
                chosen = last;
                cum -= sh.hist[last];
            }
            sh.prefix = prefix | ((u32)chosen << shift);
            sh.above = cum;
            sh.group = sh.hist[chosen];
        }
        __syncthreads();
        prefix = sh.prefix;
        above = sh.above;
        if (mass && shift == 24) goal = __dmul_rn((double)top_p, __ull2double_rn(sh.total));
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// Argmax of one row exactly as the host sampler defines it (engine/sampler.rs `argmax`): the largest
// value, the lowest index among ties; NaN never wins, except that an all-NaN row gives the last index
// (where the host's scan ends). Index 0x7fffffff marks "no non-NaN value seen yet".
#define NO_INDEX 0x7fffffff

__device__ __forceinline__ void take_better(float& bv, int& bi, float ov, int oi) {
    if (oi == NO_INDEX) return;
    if (bi == NO_INDEX || ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
    }
}

__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take_better(bv, bi, ov, oi);
    }
}

// out: [batch] token ids. logits: [batch, vocab] f32. Grid: batch, block: NT. Only enqueues reads of
// its arguments, so a decode step that ends with it can be replayed from a CUDA graph.
extern "C" __global__ void __launch_bounds__(NT)
argmax_rows(u32* __restrict__ out, const float* __restrict__ logits, int vocab) {
    allow_dependents_early();
    wait_for_prerequisites();  // launched with programmatic serialization: inputs are ready after this
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* row = logits + (size_t)b * vocab;
    float bv = -SOV_INF;
    int bi = NO_INDEX;
    for (int i = tid; i < vocab; i += NT) {
        const float x = row[i];
        if (x == x) take_better(bv, bi, x, i);
    }
    warp_argmax(bv, bi);
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = best_v[lane];
        bi = best_i[lane];
        warp_argmax(bv, bi);
        if (lane == 0) out[b] = (u32)(bi == NO_INDEX ? vocab - 1 : bi);
    }
}

// logits: [rows, vocab] f32. params: [n, 4] u64, each (temperature f32 | top_k u32 << 32, top_p
// f32 | min_p f32 << 32, bits, logits row): the host's DrawSpec and the row it draws from. out:
// the token ids, [n] in draw order, or with out_by_row set [rows], each draw's id at its row (the
// other entries untouched: a decode step's greedy ids stay where argmax_rows put them). Grid: n,
// block: NT. The rows are sampled ones (temperature > 0).
extern "C" __global__ void __launch_bounds__(NT)
draw_tokens(u32* __restrict__ out, const float* __restrict__ logits, int vocab,
            const u64* __restrict__ params, int out_by_row) {
    __shared__ DrawShared sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u64 p0 = params[4 * blockIdx.x], p1 = params[4 * blockIdx.x + 1], bits = params[4 * blockIdx.x + 2];
    const u64 row_index = params[4 * blockIdx.x + 3];
    const float* row = logits + (size_t)row_index * vocab;
    const size_t b = out_by_row ? (size_t)row_index : (size_t)blockIdx.x;  // this draw's entry of out
    const float t = __uint_as_float((u32)p0);
    const u32 top_k = (u32)(p0 >> 32);
    const float top_p = __uint_as_float((u32)p1), min_p = __uint_as_float((u32)(p1 >> 32));

    // Pass A: the first token of the sorted order (largest key, lowest id).
    u32 bk = 0;
    int bi = NO_INDEX;
    for (int i = tid; i < vocab; i += NT) {
        const u32 k = order_key(draw_scaled(row[i], t));
        if (bi == NO_INDEX || k > bk) {
            bk = k;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u32 ok = __shfl_xor_sync(0xffffffffu, bk, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != NO_INDEX && (bi == NO_INDEX || ok > bk || (ok == bk && oi < bi))) {
            bk = ok;
            bi = oi;
        }
    }
    if (lane == 0) {
        sh.best_key[warp] = bk;
        sh.best_id[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bk = sh.best_key[lane];
        bi = sh.best_id[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u32 ok = __shfl_xor_sync(0xffffffffu, bk, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != NO_INDEX && (bi == NO_INDEX || ok > bk || (ok == bk && oi < bi))) {
                bk = ok;
                bi = oi;
            }
        }
        if (lane == 0) {
            sh.best_key[0] = bk;
            sh.best_id[0] = bi;
        }
    }
    __syncthreads();
    const int first = sh.best_id[0] == NO_INDEX ? 0 : sh.best_id[0];
    const float m = key_value(sh.best_key[0]);
    if (!(m > -SOV_INF && m < SOV_INF)) {
        // The largest scaled logit is not finite: the lowest id holding it.
        if (tid == 0) out[b] = (u32)first;
        return;
    }

    // The cut of the sorted order: keys above cut_key, and the cut_count lowest ids of cut_key.
    bool cut = false;
    u32 cut_key = 0;
    u64 cut_count = 0;
    const bool use_k = top_k > 0 && top_k < (u32)vocab;
    if (use_k) {
        cut_key = select_key(row, vocab, t, m, false, top_k, 1.f, false, 0, 0, sh);
        cut_count = (u64)top_k - sh.above;
        cut = true;
    }
    if (top_p < 1.f) {
        const u64 floor_add = use_k ? cut_count * draw_weight(__fsub_rn(key_value(cut_key), m)) : 0;
        const u32 kp = select_key(row, vocab, t, m, true, 0, top_p, use_k, cut_key, floor_add, sh);
        const u64 above = sh.above, group = sh.group;
        const double goal = __dmul_rn((double)top_p, __ull2double_rn(sh.total));
        const u64 wp = draw_weight(__fsub_rn(key_value(kp), m));
        u64 size = (use_k && kp == cut_key) ? cut_count : (wp > 0 ? group / wp : 1);
        if (size == 0) size = 1;
        // The fewest ties whose weight takes the prefix to the goal (at least one).
        u64 c = 1;
        if (wp > 0) {
            const double need = goal - __ull2double_rn(above);
            const double est = need > 0.0 ? ceil(need / (double)wp) : 1.0;
            c = est < 1.0 ? 1 : (est > (double)size ? size : (u64)est);
            while (c > 1 && __ull2double_rn(above + (c - 1) * wp) >= goal) c--;
            while (c < size && __ull2double_rn(above + c * wp) < goal) c++;
        }
        cut_key = kp;
        cut_count = c;
        cut = true;
    }

    // Pass B: kept weight of each thread's run of ids, then the run that holds the target.
    const int run = (vocab + NT - 1) / NT;
    const int lo = min(vocab, tid * run), hi = min(vocab, lo + run);
    const u64 w_cut = cut ? draw_weight(__fsub_rn(key_value(cut_key), m)) : 0;
    const bool cut_passes = passes_min_p(w_cut, min_p);
    u64 mass = 0, ties = 0;
    for (int i = lo; i < hi; i++) {
        const float s = draw_scaled(row[i], t);
        const u32 key = order_key(s);
        if (cut && key <= cut_key) {
            if (key == cut_key) ties++;
            continue;
        }
        const u64 w = draw_weight(__fsub_rn(s, m));
        if (passes_min_p(w, min_p)) mass += w;
    }
    u64 tie_total;
    const u64 tie_base = block_exclusive_scan(ties, sh.scan, &tie_total);
    const u64 kept_ties = tie_base >= cut_count ? 0 : min(ties, cut_count - tie_base);
    const u64 mine = mass + (cut_passes ? kept_ties * w_cut : 0);
    u64 total;
    const u64 start = block_exclusive_scan(mine, sh.scan, &total);
    if (total == 0) {
        // min-p kept nothing: the first token of the sorted order.
        if (tid == 0) out[b] = (u32)first;
        return;
    }
    const u64 target = (__umul64hi(bits, total) << 11) | ((bits * total) >> 53);
    if (mine > 0 && start <= target && target < start + mine) {
        u64 cum = start, rank = tie_base;
        int pick = hi - 1;
        for (int i = lo; i < hi; i++) {
            const float s = draw_scaled(row[i], t);
            const u32 key = order_key(s);
            bool kept = true;
            if (cut && key < cut_key) kept = false;
            if (cut && key == cut_key) kept = rank++ < cut_count;
            if (!kept) continue;
            const u64 w = draw_weight(__fsub_rn(s, m));
            if (!passes_min_p(w, min_p)) continue;
            cum += w;
            if (cum > target) {
                pick = i;
                break;
            }
        }
        out[b] = (u32)pick;
    }
}
