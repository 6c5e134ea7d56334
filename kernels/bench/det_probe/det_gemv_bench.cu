// det_gemv_bench.cu: deterministic mode's small-row product (det_gemv in kernels/cuda/gemv.cu)
// against its reference chain (det_mma_16, same file) and the cuBLASLt split-K-1 algorithm sov's
// deterministic mode would otherwise use: bits first (random bf16 of varied magnitude, 1 / 3 / 16
// rows, beta 0 and 1, Llama-3-8B's shapes and odd ones; K in two halves, as sov's down, against
// det_gemv_32_k512), then times at 1..16 rows for several tilings, warp-specialized variants and
// their copies alone (below), with the default mode's one-row GEMV (gemv_bf16_1) as the anchor.
// Build (kernels/bench/gpu-det-gemv.sh): nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/cuda \
//   det_gemv_bench.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemv.cu"

#include "lt_bench.cuh"

__device__ u32 bh32(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (u32)x;
}
// Random non-zero values: sign random, magnitude (0.5..1.5) * 2^(-4..3), as bf16 (and as f32).
__global__ void fill_bf16(bf16_t* p, float* pf, size_t n, u64 seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const u32 h = bh32(i * 0x9E3779B97F4A7C15ULL + seed);
        const float u = ((h & 0xffffff) + 0.5f) / 16777216.f;
        const float v = ((h >> 31) ? -1.f : 1.f) * (0.5f + u) * ldexpf(1.f, (int)((h >> 24) & 7) - 4);
        p[i] = f2bf(v);
        if (pf) pf[i] = bf2f(p[i]);
    }
}

// One arrival, expecting no bytes.
__device__ __forceinline__ void mbar_arrive(u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// det_gemv_ws_rows: det_gemv_rows with a copy warp of its own (warp specialization), the design
// of Hopper's TMA pipelines. WARPS warps compute (CHAINS chains of 8 weight rows each, the same
// steps and so the same bits as det_gemv_rows) and warp WARPS only copies: stage s has a "full"
// mbarrier (the copies' bytes) and an "empty" one (one arrival per computing warp once it has read
// the stage), so a stage is refilled as soon as every warp has left it, with no CTA barrier a stage
// and no computing warp issuing copies. Deeper rings then cost no more than their shared memory.
// Same arguments, grid, requirements and K split as det_gemv_rows; 32 * (WARPS + 1) threads.
// MMA false: the warps read one word a stage instead of multiplying, which measures the copies
// alone. Measured on the H200 (2026-12-04, Llama-3-8B shapes, one row): no faster than
// det_gemv_rows (down in two halves 35.2 us against det_gemv_32_k512's 33.4; o 13.8 against
// det_gemv_16's 13.9; gate/up 64.9 against cuBLASLt's 56.3), and the copies alone take about as
// long (down 33.5, o 12.0, gate/up 61.6 us: ~4.1 TB/s plus ~3.8 us a launch, against the default
// mode's GEMV at ~4.4 TB/s), so the 1-D bulk copies, not the barriers, bound these kernels; only
// this harness instantiates it.
template <int WARPS, int CHAINS, int KC, int STAGES, bool MMA = true>
__device__ __forceinline__ void det_gemv_ws_rows(float* __restrict__ out, const bf16_t* __restrict__ x,
                                                 const bf16_t* __restrict__ w, int n, int k, int m, float beta,
                                                 int ld) {
    constexpr int R = WARPS * 8 * CHAINS, PITCH = KC + 16;
    static_assert(2 * STAGES * 8 <= DG_BAR_BYTES, "the barriers fit ahead of the ring");
    x += (size_t)blockIdx.y * k;
    w += (size_t)blockIdx.y * k;
    extern __shared__ __align__(128) unsigned char dg_smem[];
    u64* full = (u64*)dg_smem;                         // [STAGES]: the stage's copies have landed
    u64* empty = full + STAGES;                        // [STAGES]: every computing warp has read it
    bf16_t* ring = (bf16_t*)(dg_smem + DG_BAR_BYTES);  // [STAGES][R + n][PITCH] bf16
    const int stage_elems = (R + n) * PITCH;
    bf16_t* zero = ring + STAGES * stage_elems;  // [PITCH] zeros
    for (int i = threadIdx.x; i < PITCH / 8; i += blockDim.x) ((uint4*)zero)[i] = make_uint4(0, 0, 0, 0);
    const int row0 = blockIdx.x * R;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nst = (k + KC - 1) / KC;
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], WARPS);
        }
    __syncthreads();
    const auto stage_bytes = [&](int s) { return (u32)(R + n) * (u32)min(KC, k - s * KC) * 2; };
    float d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; c++) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.f;
    if (warp == WARPS) {
        // Weights of the first stages before the wait (nothing earlier in the stream writes them),
        // x only after it; then each stage again as soon as every computing warp has left it.
        for (int s = 0; s < STAGES && s < nst; s++) {
            if (lane == 0) mbar_expect(&full[s], stage_bytes(s));
            __syncwarp();
            dg_copy_rows<R, KC, 1>(ring + s * stage_elems, &full[s], x, w, row0, m, k, ld, s * KC, 0, R, 0);
        }
        wait_for_prerequisites();
        for (int s = 0; s < STAGES && s < nst; s++)
            dg_copy_rows<R, KC, 1>(ring + s * stage_elems, &full[s], x, w, row0, m, k, ld, s * KC, R, R + n, 0);
        for (int st = STAGES; st < nst; st++) {
            const int b = st % STAGES;
            mbar_wait(&empty[b], (u32)((st / STAGES - 1) & 1));
            fence_proxy_async();  // the warps' reads of this buffer before its refill
            if (lane == 0) mbar_expect(&full[b], stage_bytes(st));
            __syncwarp();
            dg_copy_rows<R, KC, 1>(ring + b * stage_elems, &full[b], x, w, row0, m, k, ld, st * KC, 0, R + n, 0);
        }
    } else {
        wait_for_prerequisites();  // out (beta) is read at the end
        for (int st = 0; st < nst; st++) {
            const int b = st % STAGES;
            mbar_wait(&full[b], (u32)((st / STAGES) & 1));
            const bf16_t* sw = ring + b * stage_elems;
            const bf16_t* sx = sw + R * PITCH;
            const uint2* wq = (const uint2*)(sw + (warp * 8 * CHAINS + g) * PITCH) + t;
            const uint2* xa = (const uint2*)(g < n ? sx + g * PITCH : zero) + t;
            const uint2* xb = (const uint2*)(g + 8 < n ? sx + (g + 8) * PITCH : zero) + t;
            const int steps = min(KC, k - st * KC) / 16;
            if (!MMA) {
                d[0][0] += __uint_as_float(wq[0].x & 0x3f800000u);
            } else if (steps == KC / 16) {
#pragma unroll
                for (int s = 0; s < KC / 16; s++) dg_step<CHAINS, PITCH>(d, xa, xb, wq, s);
            } else {
                for (int s = 0; s < steps; s++) dg_step<CHAINS, PITCH>(d, xa, xb, wq, s);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[b]);
        }
    }
    allow_dependents_early();
    dg_store<CHAINS>(d, warp < WARPS, out, n, m, beta, row0 + warp * CHAINS * 8, g, t);
}

template <int W, int C, int KC, int S, int CL = 1>
__global__ void __launch_bounds__(32 * W) dg_var(float* out, const bf16_t* x, const bf16_t* w, int n, int k, int m,
                                                float beta, int ld) {
    det_gemv_rows<W, C, KC, S, CL>(out, x, w, n, k, m, beta, ld);
}
// Warp-specialized variants (one more warp, the copy warp); MMA false: copies alone.
template <int W, int C, int KC, int S, bool MMA = true>
__global__ void __launch_bounds__(32 * (W + 1)) ws_var(float* out, const bf16_t* x, const bf16_t* w, int n, int k,
                                                      int m, float beta, int ld) {
    det_gemv_ws_rows<W, C, KC, S, MMA>(out, x, w, n, k, m, beta, ld);
}
typedef void (*DgFn)(float*, const bf16_t*, const bf16_t*, int, int, int, float, int);
struct Var {
    const char* name;
    DgFn f;
    int warps, chains, kc, stages;
    int cluster = 1;  // CTAs a cluster sharing x by multicast (launched with that cluster dimension)
    bool ws = false;  // warp-specialized: one copy warp more
    bool exact = true;  // false: copies alone (no bits to check)
    // As DetGemvKernel::shared_bytes (kernels/src/lib.rs): barriers, stages of (rows + n) padded rows, zero row.
    size_t smem(int n) const { return DG_BAR_BYTES + ((size_t)stages * (rows() + n) + 1) * (kc + 16) * 2; }
    int rows() const { return warps * chains * 8; }
    int threads() const { return 32 * (warps + (ws ? 1 : 0)); }
};
// split 2: K in two halves of k / 2 (rows k apart), clusters of the two CTAs, as sov's down.
static void launch(const Var& v, float* o, const bf16_t* x, const bf16_t* w, int n, int k, int m, float beta,
                   int split = 1) {
    const int grid = ((m + v.rows() - 1) / v.rows() + v.cluster - 1) / v.cluster * v.cluster;
    if (v.cluster == 1 && split == 1) {
        v.f<<<grid, v.threads(), v.smem(n)>>>(o, x, w, n, k, m, beta, k);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid, split);
    cfg.blockDim = dim3(v.threads());
    cfg.dynamicSmemBytes = v.smem(n);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = split == 2 ? 1 : v.cluster;
    at[0].val.clusterDim.y = split;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, v.f, o, x, w, n, k / split, m, beta, k));
}

static bool fits(const Var& v, int n) { return v.smem(n) <= 227 * 1024; }

static uint64_t splitk(const cublasLtMatmulAlgo_t& al) {
    uint64_t v = 0;
    size_t wr = 0;
    int32_t s = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof(s), &wr) !=
        CUBLAS_STATUS_SUCCESS)
        return 0;
    v = (uint64_t)s;
    return v;
}
// The heuristic's first algorithm that does not split K, for n rows (false: none offered).
static bool first_split1(Lt& lt, int m, int n, int k, cublasLtMatmulAlgo_t* out) {
    Prob p(m, n, k);
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.wsb, sizeof(lt.wsb)));
    std::vector<cublasLtMatmulHeuristicResult_t> r(32);
    int got = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt.h, p.d, p.a, p.b, p.c, p.c, pref, 32, r.data(), &got);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) return false;
    for (int i = 0; i < got; i++)
        if (splitk(r[i].algo) <= 1) {
            *out = r[i].algo;
            return true;
        }
    return false;
}
static bool lt_run(Lt& lt, const cublasLtMatmulAlgo_t* al, float* out, const bf16_t* x, const bf16_t* w, int n, int k,
                   int m) {
    const float alpha = 1.f, beta = 0.f;
    Prob p(m, n, k);
    return cublasLtMatmul(lt.h, p.d, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, al, lt.ws, lt.wsb, 0) ==
           CUBLAS_STATUS_SUCCESS;
}
static std::vector<float> host(const float* d, size_t n) {
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
static size_t diff(const std::vector<float>& a, const std::vector<float>& b) {
    size_t c = 0;
    for (size_t i = 0; i < a.size(); i++) c += memcmp(&a[i], &b[i], 4) != 0;
    return c;
}

int main(int argc, char** argv) {
    const bool timing = !(argc > 1 && !strcmp(argv[1], "bits"));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    Lt lt;
    LK(cublasLtCreate(&lt.h));
    CK(cudaMalloc(&lt.ws, lt.wsb));
    printf("# %s cc %d.%d, SMs %d, cuBLASLt %zu\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           cublasLtGetVersion());
    // name, kernel, warps a CTA, chains a warp (8 weight rows each), columns a stage, stages.
    std::vector<Var> vars = {
        {"det_gemv_8 (w1 c1 kc512 s4)", det_gemv_8, 1, 1, 512, 4},
        {"det_gemv_16 (w2 c1 kc1024 s2)", det_gemv_16, 2, 1, 1024, 2},
        {"det_gemv_16_w1 (w1 c2 kc1024 s2)", det_gemv_16_w1, 1, 2, 1024, 2},
        {"det_gemv_32 (w4 c1 kc1024 s2)", det_gemv_32, 4, 1, 1024, 2},
        {"w4 c1 kc1024 s2, clusters of 2", dg_var<4, 1, 1024, 2, 2>, 4, 1, 1024, 2, 2},
        {"w4 c1 kc512 s2, clusters of 4", dg_var<4, 1, 512, 2, 4>, 4, 1, 512, 2, 4},
        {"w4 c1 kc1024 s2, clusters of 4", dg_var<4, 1, 1024, 2, 4>, 4, 1, 1024, 2, 4},
        {"w4 c1 kc512 s2", dg_var<4, 1, 512, 2>, 4, 1, 512, 2},
        {"w4 c2 kc512 s2, clusters of 4", dg_var<4, 2, 512, 2, 4>, 4, 2, 512, 2, 4},
        {"w2 c1 kc512 s3", dg_var<2, 1, 512, 3>, 2, 1, 512, 3},
        {"w1 c2 kc512 s4", dg_var<1, 2, 512, 4>, 1, 2, 512, 4},
        {"w2 c2 kc1024 s2", dg_var<2, 2, 1024, 2>, 2, 2, 1024, 2},
        {"w1 c4 kc1024 s2", dg_var<1, 4, 1024, 2>, 1, 4, 1024, 2},
        {"det_gemv_32_k512 (w4 c1 kc512 s2)", det_gemv_32_k512, 4, 1, 512, 2},
        {"ws w1 c1 kc512 s6", ws_var<1, 1, 512, 6>, 1, 1, 512, 6, 1, true},
        {"ws w2 c1 kc512 s4", ws_var<2, 1, 512, 4>, 2, 1, 512, 4, 1, true},
        {"ws w2 c1 kc256 s8", ws_var<2, 1, 256, 8>, 2, 1, 256, 8, 1, true},
        {"ws w4 c1 kc512 s3", ws_var<4, 1, 512, 3>, 4, 1, 512, 3, 1, true},
        {"ws w4 c1 kc512 s4", ws_var<4, 1, 512, 4>, 4, 1, 512, 4, 1, true},
        {"ws w4 c1 kc256 s8", ws_var<4, 1, 256, 8>, 4, 1, 256, 8, 1, true},
        {"ws w2 c2 kc512 s3", ws_var<2, 2, 512, 3>, 2, 2, 512, 3, 1, true},
        {"ws w8 c1 kc256 s6", ws_var<8, 1, 256, 6>, 8, 1, 256, 6, 1, true},
        {"copies only: ws w2 c1 kc512 s4", ws_var<2, 1, 512, 4, false>, 2, 1, 512, 4, 1, true, false},
        {"copies only: ws w4 c1 kc512 s3", ws_var<4, 1, 512, 3, false>, 4, 1, 512, 3, 1, true, false},
    };
    for (auto& v : vars) {
        CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, v.f));
        printf("variant %s: %d registers, %d rows a CTA, %zu bytes of shared memory at 1 row, %zu at 16\n", v.name,
               fa.numRegs, v.rows(), v.smem(1), v.smem(16));
    }
    struct Shape {
        const char* name;
        int m, k;
    } shapes[] = {{"qkv", 6144, 4096},    {"o", 4096, 4096},         {"gate_up", 28672, 4096}, {"down", 4096, 14336},
                  {"lm_head", 128256, 4096}, {"odd1000x1008", 1000, 1008}, {"odd333x1040", 333, 1040}};
    for (auto& s : shapes) {
        // `time qkv,down`: only the shapes named.
        if (argc > 2 && !strstr(argv[2], s.name)) continue;
        const int m = s.m, k = s.k, NX = 16;
        const size_t wn = (size_t)m * k;
        const int copies = timing ? std::max<int>(1, (int)((256ull << 20) / (wn * 2)) + 1) : 1;
        bf16_t *w, *x;
        float *xf, *o, *old;
        CK(cudaMalloc(&w, wn * 2 * copies));
        CK(cudaMalloc(&x, (size_t)NX * k * 2));
        CK(cudaMalloc(&xf, (size_t)NX * k * 4));
        CK(cudaMalloc(&o, (size_t)NX * m * 4));
        CK(cudaMalloc(&old, (size_t)NX * m * 4));
        fill_bf16<<<1024, 256>>>(w, nullptr, wn * copies, 1234 + m);
        fill_bf16<<<1024, 256>>>(x, xf, (size_t)NX * k, 99 + k);
        fill_bf16<<<1024, 256>>>((bf16_t*)old, nullptr, (size_t)NX * m * 2, 7);  // random bits as "old out"
        CK(cudaGetLastError());
        printf("\n## %s m=%d k=%d\n", s.name, m, k);
        // Reference: det_mma_16 at 16 rows.
        const size_t on = (size_t)NX * m;
        det_mma_16<<<((m + 7) / 8 + 1) / 2, 64>>>(o, x, w, NX, k, m, k);
        CK(cudaGetLastError());
        auto ref = host(o, on);
        cublasLtMatmulAlgo_t al;
        if (first_split1(lt, m, NX, k, &al) && lt_run(lt, &al, o, x, w, NX, k, m))
            printf("cuBLASLt split-K-1 (16 rows) vs det_mma_16: %zu of %zu differ\n", diff(host(o, on), ref), on);
        else
            printf("cuBLASLt split-K-1 (16 rows): none offered\n");
        auto oldh = host(old, on);
        for (auto& v : vars) {
            if (!v.exact) continue;
            size_t bad = 0, total = 0;
            for (int n : {1, 3, 16}) {
                if (!fits(v, n)) continue;
                CK(cudaMemset(o, 0xff, on * 4));
                launch(v, o, x, w, n, k, m, 0.f);
                CK(cudaGetLastError());
                auto h = host(o, (size_t)n * m);
                std::vector<float> r(ref.begin(), ref.begin() + (size_t)n * m);
                bad += diff(h, r);
                total += h.size();
                // beta = 1: out = chain + old.
                CK(cudaMemcpy(o, old, (size_t)n * m * 4, cudaMemcpyDeviceToDevice));
                launch(v, o, x, w, n, k, m, 1.f);
                auto hb = host(o, (size_t)n * m);
                for (size_t i = 0; i < r.size(); i++) r[i] = r[i] + oldh[i];
                bad += diff(hb, r);
                total += hb.size();
            }
            printf("bits %s: %zu of %zu differ from det_mma_16 (1, 3, 16 rows; beta 0 and 1)\n", v.name, bad, total);
        }
        // K in two halves (sov's down): every variant against det_gemv_32_k512's split launch.
        if (k >= 2 * m && k % 32 == 0) {
            const Var* anchor = nullptr;
            for (auto& v : vars)
                if (!strncmp(v.name, "det_gemv_32_k512", 16)) anchor = &v;
            for (int n : {1, 3, 16}) {
                CK(cudaMemcpy(o, old, (size_t)n * m * 4, cudaMemcpyDeviceToDevice));
                launch(*anchor, o, x, w, n, k, m, 1.f, 2);
                auto r = host(o, (size_t)n * m);
                for (auto& v : vars) {
                    if (!v.exact || v.cluster != 1 || !fits(v, n)) continue;
                    CK(cudaMemcpy(o, old, (size_t)n * m * 4, cudaMemcpyDeviceToDevice));
                    launch(v, o, x, w, n, k, m, 1.f, 2);
                    CK(cudaGetLastError());
                    printf("bits split %s, %d rows, beta 1: %zu of %zu differ from det_gemv_32_k512 split\n", v.name, n,
                           diff(host(o, (size_t)n * m), r), r.size());
                }
            }
        }
        if (timing && k % 8 == 0 && m >= 4096) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            const int reps = 30;
            auto timeit = [&](auto&& fn) -> float {
                for (int i = 0; i < 3; i++) fn(i % copies);
                CK(cudaEventRecord(e0));
                for (int i = 0; i < reps; i++) fn(i % copies);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return ms * 1000.f / reps;
            };
            const double bytes = (double)wn * 2;
            const int ns[] = {1, 2, 4, 8, 16};
            // Anchor: the default mode's one-row GEMV (split as sov picks: 2 for 4096 rows, else 1).
            {
                const int split = m == 4096 ? 2 : 1, per = GEMV_WARPS / split;
                float us = timeit([&](int c) {
                    gemv_bf16_1<<<(m + per - 1) / per, 32 * GEMV_WARPS>>>(o, xf, w + (size_t)c * wn, 1, k, m, split);
                });
                printf("time gemv_bf16_1 (default mode, 1 row): %.1f us (%.2f TB/s)\n", us, bytes / us / 1e6);
            }
            printf("time cublasLt split-K-1:");
            for (int n : ns) {
                if (!first_split1(lt, m, n, k, &al)) {
                    printf(" n%d=none", n);
                    continue;
                }
                Prob p(m, n, k);
                const float one = 1.f, zero = 0.f;
                float us = timeit([&](int c) {
                    cublasLtMatmul(lt.h, p.d, &one, w + (size_t)c * wn, p.a, x, p.b, &zero, o, p.c, o, p.c, &al, lt.ws,
                                   lt.wsb, 0);
                });
                printf(" n%d=%.1fus(%.2fTB/s)", n, us, bytes / us / 1e6);
            }
            printf("\ntime det_mma_16:");
            for (int n : ns) {
                float us = timeit([&](int c) { det_mma_16<<<((m + 7) / 8 + 1) / 2, 64>>>(o, x, w + (size_t)c * wn, n, k, m, k); });
                printf(" n%d=%.1fus(%.2fTB/s)", n, us, bytes / us / 1e6);
            }
            printf("\n");
            for (int split : {1, 2}) {
                if (split == 2 && !(k >= 2 * m && k % 32 == 0)) continue;
                for (auto& v : vars) {
                    if (split == 2 && v.cluster != 1) continue;
                    printf("time%s %s:", split == 2 ? " split" : "", v.name);
                    for (int n : ns) {
                        if (!fits(v, n)) {
                            printf(" n%d=-", n);
                            continue;
                        }
                        float us = timeit([&](int c) { launch(v, o, x, w + (size_t)c * wn, n, k, m, 0.f, split); });
                        printf(" n%d=%.1fus(%.2fTB/s)", n, us, bytes / us / 1e6);
                    }
                    printf("\n");
                }
            }
            CK(cudaGetLastError());
        }
        fflush(stdout);
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(xf));
        CK(cudaFree(o));
        CK(cudaFree(old));
    }
    return 0;
}
