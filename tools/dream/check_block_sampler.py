#!/usr/bin/env python3
"""An independent numpy re-implementation of Fast-dLLM's block Dream sampler (prefix / dual cache), checked
against block_golden.json.

    python tools/dream/check_block_sampler.py --checkpoint CKPT [--modeling DIR]

The model is re-implemented here in numpy from model.safetensors + config.json (Qwen2-style layers, RoPE,
grouped-query attention, SwiGLU, RMSNorm), without the published code. A KV "cache" is emulated, not reused:
a cached pass computes fresh hidden states, keys and values only for its query span and takes the keys and
values of every other position from the full pass at the block start (for the prefix policy the span is
block + suffix, for the dual policy the block). The sampler follows the kit README's description. Every case
and edge case is replayed in float32 and in float64 (output_ids, step_reveals as sets, forward-call count).
A third variant, "nocache", replaces each cached pass with a plain full forward (fresh everything, the whole
sequence's shift): it shows how far the caches move the result. With --modeling DIR, the numpy forward is first
compared with the published model's plain forward (DreamModel(x).logits).
"""

import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sampler_numpy import timesteps_f32, transfer_count  # noqa: E402


class NumpyDream:
    def __init__(self, ckpt, dtype):
        cfg = json.load(open(os.path.join(ckpt, "config.json")))
        self.dt = dtype
        self.w = {k: v.astype(dtype) for k, v in load_file(os.path.join(ckpt, "model.safetensors")).items()}
        self.n_layers = cfg["num_hidden_layers"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg["hidden_size"] // self.nh
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]

    def rms(self, h, w):
        return w * (h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.dt(self.eps)))

    def rope(self, x, pos):  # x [n, heads, hd]
        inv = 1.0 / (self.theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd))
        f = np.outer(pos.astype(np.float64), inv)
        cos = np.cos(np.concatenate([f, f], -1)).astype(self.dt)[:, None, :]
        sin = np.sin(np.concatenate([f, f], -1)).astype(self.dt)[:, None, :]
        half = self.hd // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def forward(self, ids, q_pos, cache=None):
        """Logits [len(q_pos), V] (unshifted) and per-layer (K, V) over all positions. Without cache q_pos must be
        every position; with it, positions outside q_pos take their K/V from cache."""
        w, L = self.w, len(ids)
        h = w["model.embed_tokens.weight"][ids[q_pos]]
        kvs = []
        for l in range(self.n_layers):
            p = f"model.layers.{l}."
            x = self.rms(h, w[p + "input_layernorm.weight"])
            q = (x @ w[p + "self_attn.q_proj.weight"].T + w[p + "self_attn.q_proj.bias"]).reshape(-1, self.nh, self.hd)
            k = (x @ w[p + "self_attn.k_proj.weight"].T + w[p + "self_attn.k_proj.bias"]).reshape(-1, self.nkv, self.hd)
            v = (x @ w[p + "self_attn.v_proj.weight"].T + w[p + "self_attn.v_proj.bias"]).reshape(-1, self.nkv, self.hd)
            q, k = self.rope(q, q_pos), self.rope(k, q_pos)
            if cache is None:
                assert len(q_pos) == L
                K, V = k, v
            else:
                K, V = cache[l][0].copy(), cache[l][1].copy()
                K[q_pos], V[q_pos] = k, v
            kvs.append((K, V))
            g = self.nh // self.nkv
            out = np.empty_like(q)
            for hh in range(self.nh):
                s = q[:, hh] @ K[:, hh // g].T / self.dt(np.sqrt(self.hd))
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ V[:, hh // g]
            h = h + out.reshape(len(q_pos), -1) @ w[p + "self_attn.o_proj.weight"].T
            x = self.rms(h, w[p + "post_attention_layernorm.weight"])
            gate = x @ w[p + "mlp.gate_proj.weight"].T
            up = x @ w[p + "mlp.up_proj.weight"].T
            h = h + ((gate / (1 + np.exp(-gate))) * up) @ w[p + "mlp.down_proj.weight"].T
        h = self.rms(h, w["model.norm.weight"])
        return h @ w["lm_head.weight"].T, kvs


def shift(logits):
    """Dream's shift over whatever rows were computed: row 0 keeps its own logits, row j gets row j-1's."""
    return np.concatenate([logits[:1], logits[:-1]], 0)


def block_sample(m, prompt_ids, gen, block_length, steps, mask_id, eps, mode):
    dt = m.dt
    P = len(prompt_ids)
    x = np.array(list(prompt_ids) + [mask_id] * gen, dtype=np.int64)
    L = len(x)
    nb = gen // block_length
    spb = steps // nb
    ts = timesteps_f32(spb, eps)
    allpos = np.arange(L)
    reveals, n_fwd = [], 0

    def commit(pos_tok):
        reveals.append(sorted([int(p) - P, int(t)] for p, t in pos_tok))
        for p, t in pos_tok:
            x[p] = t

    for b in range(nb):
        a, e = P + b * block_length, P + (b + 1) * block_length
        logits, cache = m.forward(x, allpos)  # full pass, cache rebuilt
        n_fwd += 1
        commit([(a, int(shift(logits)[a].argmax()))])  # only the block's first position, argmax
        span = np.arange(a, e) if mode == "dual" else np.arange(a, L)
        i = 1
        while True:
            if mode == "nocache":
                sl = shift(m.forward(x, allpos)[0])[a:]
            else:
                sl = shift(m.forward(x, span, cache)[0])
            n_fwd += 1
            if i == spb:
                reveals.append([])
                break
            blk = sl[:block_length]
            mask = x[a:e] == mask_id
            z = blk[mask] - blk[mask].max(-1, keepdims=True)
            pr = np.exp(z)
            pr = pr / pr.sum(-1, keepdims=True)
            conf = np.sum(pr * np.log(pr + dt(1e-10)), -1)  # neg entropy whatever alg
            x0 = pr.argmax(-1)
            k = transfer_count(int(mask.sum()), i, spb, ts)
            idx = np.nonzero(mask)[0]
            sel = np.argsort(-conf, kind="stable")[:k]
            commit([(a + idx[s], x0[s]) for s in sel])
            i += 1
            if not (x[a:e] == mask_id).any():
                break
    return x[P:].tolist(), reveals, n_fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--modeling", help="published Dream code, to compare the numpy forward with it")
    args = ap.parse_args()
    g = json.load(open(os.path.join(args.checkpoint, "block_golden.json")))
    models = {"float32": NumpyDream(args.checkpoint, np.float32), "float64": NumpyDream(args.checkpoint, np.float64)}

    if args.modeling:
        import torch

        torch.set_num_threads(1)
        from dream_public import load_public_code

        modeling, _, _ = load_public_code(args.modeling)
        model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
        c = g["cases"][0]
        ids = np.array(c["prompt_ids"] + [g["mask_id"]] * 32)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double().numpy()
        for name, m in models.items():
            lg = m.forward(ids, np.arange(len(ids)))[0].astype(np.float64)
            print(f"numpy {name} forward vs published: max abs diff {np.abs(lg - ref).max():.2e}")

    for name, m in models.items():
        for mode_name in ("cache", "nocache"):
            ok = tot = 0
            bad = []
            for c in g["cases"] + g["edge_cases"]:
                mode = ("dual" if c["dual_cache"] else "prefix") if mode_name == "cache" else "nocache"
                out, rev, n_fwd = block_sample(
                    m, c["prompt_ids"], c["gen_length"], c["block_length"], c["steps"], c["mask_id"], c["eps"], mode
                )
                want = [sorted(r) for r in c["step_reveals"]]
                good = out == c["output_ids"] and rev == want and n_fwd == c["forward_calls"]
                tot += 1
                ok += good
                if not good:
                    bad.append(c["id"])
            print(f"{name} {mode_name}: {ok}/{tot} cases reproduce output_ids, step_reveals, forward_calls"
                  + (f"; differ: {bad[:6]}{' ...' if len(bad) > 6 else ''}" if bad else ""))


if __name__ == "__main__":
    main()
