#!/usr/bin/env python3
"""Golden outputs of LLaDA 2.x's published `generate` on a tiny LLaDA 2.x checkpoint: the project's own kit.

    python tools/llada2/make_golden.py --modeling DIR --base CKPT --out KIT

DIR holds the published modeling_llada2_moe.py of LLaDA2.0 (`modeling_llada2_moe_v20.py`), of LLaDA2.1
(`modeling_llada2_moe_v21.py`) and configuration_llada2_moe.py (`configuration_llada2_moe_v20.py`), as
released with the models; they are loaded at run time, nothing of theirs is kept here. CKPT is a random
checkpoint in LLaDA 2.x's layout (`gen-checkpoint --preset tiny-llada2 --dtype f32`). The kit checkpoint is CKPT
loaded with the published LLaDA2MoeModelLM, its head's EOS row scaled so that EOS is predicted now and then,
saved with the published save_pretrained (float32), with CKPT's tokenizer files.

The 2.0 cases are each one call of the published 2.0 `generate` (block-causal 0/-inf mask), with 2.1's
`_sample_with_temperature_topk_topp` (temperature 0 is the argmax there; 2.0's draws with torch.multinomial even
at temperature 0). The editing cases are each one call of the published 2.1 `generate` (token editing), whose
0/1 mask is given to the model as 2.0 gives it (its log, 0/-inf): as published, the model adds the 0/1 mask to
its scores, which masks nothing. A wrapper around the model's forward records each call's input; the positions
a call's logits committed are those masked in its input and not in the next one's (the last call's: in the
final canvas), its edits those committed in its input and changed in the next.

With KIT/tiny-llada2/model.safetensors already there, the checkpoint is loaded from it, not made again.
"""

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile

import torch

GEN_LENGTHS = (7, 16, 24)
PROMPT_LENGTHS = (3, 8, 13)
BLOCKS = (8, 16, 32)
THRESHOLDS = (0.95, 0.5, 0.2)
# 2.1's editing cases: (editing_threshold, max_post_steps), and (threshold, eos_early_stop); 0.9 and 16 are its
# defaults, 0.5 and 0.0 its card's quality and speed modes.
EDITING = ((0.9, 16), (0.5, 16), (0.0, 16), (0.0, 1))
EDITING_COMMITS = ((0.95, False), (0.7, False), (0.5, True))
EDITING_GEN_LENGTHS = (7, 24)
EDITING_BLOCKS = (8, 32)


def load_published(modeling_dir):
    """The published 2.0 modeling module, with 2.1's sampling function on its model class."""
    pkg = tempfile.mkdtemp(prefix="llada2_public_")
    for name, files in (("llada2_v20", "modeling_llada2_moe_v20.py"), ("llada2_v21", "modeling_llada2_moe_v21.py")):
        os.makedirs(os.path.join(pkg, name))
        open(os.path.join(pkg, name, "__init__.py"), "w").close()
        shutil.copy(os.path.join(modeling_dir, files), os.path.join(pkg, name, "modeling_llada2_moe.py"))
        shutil.copy(os.path.join(modeling_dir, "configuration_llada2_moe_v20.py"), os.path.join(pkg, name, "configuration_llada2_moe.py"))
    sys.path.insert(0, pkg)
    v20 = importlib.import_module("llada2_v20.modeling_llada2_moe")
    v21 = importlib.import_module("llada2_v21.modeling_llada2_moe")
    v20.LLaDA2MoeModelLM._sample_with_temperature_topk_topp = v21.LLaDA2MoeModelLM._sample_with_temperature_topk_topp
    return v20, v21


def make_checkpoint(v20, base, out, eos):
    model = v20.LLaDA2MoeModelLM.from_pretrained(base, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        model.lm_head.weight[eos] *= 6.0
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(os.path.join(base, f), os.path.join(out, f))
    return model


def record_calls(model, log_mask, run):
    """Runs `run()` with the model's forward recording each call's input (the live view and a copy); with
    `log_mask`, the forward is given the log of the 0/1 mask it is passed (0/-inf, as 2.0 passes it)."""
    calls = []
    forward = model.forward

    def recording(input_ids, *a, **k):
        calls.append((input_ids, input_ids.clone()))
        if log_mask:
            k["attention_mask"] = k["attention_mask"].float().log().to(torch.bfloat16)
        return forward(input_ids, *a, **k)

    model.forward = recording
    try:
        out = run()
    finally:
        model.forward = forward
    return out, calls


def call_changes(calls, p, mask):
    """Per call: the positions (from the prompt's end) its logits committed, and those it edited."""
    reveals, edits = [], []
    for i, (view, before) in enumerate(calls):
        after = calls[i + 1][1] if i + 1 < len(calls) else view
        n = min(before.shape[1], after.shape[1])
        changed = [(j, int(before[0, j]), int(after[0, j])) for j in range(n) if int(before[0, j]) != int(after[0, j])]
        reveals.append([[j - p, a] for j, b, a in changed if b == mask and a != mask])
        edits.append([[j - p, a] for j, b, a in changed if b != mask])
    return reveals, edits


def run_editing_case(model, prompt, gen_length, block, threshold, editing_threshold, max_post_steps, eos_early_stop, eos, mask):
    out, calls = record_calls(model, True, lambda: model.generate(
        inputs=torch.tensor([prompt]), temperature=0.0, block_length=block, gen_length=gen_length, threshold=threshold,
        editing_threshold=editing_threshold, max_post_steps=max_post_steps, eos_early_stop=eos_early_stop, eos_id=eos, mask_id=mask))
    reveals, edits = call_changes(calls, len(prompt), mask)
    return out[0].tolist(), reveals, edits, len(calls)


def run_case(model, prompt, gen_length, block, steps, threshold, eos_early_stop, eos, mask):
    out, calls = record_calls(model, False, lambda: model.generate(
        inputs=torch.tensor([prompt]), temperature=0.0, block_length=block, steps=steps, gen_length=gen_length,
        threshold=threshold, eos_early_stop=eos_early_stop, eos_id=eos, mask_id=mask))
    p = len(prompt)
    reveals, edits = call_changes(calls, p, mask)
    assert not any(edits), "2.0 never changes a committed token"
    ids = out[0].tolist()
    # Its early stop returns the canvas up to the first EOS, prompt included (the other return is
    # the generated part only, a prompt's length shorter): strip the prompt.
    final = calls[-1][0][0].tolist()
    eos_full = final.index(eos) if eos in final else None
    if eos_early_stop and eos_full is not None and len(ids) == eos_full + 1:
        ids = ids[p:]
    return ids, reveals, len(calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modeling", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    v20, v21 = load_published(a.modeling)
    tok = json.load(open(os.path.join(a.base, "tokenizer.json")))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos, mask = ids["<|endoftext|>"], ids["<|mask|>"]
    ckpt = os.path.join(a.out, "tiny-llada2")
    os.makedirs(ckpt, exist_ok=True)
    if os.path.exists(os.path.join(ckpt, "model.safetensors")):
        model = v20.LLaDA2MoeModelLM.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="eager")
    else:
        model = make_checkpoint(v20, a.base, ckpt, eos)
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, min(eos, vocab), (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    cases = []
    for pi, prompt in enumerate(prompts):
        for gen in GEN_LENGTHS:
            for block in BLOCKS:
                for threshold in THRESHOLDS:
                    for early in (False, True):
                        steps = {8: 4, 16: 16, 32: 32}[block]
                        out, reveals, calls = run_case(model, prompt, gen, block, steps, threshold, early, eos, mask)
                        cases.append(dict(id=f"p{pi}_g{gen}_b{block}_s{steps}_t{threshold}_eos{int(early)}", prompt_ids=prompt, gen_length=gen,
                                          block_length=block, steps=steps, temperature=0.0, threshold=threshold, eos_early_stop=early,
                                          mask_id=mask, output_ids=out, step_reveals=reveals, forward_calls=calls, first_tied_step=None))
    # 2.1's generate, with token editing, on the same weights.
    model21 = v21.LLaDA2MoeModelLM.from_pretrained(ckpt, torch_dtype=torch.float32, attn_implementation="eager")
    model21.eval()
    edited = 0
    for pi, prompt in enumerate(prompts):
        for gen in EDITING_GEN_LENGTHS:
            for block in EDITING_BLOCKS:
                for editing, post in EDITING:
                    for threshold, early in EDITING_COMMITS:
                        out, reveals, edits, calls = run_editing_case(model21, prompt, gen, block, threshold, editing, post, early, eos, mask)
                        edited += any(edits)
                        cases.append(dict(id=f"p{pi}_g{gen}_b{block}_t{threshold}_edit{editing}_post{post}_eos{int(early)}", prompt_ids=prompt,
                                          gen_length=gen, block_length=block, steps=32, temperature=0.0, threshold=threshold, eos_early_stop=early,
                                          editing_threshold=editing, max_post_steps=post, mask_id=mask, output_ids=out, step_reveals=reveals,
                                          step_edits=edits, forward_calls=calls, first_tied_step=None))
    # First-call logits of the block rows, as the first step of each prompt's generation sees them.
    logits = []
    for prompt in prompts:
        block = 8
        end = (len(prompt) // block + 1) * block
        x = torch.full((1, end), mask)
        x[0, :len(prompt)] = torch.tensor(prompt)
        nb = end // block
        m = torch.tril(torch.ones(nb, nb)).repeat_interleave(block, 0).repeat_interleave(block, 1)[None, None].log()
        with torch.no_grad():
            out = model(x, attention_mask=m.to(torch.bfloat16), position_ids=torch.arange(end)[None]).logits[0, end - block:]
        logits.append(dict(input_ids=x[0].tolist(), gen_length=block, block_length=block, logits=[[round(v, 5) for v in row] for row in out.tolist()]))
    eos_cases = sum(1 for c in cases if eos in c["output_ids"])
    golden = dict(checkpoint="tiny-llada2", torch_version=torch.__version__, dtype="float32", threads=1,
                  code="published LLaDA2.0 modeling_llada2_moe.py generate, with LLaDA2.1's _sample_with_temperature_topk_topp; "
                       "cases with editing_threshold: published LLaDA2.1 generate, its mask given to the model as its log; loaded at run time",
                  notes=f"step_reveals[j]: positions (from the prompt's end) committed from model call j's logits; step_edits[j]: those it edited; "
                        f"forward_calls: the model calls. {eos_cases} cases end at EOS; {edited} editing cases edit.",
                  mask_id=mask, cases=cases, first_step_logits=logits)
    with open(os.path.join(ckpt, "golden.json"), "w") as f:
        json.dump(golden, f)
    print(f"{len(cases)} cases ({eos_cases} ending at EOS, {edited} editing cases that edit), {len(logits)} logit cases -> {ckpt}/golden.json")


if __name__ == "__main__":
    main()
