"""The attention stand-in of `overlap_probe.py --grid G`: a persistent Triton kernel whose G
programs read a buffer once, 4 independent 32 KiB loads a program in flight, and sum it (so the
loads are not optimised away). A grid of few programs holds the reads to few SMs.

Reference: Triton 3.6 on the device.
"""
import triton
import triton.language as tl


@triton.jit
def stream_sum(src, out, groups, GRID: tl.constexpr, BLOCK: tl.constexpr):
    # src: [groups * 4 * BLOCK] int32; out: [GRID * BLOCK] f32, one partial row a program
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for g in range(pid, groups, GRID):
        base = src + g.to(tl.int64) * (4 * BLOCK)
        a = tl.load(base + offs, cache_modifier=".cg")
        b = tl.load(base + BLOCK + offs, cache_modifier=".cg")
        c = tl.load(base + 2 * BLOCK + offs, cache_modifier=".cg")
        d = tl.load(base + 3 * BLOCK + offs, cache_modifier=".cg")
        acc += (a ^ b) + (c ^ d)
    tl.store(out + pid * BLOCK + offs, acc.to(tl.float32))
