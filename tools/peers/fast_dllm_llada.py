"""Times Fast-dLLM's LLaDA samplers (its dual and prefix KV caches) in PyTorch on this machine.

Fast-dLLM's own code is loaded at run time from DIR, the `llada/` folder of its repository
(`generate.py` and `model/modeling_llada.py`); nothing of it is copied here. The prompt is the
one `tools/bench/mbsd.sh` gives llada-rt (32 ids), so the two are timed on the same work:

    python tools/peers/fast_dllm_llada.py --fast-dllm DIR --model /work/ckpt/llada-1b-bf16 \
        --cache dual --gen-len 128 --block-len 32 --steps 128 --threads 2

Prints one JSON object: the settings, seconds (the generation only, after one warm-up
generation of 8 tokens), and the output ids.
"""

import argparse
import json
import sys
import time

import torch


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--fast-dllm", required=True, help="the llada/ folder of Fast-dLLM's repository")
    a.add_argument("--model", required=True, help="a LLaDA checkpoint in Hugging Face layout")
    a.add_argument("--cache", choices=["dual", "prefix"], default="dual")
    a.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a.add_argument("--gen-len", type=int, default=128)
    a.add_argument("--block-len", type=int, default=32)
    a.add_argument("--steps", type=int, default=128)
    a.add_argument("--threads", type=int, default=2)
    args = a.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.fast_dllm)
    import generate as fast  # noqa: E402  (Fast-dLLM's llada/generate.py)

    model = fast.LLaDAModelLM.from_pretrained(args.model, torch_dtype=getattr(torch, args.dtype)).eval()
    mask_id = json.load(open(f"{args.model}/config.json")).get("mask_token_id", 126336)
    # The prompt of tools/bench/mbsd.sh.
    prompt = torch.tensor([[(i * 104729 + 7) % 126000 for i in range(32)]])
    run = fast.generate_with_dual_cache if args.cache == "dual" else fast.generate_with_prefix_cache
    with torch.no_grad():
        run(model, prompt, steps=8, gen_length=8, block_length=8, mask_id=mask_id)
        start = time.perf_counter()
        out = run(model, prompt, steps=args.steps, gen_length=args.gen_len, block_length=args.block_len, mask_id=mask_id)
        seconds = time.perf_counter() - start
    ids = out[0] if isinstance(out, tuple) else out
    print(json.dumps({"cache": args.cache, "dtype": args.dtype, "threads": args.threads, "gen_length": args.gen_len,
                      "block_length": args.block_len, "steps": args.steps, "seconds": seconds,
                      "output_ids": ids[0, prompt.shape[1]:].tolist()}))


if __name__ == "__main__":
    main()
