#!/usr/bin/env python3
"""Which linear products lose perplexity under FP8 W8A8: a numpy forward of a Llama GGUF, outside sov.

Why: `sov perplexity --quantization fp8` measured +3.6% over bf16 on the default model (H200); this
finds where, by quantizing chosen products of chosen layers. It is also an independent perplexity
of the GGUF itself: its `f32` case should match sov's CPU figure, its `bf16` case sov's GPU one.

References (none of them sov): the GGUF definitions through the `gguf` Python package 0.19.0
(`GGUFReader`, `gguf.quants.dequantize`), e4m3 through `ml_dtypes` 0.7.0 (`float8_e4m3fn`, round
to nearest even), numpy 2.4.6. The FP8 math is the scheme of `kernels/cuda/fp8.cu`: weights bf16,
then e4m3 with one scale per output channel (absmax / 448); inputs e4m3 with one scale per token
(row absmax / 448); products in f32 times both scales. `bf16` rounds every product's inputs to
bf16 (as sov's GPU bf16 path does), `f32` keeps them (as sov's CPU does). Windows as `sov
perplexity`: `--window` tokens each from position 0, every token after the first scored.

Usage (repository root; about a minute a case for the default model on 2 cores):
  sov perplexity --text runtime/bench/texts/plain-english.txt --device cpu --token-ids /tmp/ids.json
  python3 runtime/bench/fp8_sensitivity.py ~/.cache/sov/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/ids.json \
      f32 bf16 "fp8 all" "fp8 but layer 0 and last"
Results of 2026-12-04 are in runtime/BENCHMARKS.md (Perplexity).
"""
import argparse
import json
import sys
import time

import gguf
import ml_dtypes
import numpy as np


def load(path):
    r = gguf.GGUFReader(path)

    def meta(key, default=None):
        if key not in r.fields:
            if default is None:
                raise SystemExit(f"{path}: no {key}")
            return default
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return v.tolist()[0] if len(v) == 1 else bytes(v).decode()

    arch = meta("general.architecture")
    cfg = {
        "layers": meta(f"{arch}.block_count"),
        "heads": meta(f"{arch}.attention.head_count"),
        "kv_heads": meta(f"{arch}.attention.head_count_kv"),
        "hidden": meta(f"{arch}.embedding_length"),
        "eps": meta(f"{arch}.attention.layer_norm_rms_epsilon"),
        "theta": meta(f"{arch}.rope.freq_base", 10000.0),
    }
    weights = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists dims innermost first
        weights[t.name] = a.reshape(shape)
    return cfg, weights


def bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def e4m3_rows(x):
    """x [rows, k] as e4m3 codes (widened back to f32) and one scale per row: absmax / 448."""
    s = np.abs(x).max(axis=1, keepdims=True) / 448.0
    s = np.where(s == 0, 1.0, s).astype(np.float32)
    return (x / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32), s


class Model:
    def __init__(self, cfg, weights, mode):
        """mode(layer, product) -> 'f32' | 'bf16' | 'fp8' | 'fp8 bf16 out' (the FP8 product's
        output rounded to bf16, as sov's gate/up with CudaTuning::fp8_gate_up_bf16 and its o and
        down with CudaTuning::fp8_delta_bf16); product in qkv, o, gate_up, down."""
        self.c, self.w, self.mode, self.wq = cfg, weights, mode, {}

    def linear(self, x, name, layer, product):
        w = self.w[name]
        how = self.mode(layer, product)
        if how == "f32":
            return x @ w.T
        if how == "bf16":
            return bf16(x) @ bf16(w).T
        if name not in self.wq:
            self.wq[name] = e4m3_rows(bf16(w))
        qw, sw = self.wq[name]
        qx, sx = e4m3_rows(x)
        y = (qx @ qw.T) * sx * sw.T
        return bf16(y) if how == "fp8 bf16 out" else y

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.c["eps"]) * w

    def rope(self, x, pos):
        """x [T, heads, hd]: interleaved pairs, GGUF's llama layout of q and k."""
        hd = x.shape[-1]
        inv = self.c["theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = pos[:, None] * inv[None, :]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def logits(self, ids):
        c, W = self.c, self.w
        H, KV, D = c["heads"], c["kv_heads"], c["hidden"]
        hd, T = D // H, len(ids)
        x = W["token_embd.weight"][ids].copy()
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for l in range(c["layers"]):
            p = f"blk.{l}."
            h = self.rms(x, W[p + "attn_norm.weight"])
            q = self.linear(h, p + "attn_q.weight", l, "qkv").reshape(T, H, hd)
            k = self.linear(h, p + "attn_k.weight", l, "qkv").reshape(T, KV, hd)
            v = self.linear(h, p + "attn_v.weight", l, "qkv").reshape(T, KV, hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
            att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att, v).reshape(T, D)
            x = x + self.linear(o, p + "attn_output.weight", l, "o")
            h = self.rms(x, W[p + "ffn_norm.weight"])
            g = self.linear(h, p + "ffn_gate.weight", l, "gate_up")
            u = self.linear(h, p + "ffn_up.weight", l, "gate_up")
            x = x + self.linear(g / (1 + np.exp(-g)) * u, p + "ffn_down.weight", l, "down")
        x = self.rms(x, W["output_norm.weight"])
        head = W.get("output.weight", W["token_embd.weight"])
        how = self.mode(None, "lm_head")
        if how in ("f32", "bf16"):
            return x @ head.T if how == "f32" else bf16(x) @ bf16(head).T
        return self.linear(x, "output.weight" if "output.weight" in W else "token_embd.weight", None, "lm_head")


def perplexity(model, tokens, window):
    nll, n = 0.0, 0
    for i in range(0, len(tokens), window):
        part = tokens[i : i + window]
        if len(part) < 2:
            continue
        lg = model.logits(np.array(part)).astype(np.float64)
        lg -= lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nll -= sum(lp[t, part[t + 1]] for t in range(len(part) - 1))
        n += len(part) - 1
    return float(np.exp(nll / n)), n


def cases(last):
    fp8_unless = lambda keep: lambda l, w: "bf16" if l is None or keep(l, w) else "fp8"
    return {
        "f32": lambda l, w: "f32",
        "bf16": lambda l, w: "bf16",
        "fp8 all": fp8_unless(lambda l, w: False),
        "fp8 but down": fp8_unless(lambda l, w: w == "down"),
        "fp8 but o": fp8_unless(lambda l, w: w == "o"),
        "fp8 but qkv": fp8_unless(lambda l, w: w == "qkv"),
        "fp8 but gate_up": fp8_unless(lambda l, w: w == "gate_up"),
        "fp8 down only": fp8_unless(lambda l, w: w != "down"),
        "fp8 but layer 0": fp8_unless(lambda l, w: l == 0),
        "fp8 but last layer": fp8_unless(lambda l, w: l == last),
        "fp8 but layer 0 and last": fp8_unless(lambda l, w: l in (0, last)),
        "fp8 but gate_up of 0 and last": fp8_unless(lambda l, w: w == "gate_up" and l in (0, last)),
        "fp8 but layers 0, 1 and last": fp8_unless(lambda l, w: l in (0, 1, last)),
        # sov's FP8 default: edge layers in bf16, the gate/up product written in bf16.
        "fp8 but layer 0 and last, gate_up out bf16": lambda l, w: (
            "bf16" if l is None or l in (0, last) else "fp8 bf16 out" if w == "gate_up" else "fp8"
        ),
        # The same with the o and down products (the residual's deltas) written in bf16 too
        # (CudaTuning::fp8_delta_bf16, since stop 56).
        "fp8 but layer 0 and last, gate_up, o and down out bf16": lambda l, w: (
            "bf16" if l is None or l in (0, last) else "fp8 bf16 out" if w in ("gate_up", "o", "down") else "fp8"
        ),
        # The same with the lm head an FP8 W8A8 product too.
        "fp8 but layer 0 and last, gate_up out bf16, lm head fp8": lambda l, w: (
            "fp8" if w == "lm_head" else "bf16" if l is None or l in (0, last) else "fp8 bf16 out" if w == "gate_up" else "fp8"
        ),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", help="a Llama-family GGUF file")
    ap.add_argument("token_ids", help="JSON array of token ids (`sov perplexity --token-ids`)")
    ap.add_argument("cases", nargs="*", help="cases to run (default: all); the first is the base")
    ap.add_argument("--window", type=int, default=512)
    args = ap.parse_args()
    cfg, weights = load(args.gguf)
    tokens = json.load(open(args.token_ids))
    table = cases(cfg["layers"] - 1)
    unknown = [c for c in args.cases if c not in table]
    if unknown:
        sys.exit(f"unknown cases {unknown}; known: {list(table)}")
    base = None
    for name in args.cases or list(table):
        t0 = time.time()
        p, n = perplexity(Model(cfg, weights, table[name]), tokens, args.window)
        base = base or p
        print(f"{name:30s} {p:.4f} over {n} tokens ({p / base - 1:+.2%} vs the first) {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
