#!/usr/bin/env python3
"""An independent numpy re-implementation of the Dream sampler's step rule, checked against golden.json.

    python tools/dream/check_sampler_numpy.py --modeling DIR --checkpoint CKPT [--case ID | --all]

The published model is used only as the logits oracle (model(x).logits, float32); everything else, the
timesteps, the transfer counts, the shift, the confidences, the top-k selection and the update, is written
here in numpy without the published generation code, following the spec in the kit's README. It replays one
case (default p0_g32_s8_entropy) or all greedy cases, and compares output_ids, step_reveals and transfer_counts
with golden.json. It also checks, for a grid of lengths and step counts, that the float32 transfer schedule
below equals torch's (torch.linspace & 0-dim float32 tensor arithmetic) and reports where it differs from the
same formula in float64.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dream_public import load_public_code  # noqa: E402

f32, f64 = np.float32, np.float64


def timesteps_f32(steps, eps):
    """torch.linspace(1, eps, steps+1) in float32 as the CPU kernel computes it: step = (end-start)/(n-1) in
    float32, then start + step*i for i < n//2 and end - step*(n-1-i) above, each rounded once (fused)."""
    n = steps + 1
    start, end = f32(1.0), f32(eps)
    step = f32((end - start) / f32(n - 1))
    out = [f32(f64(start) + f64(step) * i) if i < n // 2 else f32(f64(end) - f64(step) * (n - 1 - i)) for i in range(n)]
    return np.array(out, dtype=np.float32)


def transfer_count(n_mask, i, steps, ts):
    """number_transfer_tokens = int(num_mask * (1 - s/t)) in float32 (all remaining at the last step)."""
    if i == steps - 1:
        return int(n_mask)
    t, s = ts[i], ts[i + 1]
    return int(f32(f32(n_mask) * f32(f32(1.0) - f32(s / t))))


def transfer_count_f64(n_mask, i, steps, eps):
    if i == steps - 1:
        return n_mask
    t = 1 - (1 - eps) * i / steps
    s = 1 - (1 - eps) * (i + 1) / steps
    return int(n_mask * (1 - s / t))


def confidences(logits, alg, dtype):
    """logits: [n_masked, vocab] float32. Returns (confidence, argmax token)."""
    z = logits.astype(dtype)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=-1, keepdims=True)
    x0 = p.argmax(axis=-1)
    if alg == "maskgit_plus":
        c = p.max(axis=-1)
    elif alg == "topk_margin":
        sp = -np.sort(-p, axis=-1)
        c = sp[:, 0] - sp[:, 1]
    elif alg == "entropy":
        c = np.sum(p * np.log(p + dtype(1e-10)), axis=-1)
    else:
        raise ValueError(alg)
    return c, x0


def sample(forward, prompt_ids, gen, steps, alg, mask_id, eps, dtype):
    x = np.array(list(prompt_ids) + [mask_id] * gen, dtype=np.int64)
    n_prompt = len(prompt_ids)
    ts = timesteps_f32(steps, eps)
    reveals, counts = [], []
    for i in range(steps):
        mask = x == mask_id
        raw = forward(x)  # [L, vocab] float32
        logits = np.concatenate([raw[:1], raw[:-1]], axis=0)  # the shift: position j uses the output at j-1
        c, x0 = confidences(logits[mask], alg, dtype)
        k = transfer_count(int(mask.sum()), i, steps, ts)
        counts.append(k)
        full = np.full(x.shape, -np.inf, dtype=np.float64)
        full[mask] = c
        step = []
        if k > 0:
            sel = np.argsort(-full, kind="stable")[:k]  # top-k over the whole sequence; -inf off the masks
            cand = np.full(x.shape, mask_id, dtype=np.int64)
            cand[mask] = x0
            for p in sorted(sel.tolist()):
                if cand[p] != x[p]:
                    step.append([p - n_prompt, int(cand[p])])
            x[sel] = cand[sel]
        reveals.append(step)
    return x[n_prompt:].tolist(), reveals, counts


def check_schedules(eps):
    """Our float32 schedule against torch's, and against float64, for gen lengths up to 512."""
    vs_torch = vs_f64 = 0
    examples = []
    for gen in (16, 32, 64, 128, 256, 512):
        for steps in sorted({gen, gen // 2, gen // 4, gen // 8, 1} - {0}):
            ts = timesteps_f32(steps, eps)
            tt = torch.linspace(1, eps, steps + 1)
            assert np.array_equal(ts, tt.numpy()), (gen, steps)
            n = nt = gen
            for i in range(steps):
                k = transfer_count(n, i, steps, ts)
                num = torch.tensor([[True] * nt]).sum() / 1
                kt = int(num * (1 - tt[i + 1] / tt[i])) if i < steps - 1 else int(num)
                k64 = transfer_count_f64(n, i, steps, eps)
                vs_torch += k != kt
                if k != k64:
                    vs_f64 += 1
                    examples.append((gen, steps, i, n, k, k64))
                n -= k
                nt -= kt
    return vs_torch, vs_f64, examples


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--modeling", required=True)
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--golden", default=None, help="default CKPT/golden.json")
    a.add_argument("--case", default="p0_g32_s8_entropy")
    a.add_argument("--all", action="store_true", help="replay every greedy case")
    args = a.parse_args()
    torch.set_num_threads(1)
    modeling, _, _ = load_public_code(args.modeling)
    model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    with open(args.golden or os.path.join(args.checkpoint, "golden.json")) as f:
        golden = json.load(f)

    def forward(x):
        with torch.no_grad():
            return model(torch.from_numpy(x)[None]).logits[0].numpy()

    for s, vals in golden["timesteps_float32"].items():
        assert np.array_equal(timesteps_f32(int(s), golden["eps"]), np.array(vals, dtype=np.float32)), s
    vs_torch, vs_f64, ex = check_schedules(golden["eps"])
    print(f"schedules: {vs_torch} step counts differ from torch; {vs_f64} differ from the float64 formula {ex[:4]}")

    # first_step_logits: the shifted logits of the generated positions
    for fl in golden["first_step_logits"]:
        raw = forward(np.array(fl["input_ids"], dtype=np.int64))
        sh = np.concatenate([raw[:1], raw[:-1]], axis=0)[len(fl["input_ids"]) - fl["gen_length"]:]
        err = np.abs(sh - np.array(fl["logits"])).max()
        assert err < 2e-5, err
    print(f"first_step_logits: {len(golden['first_step_logits'])} prompts match (shifted), within rounding")

    cases = golden["cases"] if args.all else [c for c in golden["cases"] if c["id"] == args.case]
    assert cases, f"no case {args.case}"
    bad = 0
    for c in cases:
        for dtype in (f32, f64):
            out, rev, counts = sample(forward, c["prompt_ids"], c["gen_length"], c["steps"], c["alg"], c["mask_id"], c["eps"], dtype)
            same_rev = [sorted(map(tuple, r)) for r in rev] == [sorted(map(tuple, r)) for r in c["step_reveals"]]
            ok = out == c["output_ids"] and same_rev and counts == c["transfer_counts"]
            if not ok:
                bad += 1
                print(f"MISMATCH {c['id']} ({np.dtype(dtype).name})")
    print(f"{len(cases)} case(s) replayed in float32 and float64 confidences: {len(cases) * 2 - bad} match, {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
