// det_gemv_bench.cu: deterministic mode's small-row product (det_gemv in kernels/cuda/gemv.cu)
// against its reference chain (det_mma_16, same file) and the cuBLASLt split-K-1 algorithm sov's
// deterministic mode would otherwise use: bits first (random bf16 of varied magnitude, 1 / 3 / 16
// rows, beta 0 and 1, Llama-3-8B's shapes and odd ones), then times at 1..16 rows for several
// tilings, with the default mode's one-row GEMV (gemv_bf16_1) as the anchor.
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

template <int W, int C, int KC, int S, int CL = 1>
__global__ void __launch_bounds__(32 * W) dg_var(float* out, const bf16_t* x, const bf16_t* w, int n, int k, int m,
                                                float beta) {
    det_gemv_rows<W, C, KC, S, CL>(out, x, w, n, k, m, beta, k);
}
typedef void (*DgFn)(float*, const bf16_t*, const bf16_t*, int, int, int, float);
struct Var {
    const char* name;
    DgFn f;
    int warps, chains, kc, stages;
    int cluster = 1;  // CTAs a cluster sharing x by multicast (launched with that cluster dimension)
    // As DetGemvKernel::shared_bytes (kernels/src/lib.rs): barriers, stages of (rows + n) padded rows, zero row.
    size_t smem(int n) const { return DG_BAR_BYTES + ((size_t)stages * (rows() + n) + 1) * (kc + 16) * 2; }
    int rows() const { return warps * chains * 8; }
};
static void launch(const Var& v, float* o, const bf16_t* x, const bf16_t* w, int n, int k, int m, float beta) {
    const int grid = ((m + v.rows() - 1) / v.rows() + v.cluster - 1) / v.cluster * v.cluster;
    if (v.cluster == 1) {
        v.f<<<grid, 32 * v.warps, v.smem(n)>>>(o, x, w, n, k, m, beta);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(32 * v.warps);
    cfg.dynamicSmemBytes = v.smem(n);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = v.cluster;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, v.f, o, x, w, n, k, m, beta));
}

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
            size_t bad = 0, total = 0;
            for (int n : {1, 3, 16}) {
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
            for (auto& v : vars) {
                printf("time %s:", v.name);
                for (int n : ns) {
                    float us = timeit([&](int c) { launch(v, o, x, w + (size_t)c * wn, n, k, m, 0.f); });
                    printf(" n%d=%.1fus(%.2fTB/s)", n, us, bytes / us / 1e6);
                }
                printf("\n");
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
