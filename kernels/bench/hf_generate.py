"""Reference for sov's Llama-3-8B decode benchmark: Hugging Face transformers `generate` on the
Llama-3-8B shape with random bf16 weights, prompt 128, 256 new tokens (EOS ignored via
min_new_tokens), greedy, eager attention, at batch 1 / 16 / 64 / 256.

Reference: transformers 5.17, PyTorch 2.11 (cu130) on the device. Prints `REF hf_generate ...`.
Usage: python3 hf_generate.py [batch ...]
"""
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    batches = [int(b) for b in sys.argv[1:]] or [1, 16, 64, 256]
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.eval()
    print(f"REF hf model ready in {time.time() - t0:.1f}s", flush=True)
    prompt, new = 128, 256
    for batch in batches:
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
        kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        model.generate(ids[:, :16], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        torch.cuda.synchronize()
        t = time.time()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
        dt = time.time() - t
        made = out.shape[1] - prompt
        print(f"REF hf_generate batch={batch} prompt={prompt} new={made} total_s={dt:.3f} "
              f"tok_per_s={batch * made / dt:.1f}", flush=True)


if __name__ == "__main__":
    main()
