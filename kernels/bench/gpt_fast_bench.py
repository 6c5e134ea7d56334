"""Anchor for sov's Llama-3-8B decode benchmark: gpt-fast's own model (pytorch-labs/gpt-fast,
`model.py`'s `Transformer`, static KV cache, SDPA) with random bf16 weights, its greedy decode step
under `torch.compile(mode="reduce-overhead", fullgraph=True)` with the inductor settings of its
`generate.py`, timed over the decode loop alone (the prefill is not timed).

Reference: gpt-fast commit 32971d3 (its model.py imports only torch), PyTorch 2.11 on the device.
Nothing of gpt-fast is copied here: the script imports `model.py` from a checkout given on the
command line (the GPU machine has no network, so carry the checkout with the call).

Each batch size: a random prompt of PROMPT tokens is prefilled (eager), then WARMUP decode steps
(the compile happens in the first ones), then STEPS timed decode steps, each a forward of one token
per row and an argmax over the vocabulary, the next step's input the previous step's pick, as
gpt-fast's `decode_one_token` does with greedy sampling. The cache holds PROMPT + WARMUP + STEPS
positions (gpt-fast rounds it up to a multiple of 8) and every step attends over all of it, as in
gpt-fast. Prints one `REF gpt-fast` line a batch: ms a step and rows x steps / time in tok/s.

Usage (repository root or anywhere):
  python3 kernels/bench/gpt_fast_bench.py GPT_FAST_DIR [--batches 1,256] [--prompt 128]
      [--steps 256] [--warmup 10] [--model llama-3-8b | --tiny] [--device cuda] [--no-compile]
`--tiny` (2 layers, dim 64) and `--device cpu --no-compile` check the script on a CPU machine.
"""
import argparse
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpt_fast_dir", help="a checkout of pytorch-labs/gpt-fast (its model.py is imported)")
    ap.add_argument("--batches", default="1,256", help="comma-separated batch sizes")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens a row")
    ap.add_argument("--steps", type=int, default=256, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed decode steps first (compile)")
    ap.add_argument("--model", default="llama-3-8b", help="a name of gpt-fast's transformer_configs")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer dim-64 model (checks the script)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true", help="eager decode steps")
    args = ap.parse_args()
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        ap.error(f"--batches: not a list of integers: {args.batches!r}")
    if not args.batches or min(args.batches) < 1:
        ap.error("--batches: give at least one batch size, each >= 1")
    if args.prompt < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--prompt and --steps must be >= 1, --warmup >= 0")
    return args


def math_attention():
    """The SDPA backend gpt-fast's decode loop selects (math: inductor generates the attention)."""
    import torch

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    except ImportError:  # torch before 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False, enable_math=True)


def main():
    args = parse_args()
    sys.path.insert(0, args.gpt_fast_dir)
    import torch
    import torch._inductor.config as inductor

    try:
        from model import ModelArgs, Transformer
    except ImportError as e:
        sys.exit(f"cannot import gpt-fast's model.py from {args.gpt_fast_dir}: {e}")

    # generate.py's settings for its compiled decode step.
    inductor.coordinate_descent_tuning = True
    inductor.triton.unique_kernel_names = True
    inductor.fx_graph_cache = True

    if args.tiny:
        config = ModelArgs(block_size=1024, n_layer=2, n_head=4, n_local_heads=2, dim=64,
                           intermediate_size=128, vocab_size=1000)
    else:
        config = ModelArgs.from_name(args.model)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    t0 = time.time()
    with dev:
        model = Transformer(config)
    model = model.to(dtype=torch.bfloat16).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    print(f"REF gpt-fast model ready in {time.time() - t0:.1f}s ({config.n_layer} layers, dim {config.dim})",
          flush=True)

    def greedy_step(x, input_pos):
        logits = model(x, input_pos)
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(torch.int)

    step = greedy_step if args.no_compile else torch.compile(greedy_step, mode="reduce-overhead", fullgraph=True)
    positions = args.prompt + args.warmup + args.steps
    if positions > config.block_size:
        sys.exit(f"{positions} positions exceed the model's block size {config.block_size}")
    for batch in args.batches:
        with torch.no_grad(), dev:
            # setup_caches keeps caches at least as large; a smaller batch needs its own.
            model.max_batch_size = model.max_seq_length = -1
            model.setup_caches(max_batch_size=batch, max_seq_length=positions)
            ids = torch.randint(0, config.vocab_size, (batch, args.prompt), dtype=torch.int)
            logits = model(ids, torch.arange(args.prompt))
            token = torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(torch.int)
            pos = torch.tensor([args.prompt])
            t_compile = time.time()
            with math_attention():
                for _ in range(args.warmup):
                    token = step(token.clone(), pos)
                    pos += 1
                sync()
                warm_s = time.time() - t_compile
                t = time.time()
                for _ in range(args.steps):
                    token = step(token.clone(), pos)
                    pos += 1
                sync()
                dt = time.time() - t
        ms = dt / args.steps * 1e3
        print(f"REF gpt-fast batch {batch}: {ms:.2f} ms a step, {batch * args.steps / dt:.1f} tok/s "
              f"({args.steps} steps after {args.warmup} warm-up steps taking {warm_s:.1f} s; "
              f"cache of {model.max_seq_length} positions; {'eager' if args.no_compile else 'compiled'})",
              flush=True)
        # Each batch size sets up caches of its own size: drop the old ones, and the compiled graphs.
        del logits, token
        if not args.no_compile:
            torch._dynamo.reset()
            step = torch.compile(greedy_step, mode="reduce-overhead", fullgraph=True)


if __name__ == "__main__":
    main()
