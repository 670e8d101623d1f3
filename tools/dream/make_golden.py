#!/usr/bin/env python3
"""Golden outputs of the published Dream sampler (diffusion_generate) on a tiny Dream checkpoint.

    python tools/dream/make_golden.py --modeling DIR --checkpoint CKPT --out CKPT/golden.json
    python tools/dream/make_golden.py --modeling DIR --checkpoint models/dream-tiny-tasks \
        --tasks models/tasks/heldout.jsonl --gen-lengths 64 --out KIT/golden.json

With --tasks (a trained checkpoint), the prompts are eight tasks spread over the file, chat-framed as the model
was trained, instead of random bytes, and the cases run at --gen-lengths.

DIR holds the published modeling_dream.py, configuration_dream.py and generation_utils.py. The checkpoint is
loaded with the published DreamModel.from_pretrained in float32; every case is one call of the published
model.diffusion_generate (batch 1, no attention mask). A generation_tokens_hook_func (the published hook,
called after every step with the new x and the shifted logits the step used) records what each step revealed,
and, from the logits the step used, the confidences on both sides of the top-k selection boundary.
"""

import argparse
import contextlib
import io
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dream_public import decoding_knobs, generate_args, golden_provenance, load_public_code  # noqa: E402

ALGS = ("maskgit_plus", "topk_margin", "entropy")
GEN_LENGTHS = (16, 32)
EPS = 1e-3
N_PROMPTS = 8
LOGIT_PROMPTS = (0, 1, 2)
LOGIT_GEN_LENGTH = 32


def frame(tok):
    """The chat template's text before and after a user turn's content (default system turn, generation prompt)."""
    text = tok.apply_chat_template([{"role": "user", "content": "@@C@@"}], tokenize=False, add_generation_prompt=True)
    return text.split("@@C@@")


def task_prompts(tok, path):
    """Eight tasks spread over a task file ({"prompt", "expected"} per line), chat-framed."""
    tasks = [json.loads(line) for line in open(path) if line.strip()]
    pre, post = frame(tok)
    pre_ids = tok.encode(pre, add_special_tokens=False)
    post_ids = tok.encode(post, add_special_tokens=False)
    prompts = []
    for p in range(N_PROMPTS):
        t = tasks[p * len(tasks) // N_PROMPTS]
        content = tok.encode(t["prompt"], add_special_tokens=False)
        prompts.append(dict(content_ids=content, prompt_ids=pre_ids + content + post_ids, task=t["prompt"], expected_answer=t["expected"]))
    return prompts, pre, post


def make_prompts(tok, seed):
    """Chat-template framing (default system turn, one user turn, generation prompt) around 16-24 random byte ids."""
    pre, post = frame(tok)
    pre_ids = tok.encode(pre, add_special_tokens=False)
    post_ids = tok.encode(post, add_special_tokens=False)
    rng = np.random.default_rng(seed)
    prompts = []
    for p in range(N_PROMPTS):
        n = int(rng.integers(16, 25))
        content = [int(v) for v in rng.integers(0, 256, n)]
        prompts.append(dict(content_ids=content, prompt_ids=pre_ids + content + post_ids))
    return prompts, pre, post


class Recorder:
    """The hook: step None is the padded input, step i the x after step i with the logits step i used."""

    def __init__(self, gen, mask_id, prompt_len, alg, steps, eps):
        self.gen, self.mask_id, self.prompt_len = gen, mask_id, prompt_len
        self.alg, self.steps = alg, steps
        self.timesteps = torch.linspace(1, eps, steps + 1)
        self.prev = None
        self.step_reveals, self.transfer_counts = [], []
        self.first_tied_step = None
        self.min_gap_abs = self.min_gap_rel = None
        self.selection_matches = True
        self.revealed_mask_token = False

    def __call__(self, step, x, logits):
        if step is None:
            self.prev = x.clone()
            return x
        prev, mask = self.prev, self.prev == self.mask_id
        changed = (x != prev)[0]
        pos = changed.nonzero().flatten().tolist()
        self.step_reveals.append([[p - self.prompt_len, int(x[0, p])] for p in pos])
        if self.alg in ALGS:
            self._boundary(step, mask, logits, set(pos))
        self.prev = x.clone()
        return x

    def _boundary(self, i, mask, logits, revealed):
        # The number the step transfers, with the published expressions (float32 tensors).
        t, s = self.timesteps[i], self.timesteps[i + 1]
        n_mask = mask.sum() / mask.shape[0]
        k = int(n_mask * (1 - s / t)) if i < self.steps - 1 else int(n_mask)
        self.transfer_counts.append(k)
        if len(revealed) != k:
            self.revealed_mask_token = True  # a selected position got the mask id itself (stays masked)
        # Confidences as the published sample_tokens computes them (greedy).
        probs = torch.softmax(logits[mask], dim=-1)
        if self.alg == "maskgit_plus":
            conf = probs.max(dim=-1).values
        elif self.alg == "topk_margin":
            sp = torch.sort(probs, dim=-1, descending=True).values
            conf = sp[:, 0] - sp[:, 1]
        else:
            conf = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        n = conf.numel()
        order = torch.sort(conf, descending=True, stable=True)
        c = order.values.double()
        if 0 < k < n:
            gap = float(c[k - 1] - c[k])
            rel = gap / max(abs(float(c[k - 1])), abs(float(c[k])), 1e-30)
            if gap == 0 and self.first_tied_step is None:
                self.first_tied_step = i
            if self.min_gap_abs is None or gap < self.min_gap_abs:
                self.min_gap_abs = gap
            if self.min_gap_rel is None or rel < self.min_gap_rel:
                self.min_gap_rel = rel
            positions = mask[0].nonzero().flatten()
            top = set(positions[order.indices[:k]].tolist())
            if gap > 0 and top != revealed:
                self.selection_matches = False


def run_case(model, prompt_ids, gen, steps, alg, mask_id, temperature=0.0, top_p=None, seed=None):
    x = torch.tensor([prompt_ids], dtype=torch.long)
    rec = Recorder(gen, mask_id, len(prompt_ids), alg, steps, EPS)
    if seed is not None:
        torch.manual_seed(seed)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the vendored _sample prints "used steps"/"used time"
        out = model.diffusion_generate(x, **generate_args(gen, steps, alg, EPS, temperature, top_p), generation_tokens_hook_func=rec)
    ms = (time.perf_counter() - t0) * 1000
    seq = out.sequences[0].tolist()
    assert len(seq) == len(prompt_ids) + gen and seq[: len(prompt_ids)] == prompt_ids
    return seq[len(prompt_ids):], rec, ms


def case_setting(gen, steps, alg, mask_id, temperature=0.0, top_p=None):
    """A case's record of its diffusion_generate call: length, steps, algorithm, knobs, eps and mask id."""
    return dict(gen_length=gen, steps=steps, alg=alg, **decoding_knobs(temperature, top_p), eps=EPS, mask_id=mask_id)


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--modeling", required=True, help="directory with the published Dream python files")
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--prompt-seed", type=int, default=1234)
    a.add_argument("--threads", type=int, default=1)
    a.add_argument("--tasks", help="prompts from this task file (a trained checkpoint) instead of random bytes")
    a.add_argument("--gen-lengths", default=",".join(map(str, GEN_LENGTHS)), help="comma-separated generation lengths")
    args = a.parse_args()
    gen_lengths = [int(g) for g in args.gen_lengths.split(",")]
    torch.set_num_threads(args.threads)
    modeling, _, generation = load_public_code(args.modeling)
    from transformers import AutoTokenizer

    model = modeling.DreamModel.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    mask_id = model.config.mask_token_id
    assert mask_id == tok.mask_token_id
    prompts, pre, post = task_prompts(tok, args.tasks) if args.tasks else make_prompts(tok, args.prompt_seed)

    settings = [[g, s] for g in gen_lengths for s in (g, g // 2, g // 4)]
    cases, schedules = [], {}
    for pi, pr in enumerate(prompts):
        for g, s in settings:
            for alg in ALGS:
                out, rec, ms = run_case(model, pr["prompt_ids"], g, s, alg, mask_id)
                assert rec.selection_matches, (pi, g, s, alg)
                schedules.setdefault(f"g{g}_s{s}", rec.transfer_counts)
                cases.append(
                    dict(
                        id=f"p{pi}_g{g}_s{s}_{alg}",
                        prompt_index=pi,
                        prompt_ids=pr["prompt_ids"],
                        content_ids=pr["content_ids"],
                        **{k: pr[k] for k in ("task", "expected_answer") if k in pr},
                        **case_setting(g, s, alg, mask_id),
                        stochastic=False,
                        output_ids=out,
                        step_reveals=rec.step_reveals,
                        transfer_counts=rec.transfer_counts,
                        first_tied_step=rec.first_tied_step,
                        min_boundary_gap=rec.min_gap_abs,
                        min_boundary_gap_rel=rec.min_gap_rel,
                        selected_mask_token=rec.revealed_mask_token,
                        torch_ms=round(ms, 2),
                    )
                )
    stochastic = []
    for pi in (0, 1):
        for g, s in ((16, 16), (16, 8)):
            for alg, temp, top_p in (("origin", 0.0, None), ("maskgit_plus", 0.5, 0.95)):
                for seed in (0, 1):
                    pr = prompts[pi]
                    out, rec, ms = run_case(model, pr["prompt_ids"], g, s, alg, mask_id, temp, top_p, seed)
                    stochastic.append(
                        dict(
                            id=f"p{pi}_g{g}_s{s}_{alg}_T{temp}_seed{seed}",
                            prompt_index=pi,
                            prompt_ids=pr["prompt_ids"],
                            **case_setting(g, s, alg, mask_id, temp, top_p),
                            stochastic=True,
                            torch_seed=seed,
                            output_ids=out,
                            step_reveals=rec.step_reveals,
                        )
                    )

    first_logits = []
    with torch.no_grad():
        for pi in LOGIT_PROMPTS:
            ids = prompts[pi]["prompt_ids"] + [mask_id] * LOGIT_GEN_LENGTH
            raw = model(torch.tensor([ids])).logits
            shifted = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # as _sample does
            n = len(prompts[pi]["prompt_ids"])
            gl = shifted[0, n:].double().numpy()
            first_logits.append(
                dict(
                    prompt_index=pi,
                    input_ids=ids,
                    gen_length=LOGIT_GEN_LENGTH,
                    shifted=True,
                    logits_sum=float(gl.sum()),
                    raw_logits_sum_all_positions=float(raw.double().sum()),
                    logits=np.round(gl, 5).tolist(),
                )
            )

    gaps = [c["min_boundary_gap_rel"] for c in cases if c["min_boundary_gap_rel"] is not None]
    gaps_abs = [c["min_boundary_gap"] for c in cases if c["min_boundary_gap"] is not None]
    timesteps = {
        str(s): [float(v) for v in torch.linspace(1, EPS, s + 1)] for s in sorted({s for _, s in settings})
    }
    golden = dict(
        **golden_provenance(args.checkpoint, args.threads),
        code="published Dream modeling_dream.py / generation_utils.py (as vendored by NVlabs/Fast-dLLM)",
        notes=[
            "Every non-stochastic case is one call of the published model.diffusion_generate(input_ids, "
            "max_new_tokens=gen_length, steps, alg, temperature=0, top_p=None, top_k=None, alg_temp=None, eps) "
            "in float32, batch 1, no attention mask.",
            "step_reveals[i]: the [position_in_generation, token_id] pairs that step i changed from the mask id; "
            "transfer_counts[i]: the number the step selected, int(num_mask*(1-s/t)) (all remaining at the last step).",
            "first_step_logits: logits AFTER Dream's one-position shift (what the sampler uses): row j is the logits "
            "for generated position j, i.e. the model's raw output at sequence position prompt_len+j-1.",
            "min_boundary_gap(_rel): smallest difference, over the case's steps, between the k-th and (k+1)-th "
            "largest confidences among masked positions (k = transfer count), absolute and relative to the larger "
            "magnitude; first_tied_step: first step where that difference was 0 (null: never).",
            "stochastic cases (origin; maskgit_plus with temperature>0, top_p 0.95) are documentation only: they "
            "depend on torch's RNG after torch.manual_seed(torch_seed).",
        ],
        settings=settings,
        algs=list(ALGS),
        eps=EPS,
        mask_id=mask_id,
        prompt_framing=dict(before_content=pre, after_content=post),
        timesteps_float32=timesteps,
        transfer_schedules=schedules,
        min_boundary_gap_rel=min(gaps) if gaps else None,
        min_boundary_gap=min(gaps_abs) if gaps_abs else None,
        any_tie=any(c["first_tied_step"] is not None for c in cases),
        any_selected_mask_token=any(c["selected_mask_token"] for c in cases),
        cases=cases,
        stochastic_cases=stochastic,
        first_step_logits=first_logits,
    )
    with open(args.out, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    print(
        f"{len(cases)} cases + {len(stochastic)} stochastic; min boundary gap rel {golden['min_boundary_gap_rel']:.3g} "
        f"abs {golden['min_boundary_gap']:.3g}; any tie {golden['any_tie']}; "
        f"selected mask token {golden['any_selected_mask_token']}"
    )


if __name__ == "__main__":
    main()
