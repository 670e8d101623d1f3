#!/usr/bin/env python3
"""Golden outputs of Fast-dLLM's Dream code beyond block_golden.json: its threshold decoding
(`alg='confidence_threshold'`), its cached policies with the top_p / top_k filters, and eps at the
ends of its range (also under the published sampler), on a tiny Dream checkpoint.

    python tools/dream/make_fastdllm_golden.py --modeling DIR --checkpoint CKPT [--kit KIT/golden.json] [--out FILE]

The prompts are those of the kit's golden.json (default CKPT/golden.json); the output goes beside it as
fastdllm_golden.json unless --out says otherwise.

DIR holds the published modeling_dream.py, configuration_dream.py, generation_utils.py and Fast-dLLM's
generation_utils_block.py (dream/model/ of NVlabs/Fast-dLLM), loaded at run time (dream_public.py); nothing of
them is kept here. The block mixin is bound to the model as Fast-dLLM's dream/eval.py binds it. Every case is one
`diffusion_generate` call, batch 1, float32, temperature 0, with top_p and top_k always passed (left out,
transformers' model-config defaults would apply top_k 50). A step is one forward call (make_block_golden.py's
recorder): `step_reveals[j]` are the positions committed from call j's logits, `forward_calls` the calls made.
"""

import argparse
import contextlib
import io
import itertools
import json
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dream_public import golden_provenance, load_block_code, load_public_code  # noqa: E402
from make_block_golden import ForwardRecorder, analyse  # noqa: E402

GEN = 32
THRESHOLDS = (0.9, 0.5, 0.3)
FILTERS = ((None, None), (None, 8), (0.9, None))
CACHED_FILTERS = ((None, 8), (0.9, None), (0.8, 3))


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--modeling", required=True)
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--kit", help="the kit's golden.json (default: CKPT/golden.json)")
    a.add_argument("--out")
    args = a.parse_args()
    kit_path = args.kit or os.path.join(args.checkpoint, "golden.json")
    out_path = args.out or os.path.join(os.path.dirname(kit_path), "fastdllm_golden.json")
    torch.set_num_threads(1)
    modeling, _, published = load_public_code(args.modeling)
    _, _, block = load_block_code(args.modeling)
    model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    mask_id = model.config.mask_token_id
    rec = ForwardRecorder(model)
    published_generate = model.diffusion_generate
    block_generate = types.MethodType(block.DreamGenerationMixin.diffusion_generate, model)
    block_sample = types.MethodType(block.DreamGenerationMixin._sample, model)
    published_sample = model._sample
    kit = json.load(open(kit_path))
    prompts = []
    for c in kit["cases"]:
        if c["prompt_ids"] not in [p for _, p in prompts]:
            prompts.append((c["prompt_index"], c["prompt_ids"]))

    cases = []

    def case(kind, pi, ids, bl, steps, alg, policy, top_p, top_k, eps=1e-3, threshold=None):
        x = torch.tensor([ids], dtype=torch.long)
        rec.reset()
        t0 = time.perf_counter()
        kw = dict(max_new_tokens=GEN, steps=steps, alg=alg, alg_temp=None, temperature=0.0, top_p=top_p, top_k=top_k,
                  eps=eps, return_dict_in_generate=True)
        if policy == "exact":
            model.diffusion_generate, model._sample = published_generate, published_sample
            with contextlib.redirect_stdout(io.StringIO()):
                out = model.diffusion_generate(x, **kw)
        else:
            model.diffusion_generate, model._sample = block_generate, block_sample
            if threshold is not None:
                kw["threshold"] = threshold
            out = model.diffusion_generate(x, block_length=bl, dual_cache=policy == "dual", **kw)
        ms = (time.perf_counter() - t0) * 1000
        seq = out.sequences
        info = analyse(rec.calls, seq, len(ids), bl, mask_id)
        name = f"{kind}_p{pi}_b{bl}_s{steps}_{policy}_{alg}" + (f"_t{threshold}" if threshold is not None else "")
        name += f"_p{top_p}_k{top_k}" + (f"_eps{eps}" if eps != 1e-3 else "")
        cases.append(dict(
            id=name, kind=kind, prompt_index=pi, prompt_ids=ids, gen_length=GEN, block_length=bl, steps=steps, alg=alg,
            threshold=threshold, temperature=0.0, top_p=top_p, top_k=top_k, alg_temp=None, eps=eps,
            dual_cache=None if policy == "exact" else policy == "dual", mask_id=mask_id,
            output_ids=seq[0, len(ids):].tolist(), step_reveals=info["step_reveals"], forward_calls=len(rec.calls),
            passes=info["passes"], first_tied_step=None, torch_ms=round(ms, 2),
        ))

    # Threshold decoding: several thresholds (0.5 and 0.3 commit in parallel), both caches, filtered or not.
    for (pi, ids), th, policy, (tp, tk), (bl, st) in itertools.product(prompts[:3], THRESHOLDS, ("prefix", "dual"), FILTERS, ((16, 16), (8, 32))):
        case("threshold", pi, ids, bl, st, "confidence_threshold", policy, tp, tk, threshold=th)
    # The cached policies' schedule with the filters (their cached steps rank by negative entropy).
    for (pi, ids), alg, policy, (tp, tk), (bl, st) in itertools.product(prompts[:3], ("maskgit_plus", "entropy"), ("prefix", "dual"), CACHED_FILTERS, ((16, 16), (32, 8))):
        case("filtered", pi, ids, bl, st, alg, policy, tp, tk)
    # eps at both ends: the published sampler and both caches.
    for (pi, ids), eps, alg, policy in itertools.product(prompts[:2], (0.0, 1.0), ("maskgit_plus", "entropy"), ("exact", "prefix", "dual")):
        bl, st = (GEN, 8) if policy == "exact" else (16, 16)
        case("eps", pi, ids, bl, st, alg, policy, None, None, eps=eps)

    doc = {
        **golden_provenance(args.checkpoint, 1),
        "code": "published Dream generation_utils.py (exact) and NVlabs/Fast-dLLM dream/model/generation_utils_block.py (prefix: dual_cache False; dual: True), loaded at run time",
        "notes": "kinds: threshold (alg confidence_threshold: after each block's whole-sequence pass commits its first position, every cached pass commits the most confident masked position of the block and every other at or above the threshold; the loop ends when the block has no mask, so forward_calls depends on the case), filtered (top_p/top_k under the cached policies' schedule), eps (0 and 1). step_reveals[j]: positions committed from forward call j's logits. Ties (filtered confidences can be exactly equal) are decided by torch.topk over the span Fast-dLLM ranks; first_tied_step is null.",
        "mask_id": mask_id,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
