// lt_bench.cuh: what the deterministic-mode benches (det_probe.cu, det_gemv_bench.cu) share: CUDA
// and cuBLASLt error checks, a cuBLASLt handle with its workspace, and the layouts of one product
// out[n, m] (f32) = x[n, k] (bf16) @ w[m, k]^T as sov's deterministic mode describes it to cuBLASLt
// (runtime/src/backend/cuda/gemm_pinned.rs).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define LK(x)                                                                               \
    do {                                                                                    \
        cublasStatus_t s_ = (x);                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            printf("cublasLt %s at %d: %d\n", #x, __LINE__, (int)s_);                        \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

struct Lt {
    cublasLtHandle_t h;
    void* ws;
    size_t wsb = 32u << 20;
};

struct Prob {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t a, b, c;
    Prob(int m, int n, int k) {
        LK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t tr = CUBLAS_OP_T;
        LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof(tr)));
        LK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, m, k));
        LK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k));
        LK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, n, m));
    }
    ~Prob() {
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(c);
        cublasLtMatmulDescDestroy(d);
    }
};
