#!/usr/bin/env python3
"""Trains a tiny DiffusionGemma (the published DiffusionGemmaForBlockDiffusion, its Hugging Face layout) on the
project's FILL/SHIFT tasks.

    cargo build --release -p llada-tools --bin gen-tasks
    /work/venv-dg/bin/python tools/diffusion_gemma/train_tiny_tasks.py --out models/diffusiongemma-tiny-tasks
    /work/venv-dg/bin/python tools/diffusion_gemma/train_tiny_tasks.py --eval-only models/diffusiongemma-tiny-tasks

The model class, its configuration and `generate` are the installed transformers 5.23.0's (dg_common.published).
The layout, tokenizer (vocabulary 320: Gemma 4's special tokens, 256 bytes, image markers) and Gemma 4 chat template
are the conformance kit's (make_tiny_checkpoint); the sizes are larger and the weights trained (see MODEL).

Data: `gen-tasks --seed 7` (held-out models/tasks/heldout.jsonl is seed 20261122, and its prompts are left out),
FILL and SHIFT, one kind per batch in turn. An example is the chat prompt (the template with the generation prompt,
96 or 97 tokens) followed by the answer region: the 64 answer characters, then <turn|> and <pad> to the end of the
third canvas. Canvases lie on a grid of CANVAS from the end of the prompt, as `generate` writes them.

Objective (uniform-noise block diffusion, as `generate` decodes): per batch a canvas k is drawn (0 or 1 with
probability 0.4 each, the end-of-turn canvas 2 with 0.2). The encoder reads the prompt and the canvases before k,
clean, into a fresh DynamicCache (the cache `generate` makes); the decoder reads canvas k, of which each position
is replaced by a token drawn uniformly from the whole vocabulary with probability t, t ~ U(0, 1) per sequence (what
`generate` does to the positions it does not accept). The loss is the mean cross-entropy over every position of
the canvas, noised or not: the sampler resamples every position each step and accepts the low-entropy ones, so a
kept token must be predicted again, confidently. Self-conditioning: in every other batch a first decoder pass
without it (no gradient) gives logits that, divided by a temperature T ~ U(t_min, t_max) per sequence (generate
feeds back the temperature-scaled logits), condition the second pass, whose loss is learnt; the other batches run
without it (the first denoising step's case). AdamW (0.9/0.999, eps 1e-8, weight decay 0.01), peak lr 3e-3 after
100 warm-up steps, cosine to a tenth, gradient norm clipped to 1.0, batch 16. Seed 1, one CPU thread (experts
by the published default, grouped_mm): a run is reproducible bit for bit.

Evaluation (also after training): the published `generate`, the settings of the saved generation_config.json
(max_new_tokens 64: two canvases of 32, up to 48 denoising steps, temperature 0.8 to 0.4, entropy bound 0.1,
stability 1, confidence 0.005), `torch.manual_seed(SEED)` before each task; a task counts when the text before the
first end-of-sequence id equals `expected`. `--ids-json` writes each task's new ids and model calls
(encoder and decoder passes), which `llada-rt eval --rng torch --seed SEED` must reproduce (check_tasks_eval.py;
tests/data/diffusiongemma-tasks/published_ids.json is the whole held-out file at seed 0).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import dg_common as C  # noqa: E402
import make_tiny_checkpoint as K  # noqa: E402
from task_training import StepLog, alternating_batches, kind_of, learning_rate, read_tasks  # noqa: E402

HELDOUT = os.path.join(C.REPO, "models", "tasks", "heldout.jsonl")
ANSWER_LEN = 64
CANVAS = 32
KINDS = ("FILL", "SHIFT")
CANVAS_DRAW = (0.4, 0.4, 0.2)  # canvas 0, canvas 1, the end-of-turn canvas
T_MIN, T_MAX = 0.4, 0.8

# The trained model: the kit's layout (5 sliding to 1 full is the real pattern; here 2 to 1, twice), larger.
MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "num_attention_heads": 4,
    "head_dim": 16,
    "num_key_value_heads": 2,
    "global_head_dim": 64,
    "num_global_key_value_heads": 1,
    "intermediate_size": 128,
    "num_experts": 8,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    # The decoder's sliding layers see the last window - 1 cached positions: 128 lets them read the prompt
    # (96 or 97 tokens) and the canvas before, as the real window (1,024 over canvases of 256) does.
    "sliding_window": 128,
}


def config_dict():
    d = K.config_dict("float32")
    d["canvas_length"] = CANVAS
    d["text_config"].update(MODEL)
    return d


def generation_config_dict():
    d = K.generation_config_dict()
    d["max_new_tokens"] = ANSWER_LEN
    assert (d["t_min"], d["t_max"]) == (T_MIN, T_MAX)
    return d


def build_model(configuration, modeling):
    d = config_dict()
    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "transformers_version", "text_config", "vision_config", "dtype")}
    text = configuration.DiffusionGemmaTextConfig(**{k: v for k, v in d["text_config"].items() if k not in ("model_type", "dtype")})
    config = configuration.DiffusionGemmaConfig(text_config=text, vision_config=d["vision_config"], **kw)
    config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    return modeling.DiffusionGemmaForBlockDiffusion._from_config(config, experts_implementation="grouped_mm").float()


def prompt_ids(tok, task):
    return list(tok.apply_chat_template([{"role": "user", "content": task["prompt"]}], add_generation_prompt=True, return_dict=False))


def answer_region(tok, task):
    ids = tok.encode(task["expected"], add_special_tokens=False)
    assert len(ids) == ANSWER_LEN, (task["expected"], ids)
    return ids + [C.TURN_CLOSE] + [C.PAD] * (3 * CANVAS - ANSWER_LEN - 1)


def forward(model, cache_cls, context, canvas, sc_logits):
    """The published forward as generate runs it: the encoder fills a fresh cache with the context, the decoder
    reads the canvas (positions after the context) with the cache and the self-conditioning logits."""
    b, n = context.shape
    cache = cache_cls(config=model.config.get_text_config(decoder=True))
    return model(
        input_ids=context,
        past_key_values=cache,
        position_ids=torch.arange(n)[None],
        decoder_input_ids=canvas,
        self_conditioning_logits=sc_logits,
        decoder_attention_mask=torch.ones(b, n + CANVAS, dtype=torch.bool),
        decoder_position_ids=torch.arange(n, n + CANVAS)[None],
    ).logits


def train(args, configuration, modeling):
    from transformers import AutoTokenizer, DynamicCache

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="dg_tiny_tasks_") as tmp:
        K.write_tokenizer(tmp, K.LLADA_TOKENIZER)
        tok = AutoTokenizer.from_pretrained(tmp)
        train_file = os.path.join(tmp, "train.jsonl")
        subprocess.run([args.tasks_bin, "--seed", str(args.data_seed), "--count", str(args.steps * args.batch + 1000), "-o", train_file], check=True)
        tasks = read_tasks(train_file)
    held = {t["prompt"] for t in read_tasks(args.heldout)}
    by_kind = {k: [t for t in tasks if kind_of(t) == k and t["prompt"] not in held] for k in KINDS}
    print("training tasks: " + ", ".join(f"{k} {len(v)}" for k, v in by_kind.items()))

    model = build_model(configuration, modeling)
    model.train()
    params = [p for n, p in model.named_parameters() if "vision" not in n]
    print(f"DiffusionGemmaForBlockDiffusion: {sum(p.numel() for p in params)} trained parameters")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    draw = torch.tensor(CANVAS_DRAW)
    log = StepLog(KINDS, args.steps, 100, "noised-token")
    for step, kind, batch in alternating_batches(by_kind, KINDS, args.batch, args.steps):
        prompts = [prompt_ids(tok, t) for t in batch]
        assert len({len(p) for p in prompts}) == 1, "one kind per batch: equal prompt lengths"
        regions = torch.tensor([answer_region(tok, t) for t in batch])
        k = int(torch.multinomial(draw, 1, generator=g))
        context = torch.cat([torch.tensor(prompts), regions[:, : k * CANVAS]], dim=1)
        target = regions[:, k * CANVAS : (k + 1) * CANVAS]
        b = len(batch)
        t = torch.rand(b, 1, generator=g)
        noised = torch.rand(b, CANVAS, generator=g) < t
        canvas = torch.where(noised, torch.randint(C.VOCAB, (b, CANVAS), generator=g), target)
        self_conditioned = step % 4 in (2, 3)  # every other batch of each kind
        sc = None
        if self_conditioned:
            with torch.no_grad():
                temperature = T_MIN + (T_MAX - T_MIN) * torch.rand(b, 1, 1, generator=g)
                sc = forward(model, DynamicCache, context, canvas, None) / temperature
        lr = learning_rate(step, args.steps, args.lr, 100)
        for group in opt.param_groups:
            group["lr"] = lr
        logits = forward(model, DynamicCache, context, canvas, sc)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            log.add(step, kind, loss.item(), int(((logits.argmax(-1) == target) & noised).sum()), int(noised.sum()), lr)
    print(f"trained {args.steps} steps in {log.seconds():.0f} s")
    model.eval()
    write(model, args.out)


def write(model, out):
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_dict(), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config_dict(), f, indent=2)
        f.write("\n")
    K.write_tokenizer(out, K.LLADA_TOKENIZER)
    print(f"wrote {out}")


def answer_text(tok, ids):
    end = next((i for i, x in enumerate(ids) if x in C.EOS_IDS), len(ids))
    return tok.decode(ids[:end])


def evaluate(ckpt, heldout, n, seed, ids_json):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = C.load_model(ckpt)
    score = {k: [0, 0] for k in KINDS}
    out_ids, passes = [], []
    # The model calls of each generate: the decoder's (generate calls the model's forward) and the encoder's.
    calls = [0]

    def counted(f):
        def call(*a, **kw):
            calls[0] += 1
            return f(*a, **kw)
        return call

    model.forward = counted(model.forward)
    model.model.encoder.forward = counted(model.model.encoder.forward)
    start = time.perf_counter()
    for task in read_tasks(heldout)[:n]:
        ids = prompt_ids(tok, task)
        torch.manual_seed(seed)
        calls[0] = 0
        out = model.generate(input_ids=torch.tensor([ids]))
        new = out.sequences[0, len(ids) :].tolist()
        out_ids.append(new)
        passes.append(calls[0])
        k = kind_of(task)
        score[k][0] += answer_text(tok, new) == task["expected"]
        score[k][1] += 1
    print(f"held-out evaluation of {ckpt}: first {n} tasks, the published generate (generation_config.json), seed {seed}, "
          f"{time.perf_counter() - start:.0f} s")
    for k, (c, m) in score.items():
        print(f"  {k}: {c}/{m} exact")
    print(f"  total: {sum(c for c, _ in score.values())}/{sum(m for _, m in score.values())}")
    if ids_json:
        with open(ids_json, "w") as f:
            json.dump({"generate": f"transformers {C.TRANSFORMERS_VERSION}, generation_config.json of {os.path.basename(os.path.normpath(ckpt))}",
                       "tasks": f"the first {n} of {os.path.relpath(heldout, C.REPO)}", "seed": seed, "output_ids": out_ids,
                       "model_calls": passes}, f)
            f.write("\n")
        print(f"wrote {ids_json}")


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--tasks-bin", default=os.path.join(C.REPO, "target", "release", "gen-tasks"))
    a.add_argument("--out", default=os.path.join(C.REPO, "models", "diffusiongemma-tiny-tasks"))
    a.add_argument("--eval-only", metavar="DIR")
    a.add_argument("--eval-count", type=int, default=50)
    a.add_argument("--eval-seed", type=int, default=0)
    a.add_argument("--ids-json", help="write each evaluated task's new ids here")
    a.add_argument("--heldout", default=HELDOUT)
    a.add_argument("--data-seed", type=int, default=7)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--steps", type=int, default=1000)
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--lr", type=float, default=3e-3)
    args = a.parse_args()
    torch.set_num_threads(1)
    configuration, modeling, _ = C.published()
    if not args.eval_only:
        train(args, configuration, modeling)
    evaluate(args.eval_only or args.out, args.heldout, args.eval_count, args.eval_seed, args.ids_json)


if __name__ == "__main__":
    main()
