#!/usr/bin/env python3
"""Golden outputs of NVlabs/Fast-dLLM's block Dream sampler (prefix cache and dual cache) on a tiny Dream checkpoint.

    python tools/dream/make_block_golden.py --modeling DIR --checkpoint CKPT [--out CKPT/block_golden.json]

DIR holds the published modeling_dream.py, configuration_dream.py, generation_utils.py and Fast-dLLM's
generation_utils_block.py (Fast-dLLM's modeling_dream.py is the one that takes past_key_values / dual_cache /
replace_position). The checkpoint is loaded with DreamModel.from_pretrained in float32 and, as Fast-dLLM's
dream/eval.py does, the block mixin's diffusion_generate and _sample are bound to the model with
types.MethodType. Every case is one call of that diffusion_generate (batch 1, no attention mask).

The block _sample calls no tokens hook, so the model's forward is wrapped: before each forward call the full x
is snapshotted, together with the call's kind (full / prefix / dual), its query span and its logits. A "step"
is one forward call; step_reveals[j] holds what changed in x between forward call j and the next one (or the
returned sequence): the positions committed from forward call j's logits.
"""

import argparse
import json
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dream_public import decoding_knobs, generate_args, golden_provenance, load_block_code  # noqa: E402

EPS = 1e-3
GEN = 32
BLOCK_LENGTHS = (8, 16)
ALGS = ("maskgit_plus", "entropy")
N_PROMPTS = 4
# documentation-only settings: (block_length, steps); steps_per_block 1, 2 and a single block.
EDGE_SETTINGS = ((8, 4), (16, 2), (8, 8), (32, 32), (32, 16))


class ForwardRecorder:
    """Wraps model.forward; keeps, per call, the x it saw, the kind, the query span and the logits."""

    def __init__(self, model):
        self.model = model
        self.inner = model.forward
        self.calls = []
        self.x = None
        model.forward = self

    def reset(self):
        self.calls, self.x = [], None

    def __call__(self, *args, **kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        pkv = kwargs.get("past_key_values")
        dual = bool(kwargs.get("dual_cache", False))
        if pkv is None:
            kind, self.x = "full", ids  # the sampler's x itself (later updated in place)
            start = 0
        elif dual:
            kind = "dual"
            start = int(kwargs["replace_position"][0].nonzero().min())
        else:
            kind = "prefix"
            start = int(pkv[0][0].shape[1])  # the prefix cache length
            assert start == self.x.shape[1] - ids.shape[1]
        snap = self.x.clone()
        assert torch.equal(snap[:, start : start + ids.shape[1]], ids)
        out = self.inner(*args, **kwargs)
        self.calls.append(dict(kind=kind, start=start, length=int(ids.shape[1]), x=snap, logits=out.logits.clone()))
        return out


def analyse(calls, final, prompt_len, block_length, mask_id):
    """step_reveals, passes, transfer counts and the selection boundary gaps, from the recorded calls."""
    reveals, passes, counts = [], [], []
    min_gap = min_gap_rel = None
    min_argmax_gap = None
    selection_matches = True
    for j, c in enumerate(calls):
        nxt = calls[j + 1]["x"] if j + 1 < len(calls) else final
        prev = c["x"]
        pos = (nxt != prev)[0].nonzero().flatten().tolist()
        reveals.append([[p - prompt_len, int(nxt[0, p])] for p in pos])
        passes.append([c["kind"], c["start"] - prompt_len, c["length"]])
        raw = c["logits"][0]
        shifted = torch.cat([raw[:1], raw[:-1]], dim=0)  # the sampler's shift, applied to the span's rows
        probs_all = torch.softmax(shifted, dim=-1)
        for p in pos:  # the committed token is the argmax: its margin to the runner-up
            top2 = torch.topk(probs_all[p - c["start"]], 2).values.double()
            g = float(top2[0] - top2[1])
            min_argmax_gap = g if min_argmax_gap is None else min(min_argmax_gap, g)
        if c["kind"] == "full":
            continue
        b0 = c["start"]
        mask = prev[0, b0 : b0 + block_length] == mask_id
        k = len(pos)
        counts.append(k)
        probs = probs_all[:block_length][mask]
        conf = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)  # neg_entropy=True, whatever alg
        n = conf.numel()
        order = torch.sort(conf, descending=True, stable=True)
        if 0 < k < n:
            cv = order.values.double()
            gap = float(cv[k - 1] - cv[k])
            rel = gap / max(abs(float(cv[k - 1])), abs(float(cv[k])), 1e-30)
            min_gap = gap if min_gap is None else min(min_gap, gap)
            min_gap_rel = rel if min_gap_rel is None else min(min_gap_rel, rel)
            idx = mask.nonzero().flatten()
            top = {int(idx[t]) + b0 for t in order.indices[:k]}
            if top != set(pos):
                selection_matches = False
    return dict(
        step_reveals=reveals,
        passes=passes,
        cached_transfer_counts=counts,
        min_boundary_gap=min_gap,
        min_boundary_gap_rel=min_gap_rel,
        min_argmax_gap=min_argmax_gap,
        selection_matches=selection_matches,
    )


def run_case(model, rec, prompt_ids, gen, block_length, steps, alg, dual, mask_id):
    x = torch.tensor([prompt_ids], dtype=torch.long)
    rec.reset()
    t0 = time.perf_counter()
    out = model.diffusion_generate(x, **generate_args(gen, steps, alg, EPS), block_length=block_length, dual_cache=dual)
    ms = (time.perf_counter() - t0) * 1000
    seq = out.sequences
    assert seq.shape[1] == len(prompt_ids) + gen and seq[0, : len(prompt_ids)].tolist() == prompt_ids
    info = analyse(rec.calls, seq, len(prompt_ids), block_length, mask_id)
    return seq[0, len(prompt_ids) :].tolist(), info, len(rec.calls), ms


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--modeling", required=True, help="directory with the published Dream files + generation_utils_block.py")
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--out", help="default: CKPT/block_golden.json")
    a.add_argument("--threads", type=int, default=1)
    args = a.parse_args()
    out_path = args.out or os.path.join(args.checkpoint, "block_golden.json")
    torch.set_num_threads(args.threads)
    modeling, _, block = load_block_code(args.modeling)
    model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    # As NVlabs/Fast-dLLM dream/eval.py binds the block sampler:
    model.diffusion_generate = types.MethodType(block.DreamGenerationMixin.diffusion_generate, model)
    model._sample = types.MethodType(block.DreamGenerationMixin._sample, model)
    mask_id = model.config.mask_token_id
    rec = ForwardRecorder(model)

    with open(os.path.join(args.checkpoint, "golden.json")) as f:
        kit = json.load(f)
    prompts = []
    for c in kit["cases"]:
        if c["prompt_ids"] not in [p for _, p in prompts]:
            prompts.append((c["prompt_index"], c["prompt_ids"]))
    prompts = prompts[:N_PROMPTS]

    def case(pi, ids, bl, steps, alg, dual, edge=False):
        out, info, n_fwd, ms = run_case(model, rec, ids, GEN, bl, steps, alg, dual, mask_id)
        if not edge:
            assert info["selection_matches"], (pi, bl, steps, alg, dual)
        spb = steps // (GEN // bl)
        return dict(
            id=f"p{pi}_g{GEN}_b{bl}_s{steps}_{'dual' if dual else 'prefix'}_{alg}",
            prompt_index=pi,
            prompt_ids=ids,
            gen_length=GEN,
            block_length=bl,
            steps=steps,
            steps_per_block=spb,
            alg=alg,
            eps=EPS,
            **decoding_knobs(),
            dual_cache=dual,
            mask_id=mask_id,
            output_ids=out,
            forward_calls=n_fwd,
            unfilled_masks=sum(1 for t in out if t == mask_id),
            **info,
            torch_ms=round(ms, 2),
        )

    cases = []
    for pi, ids in prompts:
        for bl in BLOCK_LENGTHS:
            for steps in (GEN, GEN // 2):
                for dual in (False, True):
                    for alg in ALGS:
                        cases.append(case(pi, ids, bl, steps, alg, dual))
    edge = []
    for bl, steps in EDGE_SETTINGS:
        for dual in (False, True):
            edge.append(case(prompts[0][0], prompts[0][1], bl, steps, "maskgit_plus", dual, edge=True))

    by_setting = {}
    for c in cases:
        key = (c["prompt_index"], c["block_length"], c["steps"], c["dual_cache"])
        by_setting.setdefault(key, []).append(c["output_ids"])
    algs_agree = all(all(o == v[0] for o in v) for v in by_setting.values())
    by_cache = {}
    for c in cases:
        key = (c["prompt_index"], c["block_length"], c["steps"], c["alg"])
        by_cache.setdefault(key, {})[c["dual_cache"]] = c["output_ids"]
    prefix_dual_differ = sum(1 for v in by_cache.values() if v[False] != v[True])
    gaps = [c["min_boundary_gap"] for c in cases if c["min_boundary_gap"] is not None]
    rels = [c["min_boundary_gap_rel"] for c in cases if c["min_boundary_gap_rel"] is not None]
    agaps = [c["min_argmax_gap"] for c in cases if c["min_argmax_gap"] is not None]
    spbs = sorted({c["steps_per_block"] for c in cases + edge})
    golden = dict(
        **golden_provenance(args.checkpoint, args.threads),
        code="NVlabs/Fast-dLLM dream/model/generation_utils_block.py (DreamGenerationMixin.diffusion_generate/_sample "
        "bound to Fast-dLLM's DreamModel as dream/eval.py does)",
        notes=[
            "Each case: model.diffusion_generate(prompt, max_new_tokens=gen_length, steps, alg, temperature=0, top_p=None, "
            "top_k=None, alg_temp=None, eps, block_length, dual_cache) in float32, batch 1, no attention mask.",
            "A step is one model forward call. passes[j] = [kind, first position of the query span (in generation "
            "coordinates), span length]; kind full (whole sequence, cache rebuilt), prefix (block + suffix over the "
            "prefix cache) or dual (block only over the prefix+suffix cache). step_reveals[j] = the "
            "[position_in_generation, token_id] pairs committed from forward call j's logits.",
            "cached_transfer_counts: per cached call, the number committed (0 for the call that only breaks the loop).",
            "min_boundary_gap(_rel): over the cached steps, the smallest difference between the k-th and (k+1)-th "
            "largest neg-entropy confidence among the block's masked positions (k = committed count). min_argmax_gap: "
            "the smallest top1-top2 probability difference at a committed position.",
            "alg only distinguishes confidence_threshold from the rest: maskgit_plus and entropy give the same outputs.",
            "edge_cases (prompt 0, maskgit_plus) are documentation: steps_per_block 1 leaves block_length-1 masks per "
            "block unfilled (unfilled_masks).",
        ],
        gen_length=GEN,
        block_lengths=list(BLOCK_LENGTHS),
        algs=list(ALGS),
        eps=EPS,
        mask_id=mask_id,
        timesteps_float32={str(s): [float(v) for v in torch.linspace(1, EPS, s + 1)] for s in spbs},
        algs_agree=algs_agree,
        prefix_dual_outputs_differ=prefix_dual_differ,
        min_boundary_gap=min(gaps) if gaps else None,
        min_boundary_gap_rel=min(rels) if rels else None,
        min_argmax_gap=min(agaps) if agaps else None,
        cases=cases,
        edge_cases=edge,
    )
    with open(out_path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    print(
        f"{len(cases)} cases + {len(edge)} edge cases -> {out_path}; algs agree {algs_agree}; prefix/dual differ in "
        f"{prefix_dual_differ}/{len(by_cache)} settings; min boundary gap {golden['min_boundary_gap']:.3g} "
        f"(rel {golden['min_boundary_gap_rel']:.3g}); min argmax gap {golden['min_argmax_gap']:.3g}; forward calls "
        f"{sorted({(c['block_length'], c['steps'], c['forward_calls']) for c in cases + edge})}; unfilled "
        f"{[(c['id'], c['unfilled_masks']) for c in edge if c['unfilled_masks']]}"
    )


if __name__ == "__main__":
    main()
