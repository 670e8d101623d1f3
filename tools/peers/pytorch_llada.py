"""Times the official LLaDA sampler in PyTorch on this machine: the peer llada is compared with.

The forward pass is written here from LLaDA's published architecture (RMSNorm, half-split
rotary embedding, bidirectional attention through scaled_dot_product_attention, SwiGLU), on the
checkpoint's weights; the sampling loop follows the official `generate()` (semi-autoregressive
blocks, low-confidence remasking, full logits every step). Example:

    python tools/peers/pytorch_llada.py --model /path/to/llada-1b --dtype bfloat16 \
        --prompt-len 32 --gen-len 128 --block-len 32 --steps 128 --threads 2
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def load_weights(path, dtype):
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weights = {}
    for f in files:
        weights.update({k: v.to(dtype) for k, v in load_file(os.path.join(path, f)).items()})
    return weights


class Llada:
    def __init__(self, path, dtype):
        self.cfg = json.load(open(os.path.join(path, "config.json")))
        self.w = load_weights(path, dtype)
        c = self.cfg
        self.heads, self.kv_heads = c["n_heads"], c.get("n_kv_heads") or c["n_heads"]
        self.hd = c["d_model"] // self.heads
        self.eps = c.get("rms_norm_eps", 1e-5)
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(c["max_sequence_length"], dtype=torch.float32), inv)
        self.cos, self.sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def rope(self, t):
        T = t.shape[-2]
        cos, sin = self.cos[:T].to(t.dtype), self.sin[:T].to(t.dtype)
        x1, x2 = t[..., : self.hd // 2], t[..., self.hd // 2 :]
        return t * cos + torch.cat([-x2, x1], -1) * sin

    @torch.inference_mode()
    def forward(self, ids):
        w, B, T = self.w, ids.shape[0], ids.shape[1]
        x = w["model.transformer.wte.weight"][ids]
        for l in range(self.cfg["n_layers"]):
            p = f"model.transformer.blocks.{l}."
            h = self.norm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "q_proj.weight"].T).view(B, T, self.heads, self.hd).transpose(1, 2)
            k = (h @ w[p + "k_proj.weight"].T).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            v = (h @ w[p + "v_proj.weight"].T).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            q, k = self.rope(q), self.rope(k)
            if self.kv_heads != self.heads:
                k = k.repeat_interleave(self.heads // self.kv_heads, 1)
                v = v.repeat_interleave(self.heads // self.kv_heads, 1)
            att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, -1)
            x = x + att @ w[p + "attn_out.weight"].T
            h = self.norm(x, w[p + "ff_norm.weight"])
            x = x + (F.silu(h @ w[p + "ff_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "ff_out.weight"].T
        return self.norm(x, w["model.transformer.ln_f.weight"]) @ w["model.transformer.ff_out.weight"].T


@torch.inference_mode()
def generate(model, prompt, steps, gen_length, block_length, mask_id, max_steps=None):
    """The official sampler at temperature 0 with low-confidence remasking."""
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    blocks = gen_length // block_length
    per_block = steps // blocks
    done = 0
    for b in range(blocks):
        start, end = prompt.shape[1] + b * block_length, prompt.shape[1] + (b + 1) * block_length
        m = (x[:, start:end] == mask_id).sum().item()
        counts = [m // per_block + (1 if i < m % per_block else 0) for i in range(per_block)]
        for k in counts:
            mask_index = x == mask_id
            logits = model.forward(x)
            x0 = logits.argmax(-1)
            p = F.softmax(logits.float(), -1)
            conf = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
            conf[:, end:] = -float("inf")
            conf = torch.where(mask_index, conf, torch.tensor(-float("inf")))
            x0 = torch.where(mask_index, x0, x)
            sel = torch.topk(conf[0], k).indices
            x[0, sel] = x0[0, sel]
            done += 1
            if max_steps and done >= max_steps:
                return x, done
    return x, done


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True)
    a.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a.add_argument("--prompt-len", type=int, default=32)
    a.add_argument("--gen-len", type=int, default=128)
    a.add_argument("--block-len", type=int, default=32)
    a.add_argument("--steps", type=int, default=128)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (time scaled to all)")
    args = a.parse_args()
    torch.set_num_threads(args.threads)
    model = Llada(args.model, getattr(torch, args.dtype))
    vocab = model.cfg["vocab_size"]
    prompt = torch.tensor([[(i * 104729 + 7) % vocab for i in range(args.prompt_len)]])
    model.forward(prompt)  # warm up
    t = time.perf_counter()
    _, done = generate(model, prompt, args.steps, args.gen_len, args.block_len, model.cfg.get("mask_token_id", 126336), args.max_steps)
    secs = time.perf_counter() - t
    print(json.dumps({"torch": torch.__version__, "threads": args.threads, "dtype": args.dtype, "steps_run": done,
                      "seconds": secs, "seconds_per_step": secs / done, "seconds_all_steps": secs / done * args.steps,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    main()
