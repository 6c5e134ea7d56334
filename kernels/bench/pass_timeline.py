#!/usr/bin/env python3
"""Where the host spends an eager pass (a prefill pass, a mixed step): the mean time between the
pass-boundary trace events sov writes with `--log sov::pass=trace`, pass after pass.

Why: a step trace (`gpu-step-trace.sh HOST=1`) shows the GPU idle about 1.4 ms before each prefill
pass of a 1000-request run while the launching thread is outside the CUDA driver; these events say
which part of sov's own host code that time is in. Events, in the order a pass emits them:
  model: step start                                  (the model gets the pass's chunks)
  model: planned, metadata uploaded                  (plan_step, the five metadata uploads)
  model: activations allocated, tokens uploaded      (then the first kernel is launched)
  model: layers enqueued                             (every layer's launches issued)
  runner: step enqueued                              (the head, the pick launches)
  runner: picks downloaded                           (the host has waited for the pass)
  engine: prefill pass returned
  engine: prefill rows advanced                      (first tokens, events, retirements)
Decode steps replayed from CUDA graphs emit none of them.

Usage (any machine; the log is sov's stderr):
  sov bench ... --log sov::pass=trace 2> pass.log
  python3 kernels/bench/pass_timeline.py pass.log [SKIP] [PASSES]
SKIP passes (default 8: start-up, first shapes) are left out, then PASSES (default 32) are read.
"""
import collections
import datetime
import re
import sys

LINE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+TRACE\s+sov::pass:\s+(.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
START = "model: step start"


def events(path):
    out = []
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.search(ANSI.sub("", raw))
            if m:
                t = datetime.datetime.fromisoformat(m.group(1))
                out.append((t.timestamp() * 1e6, m.group(2).strip()))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    ev = events(sys.argv[1])
    starts = [i for i, (_, what) in enumerate(ev) if what == START]
    if len(starts) < skip + 2:
        sys.exit(f"{sys.argv[1]}: {len(starts)} passes, {skip + 2} needed")
    cycles = list(zip(starts[skip:], starts[skip + 1 :]))[:count]
    deltas = collections.defaultdict(list)
    for a, b in cycles:
        seg = ev[a : b + 1]
        for (t0, w0), (t1, w1) in zip(seg, seg[1:]):
            deltas[(w0, w1)].append(t1 - t0)
    print(f"{sys.argv[1]}: {len(cycles)} passes after the first {skip}, us between events")
    print(f"  {'mean':>9} {'median':>9} {'n':>4}  from -> to")
    for (w0, w1), v in deltas.items():
        v = sorted(v)
        print(f"  {sum(v) / len(v):9.1f} {v[len(v) // 2]:9.1f} {len(v):4d}  {w0} -> {w1}")


if __name__ == "__main__":
    main()
