"""Reference for sov's decode-attention benchmark: torch scaled_dot_product_attention on the same
shapes (Llama-3-8B heads: 32 query heads, 8 KV heads, head_dim 128, one query token), with K/V
contiguous (not paged), and torch's device-to-device copy, in the same process.

Reference: PyTorch 2.11 (cu130) on the device. Prints one `REF ...` line per measurement.
"""
import torch
import torch.nn.functional as F


def median_ms(fn, warmup=5, iters=50):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[iters // 2]


def back_to_back_ms(fn, reps=20, iters=20):
    """Time per call of `reps` calls queued back to back (the launch latency of all but the first
    hidden behind the kernels before it, as in a replayed decode step): median of `iters` runs."""
    return median_ms(lambda: [fn() for _ in range(reps)], warmup=1, iters=iters) / reps


def graph_ms(calls, reps, iters=20):
    """Time per call of `reps` calls (cycling through `calls`) captured into one CUDA graph and
    replayed: no host launch between kernels, as in a decode step replayed from a graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            calls[i % len(calls)]()
    return median_ms(g.replay, warmup=2, iters=iters) / reps


def main():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 3, 20)
    copy = 2 * n / (ms * 1e-3)
    print(f"REF torch_copy bytes=2GiB bandwidth={copy / 1e9:.1f} GB/s (read+write)")
    for batch, ctx in [(1, 4096), (64, 2048), (256, 1024)]:
        q = torch.randn(batch, 32, 1, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(batch, 8, ctx, 128, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(batch, 8, ctx, 128, dtype=torch.bfloat16, device="cuda")
        call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        ms = median_ms(call)
        b2b = back_to_back_ms(call)
        kv_bytes = 2 * batch * ctx * 8 * 128 * 2
        bw = kv_bytes / (ms * 1e-3)
        print(f"REF torch_sdpa batch={batch} ctx={ctx} time_us={ms * 1e3:.1f} bandwidth={bw / 1e9:.1f} GB/s "
              f"pct_of_copy={100 * bw / copy:.1f}% back_to_back_us={b2b * 1e3:.1f} "
              f"back_to_back_pct_of_copy={100 * kv_bytes / (b2b * 1e-3) / copy:.1f}%")
        # As sov's benchmark: KV copies cycled so a call reads DRAM, not the L2 the previous call
        # filled ("cold"), and calls captured into a CUDA graph.
        copies = max(1, -(-(512 << 20) // kv_bytes))
        kvs = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in range(copies - 1)]
        calls = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for k, v in kvs]
        warm_graph = graph_ms(calls[:1], 20)
        it = iter(range(1 << 30))
        cold_one = median_ms(lambda: calls[next(it) % copies]())
        reps = -(-max(20, copies) // copies) * copies
        cold_graph = graph_ms(calls, reps)
        pct = lambda t: 100 * kv_bytes / (t * 1e-3) / copy  # noqa: E731
        print(f"REF torch_sdpa_graph batch={batch} ctx={ctx} cache_copies={copies} "
              f"warm_graph_us={warm_graph * 1e3:.1f} warm_graph_pct_of_copy={pct(warm_graph):.1f}% "
              f"cold_one_us={cold_one * 1e3:.1f} cold_one_pct_of_copy={pct(cold_one):.1f}% "
              f"cold_graph_us={cold_graph * 1e3:.1f} cold_graph_pct_of_copy={pct(cold_graph):.1f}%")
        del kvs, calls


if __name__ == "__main__":
    main()
