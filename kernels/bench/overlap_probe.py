"""Probe: would two halves of a decode batch on two streams, one half's attention beside the other
half's products, beat running the whole batch one kernel after another?

One decode layer of the Llama-3-8B shape at `rows` rows (argument, default 1024): the FP8 qkv, o,
gate/up and down products (torch._scaled_mm, cuBLASLt, e4m3 with per-row / per-column scales) and
an attention stand-in that reads the layer's KV bytes once (e4m3, 8 kv heads x 128, context 320:
the middle of a 128 + 256 run) with a row-sum reduction, as memory-bound as sov's decode attention.
Every variant is captured into a CUDA graph of 16 layers and replayed; it prints us a layer:
- gemms only, attn only: each part alone (full batch);
- sequential full: the whole batch, products and attention in turn (what sov runs);
- sequential halves: two halves one after the other on one stream (the cost of halving M);
- two streams free: half A on the main stream, half B on a second one, no ordering between them;
- two streams ping-pong: B half a layer behind A, each half's attention after the other's (events),
  so that each attention runs beside the other half's products.

With `--grid G[,G...]` the attention stand-in is instead a Triton kernel of G persistent programs
(a grid sized to hold the attention to a few SMs, each program keeping 4 loads of 32 KiB in flight),
and `--carveout C` asks cuBLASLt to plan the products for C SMs fewer
(torch._C._set_sm_carveout_experimental, cuBLASLt's SM count target), so that the products and a
small-grid attention could run side by side; each grid also prints its read rate alone.

Reference: PyTorch 2.11 (cu130), Triton 3.6 on the device.
Usage: python3 overlap_probe.py [rows] [--grid G[,G...]] [--carveout C[,C...]]
"""
import argparse

import torch

DEV = "cuda"
HIDDEN, FFN, QKV = 4096, 14336, 6144
SHAPES = {"qkv": (HIDDEN, QKV), "o": (HIDDEN, HIDDEN), "gate_up": (HIDDEN, 2 * FFN), "down": (FFN, HIDDEN)}
KV_BYTES_PER_ROW = 320 * 8 * 128 * 2  # context 320, 8 kv heads, head_dim 128, K and V, e4m3
LAYERS = 16
READER = {"grid": 0, "out": None}  # the attention stand-in: 0 = torch's row sums, else Triton's grid


def stream_read(src, grid, out):
    """Reads every byte of `src` ([n] f32, n a multiple of 4 * BLOCK) with `grid` programs."""
    from triton_reader import stream_sum  # the kernel needs Triton only when a grid is asked for

    n = src.numel()
    stream_sum[(grid,)](src.view(torch.int32), out, n // (4 * 8192), GRID=grid, BLOCK=8192, num_warps=8)


class Rows:
    """The inputs, weights and KV stand-in of `m` rows of one layer."""

    def __init__(self, m):
        self.x, self.w = {}, {}
        for name, (k, n) in SHAPES.items():
            x = torch.randn(m, k, device=DEV).to(torch.float8_e4m3fn)  # [m, k]
            w = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)  # [n, k], used as [k, n]
            self.x[name] = (x, torch.ones(m, 1, device=DEV))
            self.w[name] = (w.t(), torch.ones(1, n, device=DEV))
        # [m * KV_BYTES_PER_ROW / 4] f32 of random bits, read once an "attention"
        self.kv = torch.randint(0, 100, (m * KV_BYTES_PER_ROW // 4,), device=DEV, dtype=torch.int32).view(torch.float32)

    def product(self, name):
        (x, sx), (w, sw) = self.x[name], self.w[name]
        torch._scaled_mm(x, w, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

    def attention(self):
        if READER["grid"]:
            stream_read(self.kv, READER["grid"], READER["out"])
        else:
            self.kv.view(-1, 4096).sum(dim=1)

    def before_attention(self):
        self.product("qkv")

    def after_attention(self):
        for name in ("o", "gate_up", "down"):
            self.product(name)


def graph_us(fn, reps=10):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture (cuBLASLt workspaces, allocator)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000 / LAYERS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="?", type=int, default=1024)
    parser.add_argument("--grid", default="0", help="programs of the Triton reader (0: torch sum)")
    parser.add_argument("--carveout", default="0", help="SMs the products leave free")
    args = parser.parse_args()
    rows = args.rows
    torch.manual_seed(0)
    full, a, b = Rows(rows), Rows(rows // 2), Rows(rows // 2)
    side = torch.cuda.Stream()

    def layer(h):
        h.before_attention()
        h.attention()
        h.after_attention()

    def gemms_only():
        for _ in range(LAYERS):
            full.before_attention()
            full.after_attention()

    def attn_only():
        for _ in range(LAYERS):
            full.attention()

    def sequential_full():
        for _ in range(LAYERS):
            layer(full)

    def sequential_halves():
        for _ in range(LAYERS):
            layer(a)
            layer(b)

    def two_streams_free():
        main_stream = torch.cuda.current_stream()
        side.wait_stream(main_stream)
        for _ in range(LAYERS):
            layer(a)
            with torch.cuda.stream(side):
                layer(b)
        main_stream.wait_stream(side)

    def two_streams_ping_pong():
        main_stream = torch.cuda.current_stream()
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            b.before_attention()
        for i in range(LAYERS):
            a.before_attention()
            a_attended = torch.cuda.Event()
            a.attention()
            a_attended.record(main_stream)
            with torch.cuda.stream(side):
                side.wait_event(a_attended)  # B's attention after A's, beside A's products
                b.attention()
                b_attended = torch.cuda.Event()
                b_attended.record(side)
                b.after_attention()
                if i + 1 < LAYERS:
                    b.before_attention()
            a.after_attention()
            main_stream.wait_event(b_attended)  # A's next attention after B's
        main_stream.wait_stream(side)

    variants = [
        ("gemms only", gemms_only),
        ("attn only", attn_only),
        ("sequential full", sequential_full),
        ("sequential halves", sequential_halves),
        ("two streams free", two_streams_free),
        ("two streams ping-pong", two_streams_ping_pong),
    ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    READER["out"] = torch.empty(max(int(g) for g in args.grid.split(",")) * 8192, device=DEV)  # [grid * 8192]
    baseline = None
    for carveout in (int(c) for c in args.carveout.split(",")):
        if carveout:
            if not hasattr(torch._C, "_set_sm_carveout_experimental"):
                print("this torch has no SM carveout; skipped")
                continue
            torch._C._set_sm_carveout_experimental(carveout)
        for grid in (int(g) for g in args.grid.split(",")):
            READER["grid"] = grid
            res = {name: graph_us(fn) for name, fn in variants}
            if baseline is None:
                baseline = res["sequential full"]
            read_tbs = full.kv.numel() * 4 / res["attn only"] / 1e6
            print(
                f"rows {rows}, grid {grid or 'torch'}, carveout {carveout} of {sms} SMs, us a layer "
                "(graphs): " + ", ".join(f"{k} {v:.1f}" for k, v in res.items())
            )
            print(
                f"  reads alone {read_tbs:.2f} TB/s; first sequential full / ping-pong "
                f"{baseline / res['two streams ping-pong']:.3f}, / free {baseline / res['two streams free']:.3f}"
            )
        if carveout:
            torch._C._set_sm_carveout_experimental(None)


if __name__ == "__main__":
    main()
