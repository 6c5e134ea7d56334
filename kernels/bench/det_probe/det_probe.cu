// det_probe.cu: does any cuBLASLt algorithm (split-K 1) sum each output element in the order of a
// kernel we can write? Bit-for-bit comparison, on random bf16 inputs of varied magnitude, of
// cuBLASLt's heuristic algorithms at 128 rows against: mma.sync m16n8k16 with the weight as A,
// with the weight as B, with the k slots of a k16 step permuted, mma.sync m16n8k8, and a plain f32
// FMA chain -- all sequential over K, one accumulator per element. Then: a fast small-row mma
// kernel (weight as B, permuted slots, 8-byte loads, register prefetch) checked against its
// reference and timed, and every cuBLASLt candidate timed at 1..1024 rows (plan B's data).
// Build: nvcc -O3 -std=c++17 -arch=sm_90a det_probe.cu -lcublasLt -o det_probe
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lt_bench.cuh"

typedef __nv_bfloat16 bf16;

__device__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

// Random non-zero values, sign random, magnitude (0.5..1.5) * 2^(-4..3).
__global__ void fill(bf16* p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(i * 0x9E3779B97F4A7C15ULL + seed);
        float u = ((h & 0xffffff) + 0.5f) / 16777216.f;
        float s = (h >> 31) ? -1.f : 1.f;
        int e = (int)((h >> 24) & 7) - 4;
        p[i] = __float2bfloat16(s * (0.5f + u) * ldexpf(1.f, e));
    }
}

__device__ __forceinline__ uint32_t ld2(const bf16* row, int k, int kk) {
    if (!row) return 0;
    const uint16_t* r = (const uint16_t*)row;
    uint32_t lo = kk < k ? r[kk] : 0, hi = kk + 1 < k ? r[kk + 1] : 0;
    return lo | (hi << 16);
}

__device__ __forceinline__ void mma16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma8(float* d, uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// out: [N, m] f32 = x: [N, k] @ w: [m, k]^T. One warp per tile. mode 0: w as A (16 w rows x 8 x
// rows); 1: x as A, w as B (16 x rows x 8 w rows); 2: as 1, lane t holds k0+4t..4t+3 of each k16
// step (slots permuted); 3: as 1 in k8 steps.
__global__ void ref_mma(float* out, const bf16* x, const bf16* w, int N, int k, int m, int mode) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const bool wA = mode == 0;
    const int tilesW = wA ? (m + 15) / 16 : (m + 7) / 8, tilesX = wA ? (N + 7) / 8 : (N + 15) / 16;
    if (warp >= tilesW * tilesX) return;
    const int tw = warp % tilesW, tx = warp / tilesW;
    const int aBase = wA ? tw * 16 : tx * 16, bBase = wA ? tx * 8 : tw * 8;
    const int aLim = wA ? m : N, bLim = wA ? N : m;
    const bf16* Am = wA ? w : x;
    const bf16* Bm = wA ? x : w;
    const bf16* pa0 = aBase + g < aLim ? Am + (size_t)(aBase + g) * k : nullptr;
    const bf16* pa1 = aBase + g + 8 < aLim ? Am + (size_t)(aBase + g + 8) * k : nullptr;
    const bf16* pb = bBase + g < bLim ? Bm + (size_t)(bBase + g) * k : nullptr;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    if (mode == 3) {
        for (int k0 = 0; k0 < k; k0 += 8) mma8(d, ld2(pa0, k, k0 + 2 * t), ld2(pa1, k, k0 + 2 * t), ld2(pb, k, k0 + 2 * t));
    } else {
        for (int k0 = 0; k0 < k; k0 += 16) {
            const int c0 = mode == 2 ? k0 + 4 * t : k0 + 2 * t, c1 = mode == 2 ? k0 + 4 * t + 2 : k0 + 8 + 2 * t;
            mma16(d, ld2(pa0, k, c0), ld2(pa1, k, c0), ld2(pa0, k, c1), ld2(pa1, k, c1), ld2(pb, k, c0), ld2(pb, k, c1));
        }
    }
    for (int i = 0; i < 4; i++) {
        const int ar = aBase + g + (i >= 2 ? 8 : 0), bc = bBase + 2 * t + (i & 1);
        const int wr = wA ? ar : bc, xr = wA ? bc : ar;
        if (wr < m && xr < N) out[(size_t)xr * m + wr] = d[i];
    }
}

// Plain f32 FMA chain over ascending k.
__global__ void ref_fma(float* out, const bf16* x, const bf16* w, int N, int k, int m) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)N * m) return;
    const int r = i / m, j = i % m;
    float acc = 0.f;
    for (int kk = 0; kk < k; kk++)
        acc = fmaf(__bfloat162float(x[(size_t)r * k + kk]), __bfloat162float(w[(size_t)j * k + kk]), acc);
    out[i] = acc;
}

// The fast small-row kernel: mode 2's order. Warp = 8 weight rows (B side, n8), NT tiles of 16 x
// rows (A side). Lane (g, t) loads 8 bytes of weight row g per k16 step (k0+4t..4t+3): a quad
// reads one 32-byte sector. G steps per round; the next round's weights are loaded before this
// round's mma. Requires k % 16 == 0.
__device__ __forceinline__ uint2 ldw(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.cs.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
template <int NT, int G>
__global__ void fast_mma(float* __restrict__ out, const bf16* __restrict__ x, const bf16* __restrict__ w, int N,
                         int k, int m) {
    const int wpc = blockDim.x >> 5;
    const int warp = blockIdx.x * wpc + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    if (warp * 8 >= m) return;
    const int wrow = min(warp * 8 + g, m - 1);
    const uint2* wp = (const uint2*)(w + (size_t)wrow * k) + t;  // step j at wp[4j]
    const uint2* xp[NT][2];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * i + g + 8 * h;
            xp[i][h] = r < N ? (const uint2*)(x + (size_t)r * k) + t : nullptr;
        }
    float d[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.f;
    const int steps = k / 16;
    uint2 cur[G], nxt[G];
#pragma unroll
    for (int u = 0; u < G; u++) cur[u] = u < steps ? ldw(wp + 4 * u) : make_uint2(0, 0);
    for (int j0 = 0; j0 < steps; j0 += G) {
#pragma unroll
        for (int u = 0; u < G; u++) nxt[u] = j0 + G + u < steps ? ldw(wp + 4 * (j0 + G + u)) : make_uint2(0, 0);
#pragma unroll
        for (int u = 0; u < G; u++) {
            if (j0 + u >= steps) break;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const uint2 xa = xp[i][0] ? xp[i][0][4 * (j0 + u)] : make_uint2(0, 0);
                const uint2 xb = xp[i][1] ? xp[i][1][4 * (j0 + u)] : make_uint2(0, 0);
                mma16(d[i], xa.x, xb.x, xa.y, xb.y, cur[u].x, cur[u].y);
            }
        }
#pragma unroll
        for (int u = 0; u < G; u++) cur[u] = nxt[u];
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int xr = 16 * i + g + (q >= 2 ? 8 : 0), wr = warp * 8 + 2 * t + (q & 1);
            if (xr < N && wr < m) out[(size_t)xr * m + wr] = d[i][q];
        }
}

typedef void (*FastFn)(float*, const bf16*, const bf16*, int, int, int);


static uint64_t cfg(const cublasLtMatmulAlgo_t& al, cublasLtMatmulAlgoConfigAttributes_t at) {
    size_t need = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&al, at, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS || need > 8) return 999999;
    uint64_t v = 0;
    size_t wr = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&al, at, &v, need, &wr) != CUBLAS_STATUS_SUCCESS) return 999998;
    return v;
}

static void describe(const char* tag, const cublasLtMatmulAlgo_t& al) {
    printf("%s id=%llu tile=%llu stages=%llu splitk=%llu red=%llu swz=%llu custom=%llu inner=%llu cluster=%llu", tag,
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_ID), (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_TILE_ID),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
           (unsigned long long)cfg(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

// Heuristic algorithms for n rows; mask: reduction-scheme mask (0: no restriction).
static std::vector<cublasLtMatmulHeuristicResult_t> heur(Lt& lt, int m, int n, int k, uint32_t mask, int count) {
    Prob p(m, n, k);
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.wsb, sizeof(lt.wsb)));
    if (mask) LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
    std::vector<cublasLtMatmulHeuristicResult_t> r(count);
    int got = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt.h, p.d, p.a, p.b, p.c, p.c, pref, count, r.data(), &got);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) got = 0;
    r.resize(got);
    return r;
}

// Runs the algorithm for n rows in launches of <= 256 rows (sov's MAX_LAUNCH_ROWS). false: refused.
static bool lt_run(Lt& lt, const cublasLtMatmulAlgo_t* al, float* out, const bf16* x, const bf16* w, int n, int k, int m,
                   int chunk = 256) {
    const float alpha = 1.f, beta = 0.f;
    for (int r0 = 0; r0 < n; r0 += chunk) {
        const int rows = std::min(chunk, n - r0);
        Prob p(m, rows, k);
        cublasStatus_t s = cublasLtMatmul(lt.h, p.d, &alpha, w, p.a, x + (size_t)r0 * k, p.b, &beta, out + (size_t)r0 * m,
                                          p.c, out + (size_t)r0 * m, p.c, al, lt.ws, lt.wsb, 0);
        if (s != CUBLAS_STATUS_SUCCESS) return false;
    }
    return true;
}

static size_t diff(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += memcmp(&a[i], &b[i], 4) != 0;
    return c;
}

static std::vector<float> host(const float* d, size_t n) {
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

int main(int argc, char** argv) {
    const bool timing = !(argc > 1 && !strcmp(argv[1], "bits"));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    Lt lt;
    LK(cublasLtCreate(&lt.h));
    CK(cudaMalloc(&lt.ws, lt.wsb));
    printf("# %s cc %d.%d, cuBLASLt %zu, SMs %d\n", prop.name, prop.major, prop.minor, cublasLtGetVersion(),
           prop.multiProcessorCount);
    struct Shape {
        const char* name;
        int m, k;
    } shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336},
                  {"odd333x1001", 333, 1001}, {"odd1000x1008", 1000, 1008}};
    const int NB = 1024;  // rows of x
    for (auto& s : shapes) {
        const int m = s.m, k = s.k;
        const size_t wn = (size_t)m * k;
        // Enough weight copies to keep repeated timing out of the 50 MB L2.
        const int copies = timing ? std::max<int>(1, (int)((256ull << 20) / (wn * 2)) + 1) : 1;
        bf16 *w, *x;
        CK(cudaMalloc(&w, wn * 2 * copies));
        CK(cudaMalloc(&x, (size_t)NB * k * 2));
        fill<<<1024, 256>>>(w, wn * copies, 1234 + m);
        fill<<<1024, 256>>>(x, (size_t)NB * k, 99 + k);
        float* o;
        CK(cudaMalloc(&o, (size_t)NB * m * 4));
        const int N = 128;
        const size_t on = (size_t)N * m;
        printf("\n## shape %s m=%d k=%d (bit comparison at %d rows)\n", s.name, m, k, N);
        // Our references.
        const char* rname[5] = {"mma16_wA", "mma16_wB", "mma16_wB_perm", "mma8_wB", "fma"};
        std::vector<std::vector<float>> ref(5);
        for (int mode = 0; mode < 4; mode++) {
            const long warps = mode == 0 ? (long)((m + 15) / 16) * ((N + 7) / 8) : (long)((m + 7) / 8) * ((N + 15) / 16);
            ref_mma<<<(warps + 3) / 4, 128>>>(o, x, w, N, k, m, mode);
            CK(cudaGetLastError());
            ref[mode] = host(o, on);
        }
        ref_fma<<<(on + 255) / 256, 256>>>(o, x, w, N, k, m);
        CK(cudaGetLastError());
        ref[4] = host(o, on);
        for (int a = 0; a < 5; a++)
            for (int b = a + 1; b < 5; b++)
                printf("ours %s vs %s: %zu of %zu differ\n", rname[a], rname[b], diff(ref[a], ref[b], on), on);
        // cuBLASLt candidates at 128 rows: sov's pinned pick (in-place reduction only), its top
        // list, and the unrestricted list (split-K > 1 included, for the record).
        auto pinned = heur(lt, m, N, k, CUBLASLT_REDUCTION_SCHEME_INPLACE, 16);
        auto open = heur(lt, m, N, k, 0, 16);
        std::vector<std::pair<const char*, cublasLtMatmulAlgo_t>> cands;
        for (auto& r : pinned) cands.push_back({"inplace", r.algo});
        for (auto& r : open) cands.push_back({"open", r.algo});
        std::vector<float> first;
        int ci = 0;
        for (auto& c : cands) {
            char tag[64];
            snprintf(tag, sizeof tag, "cand %d %s", ci, c.first);
            describe(tag, c.second);
            CK(cudaMemset(o, 0xff, on * 4));
            if (!lt_run(lt, &c.second, o, x, w, N, k, m)) {
                printf(" refused\n");
                ci++;
                continue;
            }
            auto h = host(o, on);
            printf(" | diffs:");
            for (int r = 0; r < 5; r++) printf(" %s=%zu", rname[r], diff(h, ref[r], on));
            // Its own rows at 1 and 17 rows (batch invariance of the algorithm itself).
            CK(cudaMemset(o, 0xff, on * 4));
            bool ok1 = lt_run(lt, &c.second, o, x, w, 1, k, m);
            auto h1 = host(o, m);
            printf(" self1=%s", ok1 ? (memcmp(h1.data(), h.data(), (size_t)m * 4) ? "DIFF" : "same") : "refused");
            printf("\n");
            ci++;
        }
        // The fast kernel: its rows at several counts against mode 2 (bits), then timings.
        const bool fastok = k % 16 == 0;
        struct FV {
            const char* name;
            FastFn f;
            int nt;
        } fv[] = {{"nt1g8", fast_mma<1, 8>, 1},   {"nt1g16", fast_mma<1, 16>, 1}, {"nt1g32", fast_mma<1, 32>, 1},
                  {"nt2g16", fast_mma<2, 16>, 2}, {"nt4g8", fast_mma<4, 8>, 4},   {"nt4g16", fast_mma<4, 16>, 4}};
        if (fastok) {
            for (auto& v : fv)
                for (int n : {1, 3, 8, 16, 17, 32, 64}) {
                    if (n > 16 * v.nt) continue;
                    CK(cudaMemset(o, 0xff, on * 4));
                    const int warps = (m + 7) / 8;
                    v.f<<<(warps + 1) / 2, 64>>>(o, x, w, n, k, m);
                    CK(cudaGetLastError());
                    auto h = host(o, (size_t)n * m);
                    size_t dd = diff(h, ref[2], (size_t)n * m);
                    if (dd) printf("fast %s n=%d: %zu differ from mma16_wB_perm\n", v.name, n, dd);
                }
            printf("fast kernels checked against mma16_wB_perm (only differences printed)\n");
        }
        if (timing) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            const int reps = 30;
            auto timeit = [&](auto&& launch) -> float {
                for (int i = 0; i < 3; i++) launch(i % copies);
                CK(cudaEventRecord(e0));
                for (int i = 0; i < reps; i++) launch(i % copies);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return ms * 1000.f / reps;
            };
            const double bytes = (double)wn * 2;
            if (fastok) {
                for (auto& v : fv)
                    for (int wpc : {1, 2, 4}) {
                        printf("time fast %s wpc%d:", v.name, wpc);
                        for (int n : {1, 2, 4, 8, 16, 32, 64}) {
                            if (n > 16 * v.nt) continue;
                            const int warps = (m + 7) / 8;
                            float us = timeit([&](int c) {
                                v.f<<<(warps + wpc - 1) / wpc, 32 * wpc>>>(o, x, w + (size_t)c * wn, n, k, m);
                            });
                            printf(" n%d=%.1fus(%.2fTB/s)", n, us, bytes / us / 1e6);
                        }
                        printf("\n");
                    }
            }
            // cuBLASLt: each candidate at 1..1024 rows; "perN" = heuristic top-1 at each row count
            // (the fast mode's proxy).
            const int ns[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024};
            ci = 0;
            for (auto& c : cands) {
                printf("time cand %d %s:", ci++, c.first);
                for (int n : ns) {
                    if (!lt_run(lt, &c.second, o, x, w, n, k, m)) {
                        printf(" n%d=refused", n);
                        continue;
                    }
                    float us = timeit([&](int cc) { lt_run(lt, &c.second, o, x, w + (size_t)cc * wn, n, k, m); });
                    printf(" n%d=%.1f", n, us);
                }
                printf("\n");
            }
            printf("time perN:");
            for (int n : ns) {
                auto best = heur(lt, m, n, k, 0, 1);
                if (best.empty()) {
                    printf(" n%d=none", n);
                    continue;
                }
                float us = timeit([&](int cc) { lt_run(lt, &best[0].algo, o, x, w + (size_t)cc * wn, n, k, m, n); });
                printf(" n%d=%.1f", n, us);
            }
            printf("\n");
        }
        fflush(stdout);
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(o));
    }
    return 0;
}
