"""Where a decode step's time goes, from a step_trace.c CSV (kernels as they ran, overlaps kept).

Usage: python3 step_report.py TRACE.csv [STEPS] [SKIP] [last|first] [HOST.csv]
Steps end at the greedy sampler (argmax_rows); the last STEPS (default 8) are read, after leaving
out the last SKIP (default 0: at a large batch the last steps run with fewer sequences). With
`first` the STEPS after the first SKIP are read instead: with every prompt arriving at once these
are prefill passes (the engine prefills every admitted prompt before its first decode step). A kernel's
"exposed" time is the part of its run that no earlier kernel of the step covers (start to end,
less what ends before the latest end so far): the exposed times and the idle gaps add up to the
step, so they say what a kernel costs the step, where its duration alone (Nsight Compute's view)
counts the overlap with its neighbours under programmatic dependent launch too.
With HOST.csv (step_trace.c's STEP_TRACE_HOST file) it also says what filled the idle gaps of
those steps of 20 us or more: the memsets and copies the GPU ran in them, and the launching
thread's time (the thread of the cuLaunchKernel calls) inside each driver call and outside the
driver (its own host work, or waiting for a thread that is not in the driver either).
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    from_start = len(sys.argv) > 4 and sys.argv[4] == "first"
    host_path = sys.argv[5] if len(sys.argv) > 5 else None
    ks = []
    with open(path) as f:
        for r in csv.DictReader(f):
            ks.append((int(r["start_ns"]), int(r["end_ns"]), r["name"], r["grid_x"], r["grid_y"]))
    ks.sort()
    ends = [i for i, k in enumerate(ks) if k[2].startswith("argmax_rows")]
    if len(ends) <= steps + skip:
        print(f"{path}: {len(ends)} steps found, {steps + skip + 1} needed")
        return
    ends = ends[skip : skip + steps + 1] if from_start else ends[: len(ends) - skip]
    first, last = ends[-steps - 1] + 1, ends[-1] + 1
    frontier = ks[first - 1][1]
    t0 = frontier
    gaps = []  # (start, end) of each idle interval of the steps read
    by = collections.defaultdict(lambda: [0, 0, 0, 0])  # duration, exposed, idle before, count
    for start, end, name, gx, gy in ks[first:last]:
        key = (name[:48], f"{gx}x{gy}")
        idle = max(0, start - frontier)
        if idle >= GAP_NS:
            gaps.append((frontier, start))
        exposed = max(0, end - max(frontier, start))
        e = by[key]
        e[0] += end - start
        e[1] += exposed
        e[2] += idle
        e[3] += 1
        frontier = max(frontier, end)
    span = (frontier - t0) / steps / 1e3
    busy = sum(v[1] for v in by.values()) / steps / 1e3
    idle = sum(v[2] for v in by.values()) / steps / 1e3
    where = f"{skip} after the first" if from_start else f"{skip} before the last"
    print(f"{path}: {steps} steps ({where}), {span:.1f} us a step = {busy:.1f} exposed + {idle:.1f} idle, "
          f"{(last - first) / steps:.0f} kernels a step")
    print(f"  {'exposed':>9} {'idle':>7} {'duration':>9} {'count':>6}  kernel (grid)")
    for (name, grid), (dur, exp, idl, c) in sorted(by.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"  {exp / steps / 1e3:9.1f} {idl / steps / 1e3:7.1f} {dur / c / 1e3:9.2f} {c / steps:6.1f}  {name} ({grid})")
    if host_path:
        report_gaps(host_path, gaps, steps)


GAP_NS = 20_000


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def report_gaps(host_path, gaps, steps):
    """What the GPU and the launching thread did inside `gaps` (idle intervals of the steps read)."""
    recs = []
    with open(host_path) as f:
        for r in csv.DictReader(f):
            recs.append((r["kind"], int(r["start_ns"]), int(r["end_ns"]), r["thread"], int(r["bytes"]), r["name"]))
    launches = collections.Counter(r[3] for r in recs if r[0] == "api" and r[5].startswith("cuLaunch"))
    if not launches:
        print(f"{host_path}: no kernel launches recorded")
        return
    thread = launches.most_common(1)[0][0]
    total = sum(b - a for a, b in gaps)
    print(f"idle gaps of {GAP_NS // 1000} us or more: {len(gaps) / steps:.1f} a step, {total / steps / 1e3:.1f} us a step; "
          f"launching thread {thread}")
    gpu = collections.defaultdict(lambda: [0, 0, 0])  # time, count, bytes
    api = collections.defaultdict(lambda: [0, 0])  # time, count
    outside = 0
    for a, b in gaps:
        spans = []
        for kind, s0, s1, th, nbytes, name in recs:
            o = overlap(a, b, s0, s1)
            if o == 0:
                continue
            if kind != "api":
                e = gpu[name]
                e[0] += o
                e[1] += 1
                e[2] += nbytes
            elif th == thread:
                e = api[name]
                e[0] += o
                e[1] += 1
                spans.append((max(a, s0), min(b, s1)))
        covered, reach = 0, a
        for s0, s1 in sorted(spans):  # the union of the thread's driver calls inside the gap
            if s1 > reach:
                covered += s1 - max(s0, reach)
                reach = s1
        outside += (b - a) - covered
    print(f"  {'us a step':>10} {'a step':>7}  in the gaps")
    for name, (t, c, nbytes) in sorted(gpu.items(), key=lambda kv: -kv[1][0]):
        print(f"  {t / steps / 1e3:10.1f} {c / steps:7.1f}  GPU {name} ({nbytes / c / 1e6:.1f} MB each)")
    print(f"  {outside / steps / 1e3:10.1f} {'':>7}  launching thread outside the driver")
    for name, (t, c) in sorted(api.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"  {t / steps / 1e3:10.1f} {c / steps:7.1f}  launching thread in {name}")


if __name__ == "__main__":
    main()
