#!/usr/bin/env python3
"""Writes runtime/src/cli/bench_stats_fixture.json: mean, median and percentiles of a few fixed
inputs as numpy computes them (np.mean, np.median, np.percentile with its default 'linear'
method), the reference for sov's bench statistics (vLLM's bench serve uses these numpy calls).

Reference: numpy 2.4.6 (`python3 -m pip install numpy==2.4.6`). Run from the repository root:
    python3 runtime/bench/percentile_fixture.py
"""
import json
import pathlib

import numpy as np

INPUTS = [
    [7.0],
    [1.0, 2.0, 3.0, 4.0],
    [3.5, -1.25, 10.0, 0.0, 2.0],
    [float(x) for x in np.random.default_rng(6962).gamma(2.0, 15.0, size=101).round(3)],
    [float(x) for x in np.random.default_rng(7).uniform(0.0, 400.0, size=64).round(3)],
]
PERCENTILES = [0.0, 25.0, 50.0, 90.0, 99.0, 100.0]

cases = []
for values in INPUTS:
    cases.append({
        "values": values,
        "mean": float(np.mean(values)),
        "median": float(np.median(values)),
        "percentiles": [[p, float(np.percentile(values, p))] for p in PERCENTILES],
    })
out = pathlib.Path(__file__).resolve().parents[1] / "src" / "cli" / "bench_stats_fixture.json"
out.write_text(json.dumps({"reference": f"numpy {np.__version__}", "cases": cases}, indent=1) + "\n")
print(f"wrote {out}")
