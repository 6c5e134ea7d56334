"""Probe: do FP8 products of the Llama-3-8B shapes run faster with one scale per tensor than with
sov's per-row / per-column scales?

sov's cuBLASLt FP8 products scale inside cuBLASLt (outer-vector mode), for which its heuristic
offers one algorithm a shape; qkv and o at about 1000 rows then run at 900-950 TFLOP/s against
1190-1250 for gate/up and down (kernels/docs/fp8.md, FP8). With scalar scales the products could
run another algorithm and leave the row and column scales to the kernel that reads the output.
This times torch._scaled_mm (e4m3 x e4m3) both ways at each shape and row count, bf16 and f32
outputs, us a call from a CUDA graph of 20 calls, and names the kernel each way launched.

Reference: PyTorch 2.11 (cu130) on the device. Usage: python3 fp8_scale_modes.py [rows,...]
"""
import sys

import torch

DEV = "cuda"
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
CALLS = 20


def graph_us(fn, reps=10):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (reps * CALLS)


def kernel_name(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return names[-1][:60] if names else "?"


def main():
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1008,2048").split(",")]
    torch.manual_seed(0)
    for n in rows:
        for name, (k, m) in SHAPES.items():
            # the weights: 8 copies cycled, [m, k] e4m3 each (used as [k, m]), so most calls read DRAM
            ws = [torch.randn(m, k, device=DEV).to(torch.float8_e4m3fn).t() for _ in range(8)]
            x = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)  # [n, k]
            row_s, col_s = torch.rand(n, 1, device=DEV) + 0.5, torch.rand(1, m, device=DEV) + 0.5
            one = torch.ones((), device=DEV)
            line = []
            for dtype in (torch.bfloat16, torch.float32):
                for mode, (sa, sb) in (("rowwise", (row_s, col_s)), ("tensor", (one, one))):
                    i = [0]

                    def call():
                        w = ws[i[0] % 8]
                        i[0] += 1
                        torch._scaled_mm(x, w, scale_a=sa, scale_b=sb, out_dtype=dtype)

                    try:
                        us = graph_us(call)
                        tflops = 2 * n * k * m / us / 1e6
                        line.append(f"{mode} {str(dtype)[6:]} {us:.1f} us ({tflops:.0f} TFLOP/s) [{kernel_name(call)}]")
                    except RuntimeError as e:
                        line.append(f"{mode} {str(dtype)[6:]} refused: {str(e)[:80]}")
            print(f"{name} {n}x{k} @ {m}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
