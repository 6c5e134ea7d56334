#!/bin/bash
# Default model (SmolLM2-135M-Instruct Q4_1 GGUF) greedy tokens, CUDA vs CPU backend: 32 tokens of
# six prompts, batched and one at a time, on the GPU in bf16 (the default) and with --precision f32
# (f32-accurate products and KV cache, as the CPU). Usage (GPU machine, repository root):
#   kernels/bench/gpu-default-model.sh PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
# The GGUF (94 MiB) is more than one device call can carry, so it was carried in two halves
# (`split -n 2`) over two calls of one warm lease and joined on the machine; its SHA-256 is
# b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53.
# Log of the run quoted in README: kernels/bench/logs/gpu-default-model-2026-11-30T0326.log
M=${1:?usage: gpu-default-model.sh MODEL.gguf}
S=${SOV:-.gpu/sov}
export SOV_STATE_DIR=/tmp/sov-state
echo "sha256 $(sha256sum "$M" | cut -c1-64)"
P=(--prompt "The capital of France is" --prompt "Once upon a time" --prompt "def fibonacci(n):" --prompt "The theory of relativity" --prompt "1, 2, 3, 4," --prompt "In the beginning")
declare -A DEV=([cpu]="--device cpu" [cuda]="--device cuda" [cuda-f32]="--device cuda --precision f32")
for d in cpu cuda cuda-f32; do
  $S generate --model "$M" ${DEV[$d]} --checkpoint off --max-tokens 32 --json "${P[@]}" > /tmp/$d.json 2>/tmp/$d.err; echo "$d exit $?"
  for i in 0 2 4 6 8 10; do $S generate --model "$M" ${DEV[$d]} --checkpoint off --max-tokens 32 --json "${P[@]:$i:2}"; done > /tmp/$d-single.json 2>/dev/null
done
python3 - <<'PY'
import json
for gpu in ["cuda", "cuda-f32"]:
    for kind in ["", "-single"]:
        a = [json.loads(l) for l in open(f"/tmp/cpu{kind}.json")]
        b = [json.loads(l) for l in open(f"/tmp/{gpu}{kind}.json")]
        assert len(a) == len(b) == 6, (gpu, kind, len(a), len(b))
        for x, y in zip(a, b):
            n = next((i for i, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t), None)
            same = n is None and len(x["tokens"]) == len(y["tokens"])
            print(f"{gpu:8}", "batched" if not kind else "alone  ", "same 32" if same else f"DIFFER at token {n}",
                  repr(x["text"][:60]), "| gpu:", "" if same else repr(y["text"][:60]))
PY
