#!/usr/bin/env python3
"""Golden outputs of the published DiffusionGemma sampler (model.generate) on the tiny checkpoint.

    python tools/diffusion_gemma/make_golden.py [--checkpoint CKPT] [--out CKPT/golden.json] [--no-f64]

The checkpoint is loaded with the published DiffusionGemmaForBlockDiffusion.from_pretrained in float32 (sdpa
attention, the default); every case is one call of the published model.generate (transformers 5.23.0), batch
1, torch.set_num_threads(1), torch.manual_seed(seed) just before the call, every setting passed explicitly.
Instrumentation only observes: torch.randint / torch.multinomial are wrapped to log the calls (the multinomial
wrapper also recomputes q = exponential_(1) from the saved RNG state and checks that argmax(p / q) is the
published pick and that the RNG ends in the same state), the decoder forward (model.forward) and the encoder
are wrapped to count passes, and EntropyBoundSampler.accept_canvas is wrapped to read the processed logits.
With --f64 (default on) every case is replayed with the network in float64 (the sampler still gets float32
logits, as published) to show that float rounding does not change any decision.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dg_common as C  # noqa: E402

LOGIT_ROWS = 4
# A case is kept only if its decisions are comfortably far from ties (see margins in NOTES); otherwise the next
# candidate seed (or prompt, for the seed cases) is tried. float32 rounding differences between implementations are
# ~1e-7 relative, i.e. ~1e-5 on logits of magnitude ~10.
MIN_MULTINOMIAL_REL_GAP = 1e-4
MIN_ENTROPY_BOUND_GAP = 1e-4
MIN_ARGMAX_LOGIT_GAP = 1e-3
MIN_CONFIDENCE_GAP_REL = 1e-3  # times confidence_threshold,
# and at least MIN_CONFIDENCE_GAP: an independent float32 implementation (the Rust runtime) differs from
# PyTorch by about 2e-5 in a mean entropy after a few dozen self-conditioned steps.
MIN_CONFIDENCE_GAP = 1e-4
TRIES = 16


# ----------------------------------------------------------------------------------------------------------------
# Cases


def make_prompts(tok, seed=1234):
    """Prompt 0 and 1: chat-framed (the kit's Gemma-4-style template); 2..7: random byte ids of several lengths
    (3 to 40; the sliding window is 8, so most exceed it)."""
    rng = np.random.default_rng(seed)
    prompts = []
    for text in ("hi", "Why is the sky blue?"):
        framed = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        prompts.append([int(i) for i in tok.encode(framed, add_special_tokens=False)])
    for n in (3, 6, 9, 14, 25, 40):
        prompts.append([int(v) + C.BYTE_BASE for v in rng.integers(0, 256, n)])
    return prompts


DEFAULTS = dict(max_new_tokens=32, max_denoising_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1,
                stability_threshold=1, confidence_threshold=0.005, eos_token_id=list(C.EOS_IDS), pad_token_id=C.PAD)


def case_specs():
    """(name, prompt index, seed, settings) before the eos-probe cases, which are derived from runs. A case whose
    margins are too small moves on to seed + 1000, + 2000, ... (the seed cases: to the next prompt)."""
    specs = []

    def add(name, p, seed, **kw):
        s = dict(DEFAULTS)
        s.update(kw)
        specs.append((name, p, seed, s))

    for p in range(8):
        add(f"default_p{p}", p, 0)
    for g in (1, 2, 16, 20, 40, 48):
        add(f"new{g}_p4", 4, 1, max_new_tokens=g)
    for n in (1, 4, 8, 16):
        for p in (1, 5):
            add(f"steps{n}_p{p}", p, 2, max_denoising_steps=n)
    add("steps48_new48_p3", 3, 3, max_new_tokens=48)
    for p in (2, 6):
        add(f"notemp_p{p}", p, 4, t_min=None, t_max=None)
        add(f"temp0.2-1.0_p{p}", p, 4, t_min=0.2, t_max=1.0)
    add("notemp_steps8_p7", 7, 4, t_min=None, t_max=None, max_denoising_steps=8)
    for b in (0.01, 0.5, 2.0, 8.0):
        add(f"bound{b}_p3", 3, 5, entropy_bound=b)
    add("bound2.0_steps8_new48_p0", 0, 5, entropy_bound=2.0, max_denoising_steps=8, max_new_tokens=48)
    for p in (2, 5):
        add(f"nostop_p{p}", p, 6, stability_threshold=None, confidence_threshold=None)
        for st, ct in ((0, 0.5), (1, 0.5), (2, 0.5), (1, 0.25), (2, 1.0), (0, 0.1)):
            add(f"stop{st}_{ct}_p{p}", p, 6, stability_threshold=st, confidence_threshold=ct)
    add("stop1_0.5_notemp_p4", 4, 6, stability_threshold=1, confidence_threshold=0.5, t_min=None, t_max=None)
    add("stop2_0.5_bound2.0_new48_p6", 6, 6, stability_threshold=2, confidence_threshold=0.5, entropy_bound=2.0, max_new_tokens=48)
    add("eos_off_p4", 4, 7, eos_token_id=None, max_new_tokens=48)
    add("eos_pad_only_p4", 4, 7, eos_token_id=[C.PAD], max_new_tokens=48)
    for seed in (42, 2**32 + 5, 5, 2**63 + 1, 1):
        add(f"seed{seed}_p0", 0, seed)
    return specs


# ----------------------------------------------------------------------------------------------------------------
# Instrumented run


class Recorder:
    """Observes one generate call (see the module docstring)."""

    def __init__(self, model, generation, settings, capture_logits=False):
        self.model, self.generation, self.s = model, generation, settings
        self.calls = []
        self.u32 = 0
        self.encoder_calls = 0
        self.steps = []  # decoder passes per canvas
        self.accepted = []  # per canvas, accepted count per step
        self.last_rel_gaps = None
        self.min_mn_gap = float("inf")
        self.min_bound_gap = float("inf")
        self.min_argmax_gap = float("inf")
        self.min_conf_gap = float("inf")
        self.capture_logits = capture_logits
        self.first_pass = None
        self.stopping_on = settings["stability_threshold"] is not None and settings["confidence_threshold"] is not None
        self.argmax_matters_every_step = self.stopping_on and settings["stability_threshold"] > 0
        self.pending_argmax_gap = None

    @contextlib.contextmanager
    def patched(self):
        real_randint, real_mn = torch.randint, torch.multinomial
        gen = self.generation
        real_accept = gen.EntropyBoundSampler.accept_canvas
        model, rec = self.model, self
        real_forward, real_enc_forward = model.forward, model.model.encoder.forward

        def randint(*a, **k):
            out = real_randint(*a, **k)
            rec.calls.append(("randint", list(out.shape), int(k.get("high", a[1] if len(a) > 1 else -1))))
            rec.u32 += out.numel() * (1 if k["high"] - k["low"] < 2**28 else 2)
            return out

        def multinomial(probs, num_samples, *a, **k):
            assert num_samples == 1 and not a and not k and probs.dtype == torch.float32
            before = torch.get_rng_state()
            out = real_mn(probs, num_samples)
            after = torch.get_rng_state()
            torch.set_rng_state(before)
            q = torch.empty_like(probs).exponential_(1)
            assert torch.equal(torch.get_rng_state(), after), "multinomial consumed other than exponential_ on empty_like(p)"
            ratio = probs / q
            assert torch.equal(torch.argmax(ratio, dim=-1, keepdim=True), out), "multinomial is not argmax(p / q)"
            top2 = torch.topk(ratio, 2, dim=-1).values.double()
            rec.last_rel_gaps = ((top2[:, 0] - top2[:, 1]) / top2[:, 0]).numpy()
            rec.calls.append(("multinomial", list(probs.shape), None))
            rec.u32 += probs.numel() * 2
            return out

        def accept_canvas(self_, current, denoiser, logits, cur_step):
            out = real_accept(self_, current, denoiser, logits, cur_step)
            mask = self_.accepted_token_mask[0].numpy()
            rec.accepted[-1].append(int(mask.sum()))
            gaps = rec.last_rel_gaps[mask]
            rec.min_mn_gap = min(rec.min_mn_gap, float(gaps.min()))
            ent = torch.distributions.Categorical(logits=logits).entropy()
            srt, _ = torch.sort(ent, dim=-1)
            v = (torch.cumsum(srt, dim=-1) - srt)[0].double().numpy()
            bound = float(np.float32(self_.entropy_bound))
            rec.min_bound_gap = min(rec.min_bound_gap, float(np.abs(v - bound).min()))
            top2 = torch.topk(logits[0], 2, dim=-1).values.double()
            g = float((top2[:, 0] - top2[:, 1]).min())
            if rec.argmax_matters_every_step:
                rec.min_argmax_gap = min(rec.min_argmax_gap, g)
            else:
                rec.pending_argmax_gap = g  # only the canvas's last step's argmax is the output
            if rec.stopping_on:
                thr = float(np.float32(rec.s["confidence_threshold"]))
                rec.min_conf_gap = min(rec.min_conf_gap, abs(float(ent.mean()) - thr))
            return out

        def forward(*a, **k):
            out = real_forward(*a, **k)
            rec.steps[-1] += 1
            if rec.capture_logits and rec.first_pass is None:
                rec.first_pass = dict(
                    canvas_ids=k["decoder_input_ids"][0].tolist(),
                    decoder_position_ids=k["decoder_position_ids"][0].tolist(),
                    logits=out.logits[0, :LOGIT_ROWS].double().numpy(),
                    logits_sum=float(out.logits.double().sum()),
                )
            return out

        def enc_forward(*a, **k):
            rec.flush_canvas()
            rec.encoder_calls += 1
            rec.steps.append(0)
            rec.accepted.append([])
            return real_enc_forward(*a, **k)

        torch.randint, torch.multinomial = randint, multinomial
        gen.EntropyBoundSampler.accept_canvas = accept_canvas
        model.forward, model.model.encoder.forward = forward, enc_forward
        try:
            yield
        finally:
            torch.randint, torch.multinomial = real_randint, real_mn
            gen.EntropyBoundSampler.accept_canvas = real_accept
            del model.forward
            del model.model.encoder.forward

    def flush_canvas(self):
        if self.pending_argmax_gap is not None:
            self.min_argmax_gap = min(self.min_argmax_gap, self.pending_argmax_gap)
            self.pending_argmax_gap = None


def generate_kwargs(generation, s):
    return dict(
        max_new_tokens=s["max_new_tokens"],
        max_denoising_steps=s["max_denoising_steps"],
        sampler_config=generation.EntropyBoundSamplerConfig(entropy_bound=float(s["entropy_bound"])),
        t_min=s["t_min"],
        t_max=s["t_max"],
        stability_threshold=s["stability_threshold"],
        confidence_threshold=s["confidence_threshold"],
        eos_token_id=s["eos_token_id"],
        pad_token_id=s["pad_token_id"],
    )


def run_case(model, generation, prompt_ids, seed, s, capture_logits=False, instrument=True):
    """One published generate call. Returns (output_ids, recorder or None, tokens_per_forward, ms)."""
    x = torch.tensor([prompt_ids], dtype=torch.long)
    kw = generate_kwargs(generation, s)
    rec = Recorder(model, generation, s, capture_logits) if instrument else None
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with rec.patched() if rec else contextlib.nullcontext():
        out = model.generate(x, **kw)
    ms = (time.perf_counter() - t0) * 1000
    if rec:
        rec.flush_canvas()
    seq = out.sequences[0].tolist()
    assert seq[: len(prompt_ids)] == prompt_ids
    return seq[len(prompt_ids):], rec, float(out.tokens_per_forward[0]), ms


def encode_calls(calls):
    legend, s = {}, []
    for fn, size, high in calls:
        key = ("R" if fn == "randint" else "M")
        val = dict(function=f"torch.{fn}", size=size, **({"low": 0, "high": high} if fn == "randint" else {"num_samples": 1}))
        assert legend.setdefault(key, val) == val, (legend[key], val)
        s.append(key)
    return legend, "".join(s)


def finite(x):
    return None if x == float("inf") else x


def comfortable(m, s):
    if m["multinomial_rel_gap"] is not None and m["multinomial_rel_gap"] < MIN_MULTINOMIAL_REL_GAP:
        return False
    if m["entropy_bound_gap"] < MIN_ENTROPY_BOUND_GAP or m["argmax_logit_gap"] < MIN_ARGMAX_LOGIT_GAP:
        return False
    if m["confidence_gap"] is not None and m["confidence_gap"] < max(MIN_CONFIDENCE_GAP, MIN_CONFIDENCE_GAP_REL * s["confidence_threshold"]):
        return False
    return True


# ----------------------------------------------------------------------------------------------------------------


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--checkpoint", default=C.CKPT_F32)
    a.add_argument("--out")
    a.add_argument("--no-f64", action="store_true", help="skip the float64 replay")
    a.add_argument("--only", help="comma-separated case names (debugging; does not write)")
    args = a.parse_args()
    out_path = args.out or os.path.join(args.checkpoint, "golden.json")
    torch.set_num_threads(1)
    tv, pv = C.check_versions()
    _, _, generation = C.published()
    from transformers import AutoTokenizer

    model = C.load_model(args.checkpoint)
    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    prompts = make_prompts(tok)
    specs = case_specs()
    if args.only:
        specs = [sp for sp in specs if sp[0] in args.only.split(",")]

    cases = []
    first_logits = None

    m_eager = C.load_model(args.checkpoint, torch.float32, attn="eager", experts="eager")

    def robust(c):
        """Margins comfortable, and the same result with other float32 kernels (eager attention / experts)."""
        if not comfortable(c["margins"], c["settings"]):
            print("   (margins too small, retrying)")
            return False
        out, rec, _, _ = run_case(m_eager, generation, c["prompt_ids"], c["seed"], c["settings"], instrument=False)
        if out != c["output_ids"]:
            print("   (eager kernels give another trajectory, retrying)")
            return False
        return True

    def record(name, p, seed, s, vary="seed"):
        for t in range(TRIES):
            c = attempt(name, p, seed, s)
            if robust(c):
                break
            if vary == "seed":
                seed += 1000
            else:
                p = (p + 1) % len(prompts)
        else:
            raise SystemExit(f"{name}: no comfortable candidate")
        c["candidates_skipped"] = t
        keep(c)
        return c

    def keep(case):
        nonlocal first_logits
        if first_logits is None:
            fp = case.pop("_first_pass")
            first_logits = dict(
                case=case["name"],
                prompt_ids=case["prompt_ids"],
                canvas_ids=fp["canvas_ids"],
                decoder_position_ids=fp["decoder_position_ids"],
                rows=LOGIT_ROWS,
                logits=np.round(fp["logits"], 6).tolist(),
                logits_sum_all_rows=fp["logits_sum"],
            )
        case.pop("_first_pass", None)
        cases.append(case)

    def attempt(name, p, seed, s):
        out, rec, tpf, ms = run_case(model, generation, prompts[p], seed, s, capture_logits=not cases)
        legend, calls = encode_calls(rec.calls)
        eos = s["eos_token_id"]
        eos_pos = next((i for i, t in enumerate(out) if eos is not None and t in eos), None)
        case = dict(
            name=name,
            prompt_index=p,
            prompt_ids=prompts[p],
            seed=seed,
            settings=dict(s),
            output_ids=out,
            canvases=len(rec.steps),
            denoising_steps_per_canvas=rec.steps,
            accepted_per_step=rec.accepted,
            tokens_per_forward=tpf,
            eos_position=eos_pos,
            random_calls=calls,
            random_call_kinds=legend,
            mt_u32_consumed=rec.u32,
            margins=dict(
                multinomial_rel_gap=finite(rec.min_mn_gap),
                entropy_bound_gap=finite(rec.min_bound_gap),
                argmax_logit_gap=finite(rec.min_argmax_gap),
                confidence_gap=finite(rec.min_conf_gap) if rec.stopping_on else None,
            ),
            torch_ms=round(ms, 1),
        )
        # tokens_per_forward cross-check: non-pad generated tokens / decoder passes
        n_valid = sum(1 for t in out if s["pad_token_id"] is None or t != s["pad_token_id"])
        assert abs(tpf - n_valid / sum(rec.steps)) < 1e-6, (tpf, n_valid, rec.steps)
        case["_first_pass"] = rec.first_pass
        m = case["margins"]
        print(f"{name:34s} out {len(out):2d} steps {rec.steps} eos@{eos_pos} acc/step {np.mean(sum(rec.accepted, [])):.2f} "
              f"mn {m['multinomial_rel_gap']:.2e} eb {m['entropy_bound_gap']:.2e} am {m['argmax_logit_gap']:.2e} "
              f"cf {m['confidence_gap'] if m['confidence_gap'] is None else round(m['confidence_gap'], 5)} {ms:.0f}ms", flush=True)
        return case

    for name, p, seed, s in specs:
        record(name, p, seed, s, vary="prompt" if name.startswith("seed") else "seed")

    if not args.only:
        # EOS cases: with the same seed, the eos setting changes nothing before the end of a canvas, so an eos id
        # taken from a run without eos ends generation exactly at that canvas (tokens after it become pad).
        for p, seed, canvas, pos in ((2, 8, 0, 5), (5, 8, 1, 9), (7, 9, 2, 3), (0, 9, 1, 0)):
            for t in range(TRIES):
                s = dict(DEFAULTS, max_new_tokens=48, eos_token_id=None)
                probe, _, _, _ = run_case(model, generation, prompts[p], seed, s, instrument=False)
                span = probe[canvas * C.CANVAS + pos:(canvas + 1) * C.CANVAS]
                tok_ = next((x for x in span if x not in probe[: canvas * C.CANVAS]), None)
                if tok_ is not None:
                    s = dict(s, eos_token_id=[tok_])
                    c = attempt(f"eos_hit_canvas{canvas}_p{p}", p, seed, s)
                    if robust(c):
                        break
                seed += 1000
            else:
                raise SystemExit("no eos case")
            c["candidates_skipped"] = t
            assert c["eos_position"] == probe.index(tok_) and c["canvases"] == canvas + 1, c
            assert c["output_ids"][: c["eos_position"] + 1] == probe[: c["eos_position"] + 1]
            assert all(x == C.PAD for x in c["output_ids"][c["eos_position"] + 1:])
            keep(c)

    agree = {}
    if not args.no_f64:
        # The same cases with other kernels: float32 with eager attention and the eager expert loop (other summation
        # orders), and the network in float64 (eager experts: grouped_mm has no float64).
        for key, dtype, attn in (("f32_eager_agrees", torch.float32, "eager"), ("f64_agrees", torch.float64, None)):
            m2 = C.load_model(args.checkpoint, dtype, attn=attn, experts="eager")
            agree[key] = 0
            for c in cases:
                out, rec, _, _ = run_case(m2, generation, c["prompt_ids"], c["seed"], c["settings"])
                c[key] = out == c["output_ids"] and rec.steps == c["denoising_steps_per_canvas"]
                agree[key] += c[key]
                if not c[key]:
                    print(f"{key}: differs on", c["name"])
            print(f"{key}: {agree[key]}/{len(cases)} cases identical")

    if args.only:
        return
    keys = ("multinomial_rel_gap", "entropy_bound_gap", "argmax_logit_gap", "confidence_gap")
    min_margins = {k: min((c["margins"][k] for c in cases if c["margins"][k] is not None), default=None) for k in keys}
    golden = dict(
        checkpoint=os.path.relpath(args.checkpoint, C.REPO),
        code="transformers 5.23.0, transformers/models/diffusion_gemma/ (DiffusionGemmaForBlockDiffusion.generate)",
        transformers_version=tv,
        torch_version=pv,
        dtype="float32",
        attn_implementation=model.config._attn_implementation,
        threads=torch.get_num_threads(),
        canvas_length=C.CANVAS,
        vocab_size=C.VOCAB,
        sliding_window=C.SLIDING_WINDOW,
        generation_config_defaults=dict(DEFAULTS, max_new_tokens=C.CANVAS),
        notes=NOTES,
        n_cases=len(cases),
        min_margins=min_margins,
        experts_implementation=model.config._experts_implementation,
        agreeing_cases=agree,
        cases=cases,
        first_decoder_pass_logits=first_logits,
    )
    with open(out_path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}: {len(cases)} cases; min margins {min_margins}")


NOTES = [
    "Each case is one call model.generate(input_ids=[prompt_ids], max_new_tokens, max_denoising_steps, "
    "sampler_config=EntropyBoundSamplerConfig(entropy_bound), t_min, t_max, stability_threshold, "
    "confidence_threshold, eos_token_id, pad_token_id) of the published DiffusionGemmaForBlockDiffusion "
    "(transformers 5.23.0), float32, sdpa attention, batch 1, no attention mask, torch.set_num_threads(1), "
    "torch.manual_seed(seed) immediately before the call. settings holds the values exactly as passed (null = None, "
    "which turns the temperature schedule off when t_min/t_max is null, adaptive stopping off when "
    "stability_threshold/confidence_threshold is null, EOS handling off when eos_token_id is null).",
    "output_ids = sequences[0, len(prompt_ids):]: whole canvases, NOT truncated to max_new_tokens "
    "(ceil(max_new_tokens / canvas_length) canvases unless EOS stops earlier); in the canvas where an eos id first "
    "appears, every token after the first eos is pad_token_id; eos_position is the index of the first eos id in "
    "output_ids (null: none).",
    "canvases: canvases generated; denoising_steps_per_canvas[c]: decoder forward passes in canvas c (counted by "
    "wrapping model.forward; equals max_denoising_steps unless adaptive stopping fired); accepted_per_step[c][i]: "
    "positions the entropy-bound sampler accepted at step i of canvas c; tokens_per_forward: the published output "
    "(non-pad generated tokens / decoder passes), cross-checked against the counts.",
    "random_calls: the CPU-RNG calls in order, one letter per call, explained by random_call_kinds (R = "
    "torch.randint(0, vocab, (1, canvas_length)) for the initial canvas and for every renoise, M = "
    "torch.multinomial(probs [canvas_length, vocab] float32, 1)); per canvas the order is R, then per step M, R. "
    "mt_u32_consumed: 32-bit MT19937 outputs consumed (randint: 1 per element as range < 2^28; multinomial: 2 per "
    "probability, one random64 per exponential draw).",
    "margins (minimum over the case's steps): multinomial_rel_gap = (r1 - r2) / r1 for the largest and second "
    "largest r = p / q (float32, as multinomial computes it) at positions whose sample was accepted; "
    "entropy_bound_gap = min |(cumsum(sorted entropies) - sorted entropies) - float32(entropy_bound)| over all "
    "positions (the acceptance test is value <= bound); argmax_logit_gap = top-1 minus top-2 processed logit, "
    "minimum over canvas positions, at every step when stability_threshold > 0 with stopping on (the argmax canvas "
    "feeds the stability test) else at each canvas's last step (whose argmax canvas is the output); "
    "confidence_gap = |mean entropy - float32(confidence_threshold)| (null when stopping is off).",
    "f32_eager_agrees: the same case with eager attention and the eager per-expert loop (float32, other kernels and "
    "summation orders than the golden's sdpa + torch._grouped_mm) gives the same output_ids and step counts; "
    "f64_agrees: the same with the network in float64 (eager experts; logits still cast to float32 by the published "
    "forward, sampler unchanged). agreeing_cases counts both.",
    "first_decoder_pass_logits: the first case's first decoder pass: its canvas_ids (the initial randint canvas) "
    "and decoder_position_ids, the raw logits (after the soft-cap tanh(x/30)*30, before temperature) of canvas "
    "rows 0..rows-1, rounded to 1e-6, and the float64 sum over all canvas rows.",
    "min_margins: the minimum of each margin over all cases.",
]


if __name__ == "__main__":
    main()
