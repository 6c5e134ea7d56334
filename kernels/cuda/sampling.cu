// sampling.cu: next-token choice on the device, so only token ids travel back to the host.
//
// One CTA of 1024 threads per row of logits. Greedy rows (temperature <= 0 or top_k == 1) take the
// argmax (smallest index on ties). Other rows follow Hugging Face's order of warpers: temperature,
// then top-k, then top-p on the renormalised top-k distribution, then one draw by inverse CDF in
// vocabulary order with the uniform number the host supplies (the host owns the per-request RNG, so
// runs are reproducible). The top-k and top-p thresholds are found without sorting, by a 4-pass radix
// select (8 bits per pass) over order-preserving integer keys of the logits: counting for top-k,
// probability mass (f32) for top-p. Histogram updates are aggregated per warp (lanes with equal
// digits found with __match_any_sync, summed with shuffles) so that equal digits do not serialise
// on shared-memory atomics.
// Ties at a threshold keep every tied token.
#include "common.cuh"

#define NT 1024

// Order-preserving map of an f32 to a u32 (larger float -> larger key).
__device__ __forceinline__ u32 order_key(float x) {
    const u32 u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Largest key `thr` such that the weight of keys >= thr (among keys >= min_key) reaches `target`.
// Weight per token: 1 (count) or its probability exp((l - m) * inv_t) * inv_z (mass), summed in f32.
__device__ u32 radix_select(const float* __restrict__ row, int vocab, u32 min_key, bool mass, float m,
                            float inv_t, float inv_z, float target, float* hist, u32* state, float* fstate) {
    const int tid = threadIdx.x, lane = tid & 31;
    u32 prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) hist[tid] = 0.f;
        __syncthreads();
        for (int base = 0; base < vocab; base += NT) {
            const int i = base + tid;
            u32 key = 0;
            float w = 0.f;
            bool valid = i < vocab;
            if (valid) {
                const float x = row[i];
                key = order_key(x);
                valid = key >= min_key && (key & mask) == prefix;
                if (valid) w = mass ? __expf((x - m) * inv_t) * inv_z : 1.f;
            }
            const u32 digit = valid ? (key >> shift) & 255u : 256u;
            const u32 peers = __match_any_sync(0xffffffffu, digit);
            // Sum of w over the lanes sharing this lane's digit (all lanes take part in the shuffles).
            float sum = 0.f;
#pragma unroll
            for (int src = 0; src < 32; src++) {
                const float v = __shfl_sync(0xffffffffu, w, src);
                if ((peers >> src) & 1u) sum += v;
            }
            if (valid && sum > 0.f && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], sum);
        }
        __syncthreads();
        if (tid == 0) {
            float cum = 0.f, rest = target;
            u32 chosen = 0;
            for (int d = 255; d >= 0; d--) {
                if (hist[d] > 0.f && cum + hist[d] >= target) {
                    chosen = d;
                    rest = target - cum;
                    break;
                }
                cum += hist[d];
            }
            state[0] = prefix | (chosen << shift);
            fstate[0] = rest;
        }
        __syncthreads();
        prefix = state[0];
        target = fstate[0];
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

// out: [batch] token ids. logits: [batch, vocab] f32. temperature, top_p, uniform: [batch] f32;
// top_k: [batch] int (0 = off); uniform in [0, 1). Grid: batch, block: NT.
extern "C" __global__ void __launch_bounds__(NT)
sample_tokens(u32* __restrict__ out, const float* __restrict__ logits, int vocab,
              const float* __restrict__ temperature, const int* __restrict__ top_k,
              const float* __restrict__ top_p, const float* __restrict__ uniform) {
    __shared__ float scratch[32];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float hist[256];
    __shared__ u32 state[1];
    __shared__ float fstate[1];
    __shared__ int found, last_candidate;
    __shared__ float chunk_off[32];

    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* row = logits + (size_t)b * vocab;

    // Argmax, smallest index on ties.
    float bv = -SOV_INF;
    int bi = 0x7fffffff;
    for (int i = tid; i < vocab; i += NT) {
        const float x = row[i];
        if (x > bv) {
            bv = x;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = best_v[lane];
        bi = best_i[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            best_v[0] = bv;
            best_i[0] = bi;
        }
    }
    __syncthreads();
    const float m = best_v[0];
    const float t = temperature[b];
    const int k = top_k[b];
    if (!(t > 0.f) || k == 1 || !(m > -SOV_INF)) {
        if (tid == 0) out[b] = (u32)(best_i[0] == 0x7fffffff ? 0 : best_i[0]);
        return;
    }
    const float inv_t = 1.f / t;

    // Top-k threshold.
    u32 thr = 0;
    if (k > 0 && k < vocab) thr = radix_select(row, vocab, 0, false, m, inv_t, 0.f, (float)k, hist, state, fstate);

    // Normaliser of the top-k distribution.
    float z = 0.f;
    for (int i = tid; i < vocab; i += NT) {
        const float x = row[i];
        if (order_key(x) >= thr) z += __expf((x - m) * inv_t);
    }
    z = block_sum(z, scratch);

    // Top-p threshold on that distribution.
    const float p = top_p[b];
    if (p < 1.f) {
        // Masses are normalised by z, so they sum to 1 up to rounding; never ask for more than 1.
        const float target = fminf(fmaxf(p, 0.f), 1.f) * (1.f - 1e-6f);
        const u32 thr_p = radix_select(row, vocab, thr, true, m, inv_t, 1.f / z, target, hist, state, fstate);
        thr = max(thr, thr_p);
        z = 0.f;
        for (int i = tid; i < vocab; i += NT) {
            const float x = row[i];
            if (order_key(x) >= thr) z += __expf((x - m) * inv_t);
        }
        z = block_sum(z, scratch);
    }

    // Inverse CDF in vocabulary order over the candidates.
    const float goal = uniform[b] * z;
    if (tid == 0) {
        found = 0x7fffffff;
        last_candidate = 0;
    }
    __syncthreads();
    float running = 0.f;
    for (int base = 0; base < vocab; base += NT) {
        const int i = base + tid;
        float w = 0.f;
        if (i < vocab) {
            const float x = row[i];
            if (order_key(x) >= thr) {
                w = __expf((x - m) * inv_t);
                atomicMax(&last_candidate, i);
            }
        }
        // Inclusive block scan of w.
        float incl = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += n;
        }
        if (lane == 31) chunk_off[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            float wsum = chunk_off[lane];
            float wincl = wsum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float n = __shfl_up_sync(0xffffffffu, wincl, o);
                if (lane >= o) wincl += n;
            }
            chunk_off[lane] = wincl - wsum;  // exclusive offset of each warp
        }
        __syncthreads();
        incl += running + chunk_off[warp];
        if (w > 0.f && incl > goal && incl - w <= goal) atomicMin(&found, i);
        const float chunk_total = __shfl_sync(0xffffffffu, incl, 31);
        __syncthreads();
        // The last warp's inclusive value is the new running total.
        if (warp == NT / 32 - 1 && lane == 31) chunk_off[0] = chunk_total;
        __syncthreads();
        running = chunk_off[0];
        const bool done = found != 0x7fffffff;
        __syncthreads();
        if (done) break;
    }
    if (tid == 0) out[b] = (u32)(found != 0x7fffffff ? found : last_candidate);
}
