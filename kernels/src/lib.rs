//! sov-kernels: CUDA C sources compiled at run time with NVRTC (work in progress).
