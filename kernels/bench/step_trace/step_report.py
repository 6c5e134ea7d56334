"""Where a decode step's time goes, from a step_trace.c CSV (kernels as they ran, overlaps kept).

Usage: python3 step_report.py TRACE.csv [STEPS] [SKIP] [last|first]
Steps end at the greedy sampler (argmax_rows); the last STEPS (default 8) are read, after leaving
out the last SKIP (default 0: at a large batch the last steps run with fewer sequences). With
`first` the STEPS after the first SKIP are read instead: with every prompt arriving at once these
are prefill passes (the engine prefills every admitted prompt before its first decode step). A kernel's
"exposed" time is the part of its run that no earlier kernel of the step covers (start to end,
less what ends before the latest end so far): the exposed times and the idle gaps add up to the
step, so they say what a kernel costs the step, where its duration alone (Nsight Compute's view)
counts the overlap with its neighbours under programmatic dependent launch too.
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    from_start = len(sys.argv) > 4 and sys.argv[4] == "first"
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
    by = collections.defaultdict(lambda: [0, 0, 0, 0])  # duration, exposed, idle before, count
    for start, end, name, gx, gy in ks[first:last]:
        key = (name[:48], f"{gx}x{gy}")
        idle = max(0, start - frontier)
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


if __name__ == "__main__":
    main()
