"""Exports a LLaDA checkpoint (a Hugging Face directory) to ONNX with PyTorch, the way an app
developer's exporter would: static shapes, plain ONNX ops, optionally with external data.

The module below is LLaDA's published forward pass (RMSNorm, half-split rotary embedding,
bidirectional attention, SwiGLU) with parameters named as in the checkpoint. Beside the .onnx
file it copies the checkpoint's config and tokenizer files, as Hugging Face Optimum does, since
an ONNX graph carries neither. Example (what `tests/data/onnx/` holds):

    python tools/onnx/export_llada.py --model models/llada-tiny-tasks --out tests/data/onnx/inline
    python tools/onnx/export_llada.py --model models/llada-tiny-tasks --out tests/data/onnx/external --external-data
"""

import argparse
import json
import os
import shutil

import torch
import torch.nn as nn
from safetensors.torch import load_file

SIDECARS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def copy_sidecars(model, out):
    """The checkpoint's config and tokenizer files beside the export (an ONNX graph has neither)."""
    for f in SIDECARS:
        if os.path.exists(os.path.join(model, f)):
            shutil.copy(os.path.join(model, f), out)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["mlp_hidden_size"]
        self.heads = c["n_heads"]
        self.kv_heads = c.get("n_kv_heads") or self.heads
        self.hd = d // self.heads
        eps = c.get("rms_norm_eps", 1e-5)
        self.attn_norm, self.ff_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.hd, bias=False)
        self.attn_out = nn.Linear(self.heads * self.hd, d, bias=False)
        self.ff_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.ff_out = nn.Linear(f, d, bias=False)

    def rope(self, t, cos, sin):
        x1, x2 = t[..., : self.hd // 2], t[..., self.hd // 2 :]
        return t * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, 1)
            v = v.repeat_interleave(self.heads // self.kv_heads, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / (self.hd ** 0.5), -1) @ v
        x = x + self.attn_out(att.transpose(1, 2).reshape(B, T, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(nn.functional.silu(self.ff_proj(h)) * self.up_proj(h))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["embedding_size"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.ln_f = RMSNorm(c["d_model"], c.get("rms_norm_eps", 1e-5))
        self.ff_out = nn.Linear(c["d_model"], c["embedding_size"], bias=False)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = Transformer(c)


class LladaForOnnx(nn.Module):
    def __init__(self, c, seq_len):
        super().__init__()
        self.model = Model(c)
        hd = c["d_model"] // c["n_heads"]
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat([ang, ang], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([ang, ang], -1).sin(), persistent=False)

    def forward(self, input_ids):
        t = self.model.transformer
        x = t.wte(input_ids)
        for block in t.blocks:
            x = block(x, self.cos, self.sin)
        return t.ff_out(t.ln_f(x))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", required=True, help="Hugging Face LLaDA checkpoint directory")
    a.add_argument("--out", required=True, help="directory to write model.onnx and the sidecar files into")
    a.add_argument("--seq-len", type=int, default=64, help="the export's static sequence length")
    a.add_argument("--external-data", action="store_true", help="weights in model.onnx.data beside the graph")
    a.add_argument("--opset", type=int, default=18)
    a.add_argument("--torchscript", action="store_true", help="the older TorchScript exporter instead of dynamo")
    args = a.parse_args()

    c = json.load(open(os.path.join(args.model, "config.json")))
    if c.get("weight_tying") or c.get("include_bias") or c.get("block_type") != "llama":
        raise SystemExit("this exporter writes LLaDA's llama-type blocks without bias or weight tying")
    m = LladaForOnnx(c, args.seq_len).eval()
    state = load_file(os.path.join(args.model, "model.safetensors"))
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"checkpoint does not match the module: missing {missing}, unexpected {unexpected}")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.onnx")
    ids = torch.zeros((1, args.seq_len), dtype=torch.long)
    torch.onnx.export(m, (ids,), path, input_names=["input_ids"], output_names=["logits"], opset_version=args.opset,
                      dynamo=not args.torchscript, external_data=args.external_data)
    copy_sidecars(args.model, args.out)
    print(f"wrote {path} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
