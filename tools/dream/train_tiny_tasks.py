#!/usr/bin/env python3
"""Trains a tiny Dream (the published DreamModel, Dream's Hugging Face layout) on the project's FILL/SHIFT tasks.

    python tools/dream/train_tiny_tasks.py --modeling /work/public-dream --tasks-bin target/release/gen-tasks \\
        --out models/dream-tiny-tasks
    python tools/dream/train_tiny_tasks.py --modeling /work/public-dream --eval-only models/dream-tiny-tasks

DIR (--modeling) holds the published modeling_dream.py, configuration_dream.py and generation_utils.py; they
are loaded from there at run time (dream_public.load_public_code). The output directory has the layout that
make_tiny_checkpoint.py writes for the conformance kit (config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt); the config and
tokenizer files come from that script's functions, so only the weights differ.

Model: DreamConfig hidden 128, 4 layers, 4 attention heads, 2 kv heads, intermediate 384, vocabulary 320 (256
byte tokens, id = byte value; <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258, <|beginoftext|> 259,
<|mask|> 260), rope theta 1e6, RMSNorm eps 1e-6, untied lm_head, float32; default init (normal std 0.02).

Data: `gen-tasks --seed 7` (held-out models/tasks/heldout.jsonl is seed 20261122), FILL and SHIFT, one kind
per batch, taken in turn. Each example is the chat prompt
    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n{prompt}<|im_end|>\\n
    <|im_start|>assistant\\n
(the tokenizer's chat template with the generation prompt) followed by the answer region: the 64 answer
characters alone, or followed by <|im_end|> and <|endoftext|> padding to 96 tokens (drawn per batch, as the
LLaDA recipe's response_lengths [64, 96]).

Objective (Dream: masked diffusion with shifted logits): per sequence t ~ U(0, 1), p = (1 - 1e-3) t + 1e-3;
each answer token is replaced by <|mask|> with probability p (the prompt stays clean); the cross-entropy of a
masked token at position i is taken from the logits at position i - 1, weighted by 1 / (p * answer length),
summed and divided by the batch size. AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01), peak lr 2e-3
after 100 linear warm-up steps, cosine decay to a tenth, gradient norm clipped to 1.0, batch 16, 2400 steps
(about 12 minutes on one CPU thread). Seed 1 (torch.manual_seed for the init, one torch.Generator for the
response lengths and the noise), one CPU thread, so a run is reproducible bit for bit.

The run is sensitive to the seed at this budget. Without clipping, seed 0 learnt FILL but kept SHIFT's F and L
inputs conflated (both answer G or M, 50/50; 2% of SHIFT tasks exact), and seed 1 had not learnt SHIFT by step
1500. With clipping, seed 0 reached 100% SHIFT and 86% FILL exact; seed 1 (the default) 100% on both.

Evaluation (also run after training): the published model.diffusion_generate, greedy: alg="maskgit_plus",
temperature=0.0, steps=64, max_new_tokens=64, output_history=False, batch 1, no attention mask, on the first
100 held-out tasks; a task counts when the first 64 generated characters equal `expected` exactly.
"""

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from dream_public import load_public_code  # noqa: E402
from task_training import kind_of, learning_rate, read_tasks  # noqa: E402
from make_tiny_checkpoint import (  # noqa: E402
    ENDOFTEXT,
    IM_END,
    LLADA_TOKENIZER,
    MASK,
    SPECIALS,
    TINY,
    dream_config,
    published_config,
    write_checkpoint,
    write_tokenizer,
)

REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
HELDOUT = os.path.join(REPO, "models", "tasks", "heldout.jsonl")
ANSWER_LEN = 64
KINDS = ("FILL", "SHIFT")
SYSTEM = "You are a helpful assistant."
SPECIAL_IDS = {s: i for i, s in SPECIALS}
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for _, s in SPECIALS) + ")")


def chat_text(prompt):
    """The chat template applied to one user message, with the generation prompt."""
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def encode(text):
    """The tiny tokenizer by construction: special tokens as their ids, every other byte as its own id."""
    ids = []
    for piece in SPECIAL_RE.split(text):
        if piece in SPECIAL_IDS:
            ids.append(SPECIAL_IDS[piece])
        else:
            ids.extend(piece.encode("utf-8"))
    return ids


def check_tokenizer(tok_dir, tasks):
    """The tokenizers library (tokenizer.json) and the transformers chat template agree with encode/chat_text."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    fast = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(tok_dir)
    for task in tasks:
        text = chat_text(task["prompt"])
        templ = auto.apply_chat_template([{"role": "user", "content": task["prompt"]}], add_generation_prompt=True, tokenize=False)
        assert templ == text, (templ, text)
        ids = encode(text)
        assert fast.encode(text, add_special_tokens=False).ids == ids
        assert auto.apply_chat_template([{"role": "user", "content": task["prompt"]}], add_generation_prompt=True) == ids
        assert fast.encode(task["expected"], add_special_tokens=False).ids == encode(task["expected"])
        assert len(encode(task["expected"])) == ANSWER_LEN
    return encode(chat_text(tasks[0]["prompt"]))


def make_batch(tasks, response_len, g):
    """Input ids (answer region noised), targets, mask of noised answer positions, per-sequence 1 / (p * len)."""
    prompts = [encode(chat_text(t["prompt"])) for t in tasks]
    assert len({len(p) for p in prompts}) == 1, "one kind per batch: equal prompt lengths"
    responses = []
    for t in tasks:
        r = encode(t["expected"])
        assert len(r) == ANSWER_LEN
        if response_len > ANSWER_LEN:
            r = r + [IM_END] + [ENDOFTEXT] * (response_len - ANSWER_LEN - 1)
        responses.append(r)
    prompt = torch.tensor(prompts, dtype=torch.long)
    response = torch.tensor(responses, dtype=torch.long)
    b = len(tasks)
    t = torch.rand(b, generator=g)
    p = (1 - 1e-3) * t + 1e-3
    masked = torch.rand(b, response_len, generator=g) < p[:, None]
    noised = torch.where(masked, torch.full_like(response, MASK), response)
    return torch.cat([prompt, noised], dim=1), response, masked, 1.0 / (p * response_len)


def train(args, modeling, configuration):
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)

    heldout = read_tasks(args.heldout)
    with tempfile.TemporaryDirectory(prefix="dream_tiny_tasks_") as tmp:
        write_tokenizer(tmp, args.llada_tokenizer)
        ids = check_tokenizer(tmp, heldout[:20])
        print(f"tokenizer check ok; prompt ids of held-out task 0 ({len(ids)}): {ids}")
        train_file = args.train_file or os.path.join(tmp, "train.jsonl")
        if not args.train_file:
            count = args.steps * args.batch + 1000
            subprocess.run([args.tasks_bin, "--seed", str(args.data_seed), "--count", str(count), "-o", train_file], check=True)
        tasks = read_tasks(train_file)
    held = {t["prompt"] for t in heldout}
    by_kind = {k: [t for t in tasks if kind_of(t) == k and t["prompt"] not in held] for k in KINDS}
    dropped = sum(1 for t in tasks if t["prompt"] in held)
    print(f"training tasks (seed {args.data_seed}): " + ", ".join(f"{k} {len(v)}" for k, v in by_kind.items()) + f"; {dropped} in held-out dropped")

    cfg_dict = published_config(TINY)
    model = modeling.DreamModel(dream_config(configuration, cfg_dict)).float()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"DreamModel: {n_params} parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, args.beta2), eps=1e-8, weight_decay=args.weight_decay)

    cursor = {k: 0 for k in KINDS}
    start = time.perf_counter()
    loss_sum, loss_n = 0.0, 0
    seen = {k: [0, 0] for k in KINDS}
    for step in range(args.steps):
        kind = KINDS[step % len(KINDS)]
        pool = by_kind[kind]
        if cursor[kind] + args.batch > len(pool):
            raise SystemExit(f"ran out of {kind} training tasks at step {step}")
        batch_tasks = pool[cursor[kind] : cursor[kind] + args.batch]
        cursor[kind] += args.batch
        response_len = args.response_lengths[int(torch.randint(len(args.response_lengths), (1,), generator=g))]
        x, target, masked, weight = make_batch(batch_tasks, response_len, g)
        lr = learning_rate(step, args.steps, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr

        plen = x.shape[1] - response_len
        logits = model(x).logits
        # Dream's shift: token i is predicted from the output at position i - 1.
        pred = logits[:, plen - 1 : plen - 1 + response_len].float()
        ce = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="none").view_as(target)
        loss = (ce * masked * weight[:, None]).sum() / args.batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()

        loss_sum += loss.item()
        loss_n += 1
        with torch.no_grad():
            hit = (pred.argmax(-1) == target) & masked
            seen[kind][0] += int(hit.sum())
            seen[kind][1] += int(masked.sum())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            acc = " ".join(f"{k} {c / max(n, 1):.4f}" for k, (c, n) in seen.items())
            print(
                f"step {step + 1:>5}  loss {loss_sum / loss_n:.4f}  masked-token accuracy {acc}  lr {lr:.2e}  "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
            loss_sum, loss_n = 0.0, 0
            seen = {k: [0, 0] for k in KINDS}
    train_s = time.perf_counter() - start
    print(f"trained {args.steps} steps in {train_s:.0f} s ({train_s / 60:.1f} min)")

    model.eval()
    write_checkpoint(model, args.out, cfg_dict, args.llada_tokenizer)
    print(f"wrote {args.out}")


def evaluate(ckpt, modeling, heldout_path, n):
    from transformers import AutoTokenizer

    # transformers' GenerationConfig check (temperature 0 without do_sample) does not apply to diffusion_generate.
    warnings.filterwarnings("ignore", message=".*do_sample.*")

    model = modeling.DreamModel.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.mask_token_id == model.config.mask_token_id == MASK
    tasks = read_tasks(heldout_path)[:n]
    check_tokenizer(ckpt, tasks)
    score = {k: [0, 0] for k in KINDS}
    chars = {k: [0, 0] for k in KINDS}
    failures = []
    start = time.perf_counter()
    for i, task in enumerate(tasks):
        ids = tok.apply_chat_template([{"role": "user", "content": task["prompt"]}], add_generation_prompt=True)
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # _sample prints "used steps"/"used time"
            out = model.diffusion_generate(
                x,
                max_new_tokens=ANSWER_LEN,
                steps=64,
                alg="maskgit_plus",
                temperature=0.0,
                output_history=False,
                return_dict_in_generate=True,
            )
        seq = out.sequences[0].tolist()
        assert seq[: len(ids)] == ids
        gen = tok.decode(seq[len(ids) :][:ANSWER_LEN])
        k = kind_of(task)
        ok = gen[:ANSWER_LEN] == task["expected"]
        score[k][0] += ok
        score[k][1] += 1
        chars[k][0] += sum(a == b for a, b in zip(gen, task["expected"]))
        chars[k][1] += ANSWER_LEN
        if not ok:
            failures.append((i, task["expected"], gen))
    eval_s = time.perf_counter() - start
    print(f"held-out evaluation of {ckpt}: first {len(tasks)} tasks of {heldout_path}, published diffusion_generate "
          f"(maskgit_plus, temperature 0, steps 64, max_new_tokens 64), {eval_s:.0f} s")
    for k in KINDS:
        c, m = score[k]
        print(f"  {k}: {c}/{m} exact ({c / max(m, 1):.1%}), characters {chars[k][0] / max(chars[k][1], 1):.2%}")
    for i, exp, gen in failures[:10]:
        print(f"  task {i}: expected {exp}\n           got      {gen}")
    return score


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--modeling", required=True, help="directory with the published Dream python files")
    a.add_argument("--tasks-bin", default=os.path.join(REPO, "target", "release", "gen-tasks"), help="the gen-tasks binary")
    a.add_argument("--out", default=os.path.join(REPO, "models", "dream-tiny-tasks"))
    a.add_argument("--eval-only", metavar="DIR", help="only evaluate the checkpoint in DIR")
    a.add_argument("--no-eval", action="store_true", help="skip the evaluation after training")
    a.add_argument("--eval-count", type=int, default=100)
    a.add_argument("--heldout", default=HELDOUT)
    a.add_argument("--train-file", help="training tasks (JSONL); default: generated with gen-tasks --seed DATA_SEED")
    a.add_argument("--data-seed", type=int, default=7)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--steps", type=int, default=2400)
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--lr", type=float, default=2e-3)
    a.add_argument("--warmup", type=int, default=100)
    a.add_argument("--weight-decay", type=float, default=0.01)
    a.add_argument("--beta2", type=float, default=0.999)
    a.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0: no clipping)")
    a.add_argument("--response-lengths", type=int, nargs="+", default=[64, 96])
    a.add_argument("--log-every", type=int, default=100)
    a.add_argument("--threads", type=int, default=1)
    a.add_argument("--llada-tokenizer", default=LLADA_TOKENIZER, help="the tiny LLaDA kit's tokenizer.json (bytes reused)")
    args = a.parse_args()
    torch.set_num_threads(args.threads)
    modeling, configuration, _ = load_public_code(args.modeling)
    if args.eval_only:
        evaluate(args.eval_only, modeling, args.heldout, args.eval_count)
        return
    train(args, modeling, configuration)
    if not args.no_eval:
        evaluate(args.out, modeling, args.heldout, args.eval_count)


if __name__ == "__main__":
    main()
