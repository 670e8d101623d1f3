#!/usr/bin/env python3
"""Fixtures for the DiffusionGemma sampler (`runtime/src/sampler/uniform_noise.rs`) and the
torch-compatible random stream (`runtime/src/sampler/torch_random.rs`), made with the published
code: Hugging Face transformers' `DiffusionGemmaForBlockDiffusion.generate` (5.23.0) on CPU.

A tiny random model (its weights scaled up so that its logits are peaked, entropies spread and
the stopping rule fires) generates two canvases under a seed, with the linear temperature
schedule and stable-and-confident stopping on. Every denoising step records the decoder's raw
logits (the model's forward is wrapped), the canvas in, the denoiser's multinomial draws, the
accepted mask, the canvas out, the argmax canvas, torch's entropies and the stop decision. The
Rust tests feed the raw logits to the Rust sampler, replay the random stream from the seed, and
compare every step. Floats are stored as the hex of their bits ("%08x"), so nothing is rounded
on the way.

Usage: python tools/diffusion_gemma/sampler_fixture.py [--out PATH]
(needs torch and transformers >= 5.23 with DiffusionGemma; runs in a few seconds on a CPU.)
"""

import argparse
import json
import zlib

import torch
from torch.distributions import Categorical

from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma import generation_diffusion_gemma as dg
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

VOCAB = 256
CANVAS = 24
SEED = 5
PROMPT = [2, 17, 99, 123, 45]
GENERATION = dict(
    max_new_tokens=2 * CANVAS,
    max_denoising_steps=16,
    t_min=0.4,
    t_max=0.8,
    stability_threshold=1,
    confidence_threshold=0.15,
    sampler_config=dg.EntropyBoundSamplerConfig(entropy_bound=1.0),
)


def hex_f32(t):
    """The float32 tensor's bits, 8 hex digits per element, row-major, as one string."""
    bits = t.detach().to(torch.float32).contiguous().flatten().view(torch.int32).tolist()
    return "".join(f"{b & 0xFFFFFFFF:08x}" for b in bits)


def crc_f32(t):
    """CRC-32 (zlib's) of the float32 tensor's little-endian bytes: a bit-exact digest."""
    return zlib.crc32(t.detach().to(torch.float32).contiguous().numpy().tobytes())


def tiny_model():
    text = DiffusionGemmaTextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=32,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"],
        num_experts=4, top_k_experts=2, moe_intermediate_size=32,
    )
    config = DiffusionGemmaConfig(
        text_config=text, vision_config=None, canvas_length=CANVAS,
        boi_token_id=VOCAB - 3, eoi_token_id=VOCAB - 2, image_token_id=VOCAB - 1,
    )
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    # Default initialisation gives near-uniform logits (every entropy near ln V, one token
    # accepted per step, no stop): larger weights give peaked, varied rows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1.0 if "embed_tokens" in name else 0.15)
    return model


def trace_generation():
    """Runs the published `generate` with recording wrappers; returns its steps and output."""
    model = tiny_model()
    steps = []
    forward = model.forward

    def recording_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        steps.append({
            "canvas_in": kwargs["decoder_input_ids"][0].tolist(),
            "logits": hex_f32(out.logits[0]),
            "self_conditioning_crc32": None if kwargs.get("self_conditioning_logits") is None
            else crc_f32(kwargs["self_conditioning_logits"][0]),
        })
        return out

    model.forward = recording_forward
    accept, renoise = dg.EntropyBoundSampler.accept_canvas, dg.EntropyBoundSampler.renoise_canvas
    stop = dg.StableAndConfidentStoppingCriteria.__call__

    def recording_accept(self, current, denoised, logits, cur_step):
        out = accept(self, current, denoised, logits, cur_step)
        step = steps[-1]
        step["cur_step"] = int(cur_step)
        step["processed_crc32"] = crc_f32(logits[0])
        step["probs_crc32"] = crc_f32(torch.softmax(logits[0], dim=-1, dtype=torch.float32))
        step["denoised"] = denoised[0].tolist()
        step["accepted"] = [int(a) for a in self.accepted_token_mask[0].tolist()]
        entropy = Categorical(logits=logits).entropy()[0]
        step["entropy"] = hex_f32(entropy)
        # How far the acceptance comparisons are from the bound (a near-tie would make the
        # fixture fragile): reported, not stored.
        ordered = torch.sort(entropy).values
        step["_bound_margin"] = float((torch.cumsum(ordered, 0) - ordered - self.entropy_bound).abs().min())
        return out

    def recording_renoise(self, accepted, cur_step):
        out = renoise(self, accepted, cur_step)
        steps[-1]["canvas_out"] = out[0].tolist()
        return out

    def recording_stop(self, argmax_canvas, logits, **kwargs):
        out = stop(self, argmax_canvas, logits, **kwargs)
        mean = torch.mean(Categorical(logits=logits).entropy(), dim=-1)
        steps[-1].update(argmax=argmax_canvas[0].tolist(), mean_entropy=hex_f32(mean), stop=bool(out[0]))
        steps[-1]["_confidence_margin"] = abs(float(mean[0]) - self.confidence_threshold)
        return out

    dg.EntropyBoundSampler.accept_canvas = recording_accept
    dg.EntropyBoundSampler.renoise_canvas = recording_renoise
    dg.StableAndConfidentStoppingCriteria.__call__ = recording_stop
    try:
        torch.manual_seed(SEED)
        out = model.generate(torch.tensor([PROMPT]), **GENERATION)
    finally:
        dg.EntropyBoundSampler.accept_canvas, dg.EntropyBoundSampler.renoise_canvas = accept, renoise
        dg.StableAndConfidentStoppingCriteria.__call__ = stop
    return steps, out.sequences[0].tolist()


def temperature_bits(cur_step):
    """The schedule's temperature exactly as the processor computes it (int32 `cur_step`)."""
    processor = dg.LinearTemperatureScheduleLogitsProcessor(
        GENERATION["t_min"], GENERATION["t_max"], GENERATION["max_denoising_steps"])
    ones = torch.ones(1)
    return hex_f32(ones / processor(None, ones, cur_step=torch.tensor(cur_step, dtype=torch.int32)))


def raw_u32(seed, n):
    """The generator's first `n` 32-bit outputs: a full-range int64 `random_` is one random64."""
    g = torch.Generator().manual_seed(seed)
    words = torch.empty(n // 2, dtype=torch.int64).random_(-2**63, None, generator=g).tolist()
    return [w for x in words for w in ((x % 2**64) >> 32, x % 2**32)]


def formula_probs(rows, vocab):
    """Unnormalised probabilities Rust recomputes exactly: a hash below 2^24, every third zero."""
    i = torch.arange(vocab, dtype=torch.int64)
    out = []
    for r in range(rows):
        h = ((i * 2654435761 + r * 40503 + 12345) % 2**32) >> 8
        out.append(torch.where(i % 3 == 2, 0, h).to(torch.float32))
    return torch.stack(out)


def streams():
    seeds = [0, 42, 2**32 + 5, 2**63 + 1]
    out = {"u32": [{"seed": str(s), "values": raw_u32(s, 16)} for s in seeds], "randint": [], "multinomial": []}
    for seed in (42, 2**63 + 1):
        for high in (320, 262_144, 2**30):
            g = torch.Generator().manual_seed(seed)
            values = torch.randint(0, high, (16,), generator=g).tolist()
            out["randint"].append({"seed": str(seed), "high": high, "values": values,
                                   "next_u32": raw_u32_after(g)})
    # Small rows given as bits, and real-vocabulary rows given by formula.
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(5, 300, generator=g) * 3, dim=-1)
    for seed, p, given in ((7, probs, "bits"), (11, formula_probs(3, 262_144), "formula")):
        g = torch.Generator().manual_seed(seed)
        picks = torch.multinomial(p, 1, generator=g).squeeze(-1).tolist()
        entry = {"seed": seed, "rows": p.shape[0], "vocab": p.shape[1], "picks": picks, "next_u32": raw_u32_after(g)}
        if given == "bits":
            entry["probs"] = hex_f32(p)
        out["multinomial"].append(entry)
    return out


def raw_u32_after(g):
    """The next 32-bit output of `g` (checks how many draws came before)."""
    x = torch.empty(1, dtype=torch.int64).random_(-2**63, None, generator=g).item() % 2**64
    return x >> 32


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runtime/src/sampler/testdata/diffusion_gemma_sampler.json")
    args = parser.parse_args()
    steps, sequence = trace_generation()
    bound_margin = min(s.pop("_bound_margin") for s in steps)
    confidence_margin = min(s.pop("_confidence_margin") for s in steps)
    for s in steps:
        s["temperature"] = temperature_bits(s["cur_step"])
    fixture = {
        "generated_by": f"tools/diffusion_gemma/sampler_fixture.py (torch {torch.__version__}, "
                        f"transformers {__import__('transformers').__version__}, "
                        f"CPU capability {torch.backends.cpu.get_cpu_capability()})",
        "config": {
            "vocab": VOCAB, "canvas": CANVAS, "seed": SEED, "prompt": PROMPT,
            **{k: v for k, v in GENERATION.items() if k != "sampler_config"},
            "entropy_bound": GENERATION["sampler_config"].entropy_bound,
        },
        "steps": steps,
        "sequence": sequence,
        "streams": streams(),
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    stops = [i for i, s in enumerate(steps) if s["stop"]]
    print(f"{len(steps)} steps, stops after steps {stops}; closest |cumsum - e - bound| "
          f"{bound_margin:.3g}, closest |mean entropy - threshold| {confidence_margin:.3g}; wrote {args.out}")


if __name__ == "__main__":
    main()
