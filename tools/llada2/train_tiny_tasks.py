#!/usr/bin/env python3
"""Trains a tiny LLaDA 2.x (the published LLaDA2MoeModelLM, its Hugging Face layout) on the project's FILL/SHIFT tasks.

    gen-checkpoint --preset tiny-llada2 --dtype f32 -o BASE
    python tools/llada2/train_tiny_tasks.py --modeling DIR --base BASE --out models/llada2-tiny-tasks
    python tools/llada2/train_tiny_tasks.py --modeling DIR --eval-only models/llada2-tiny-tasks

DIR holds the published LLaDA2.0 modeling_llada2_moe.py (`modeling_llada2_moe_v20.py`), LLaDA2.1's
(`modeling_llada2_moe_v21.py`) and configuration_llada2_moe.py (`configuration_llada2_moe_v20.py`), loaded at run time
(make_golden.load_published), not kept here. BASE gives the tokenizer files and the config, of which this changes
num_hidden_layers (4) and initializer_range (0.02, the class default); the weights are a fresh init.

Model: hidden 128, 4 layers (the first dense, SwiGLU 192), 4 query and 2 key/value heads of 32, QK-norm, rotary over
half of each head (theta 6e5), 16 routed experts of 64 (top 4 of them, within the best 2 of 4 groups, sigmoid
router with its expert bias left at zero, routed scaling 2.5) and a shared expert; vocabulary 320 (bytes, the chat
template's tokens, <|endoftext|> 274, <|mask|> 275); float32.

Data: `gen-tasks --seed 7` (held-out models/tasks/heldout.jsonl is seed 20261122), FILL and SHIFT, one kind per
batch in turn. Each example is the LLaDA 2.x chat prompt (`<role>HUMAN</role>{prompt}<|role_end|><role>ASSISTANT</role>`,
the tokenizer's template with the generation prompt) followed by the answer region: the 64 answer characters alone,
or followed by <|endoftext|> to 96 tokens (drawn per batch), then <|endoftext|> to the end of its 32-token block.

Objective (block diffusion, as the published generate decodes): the blocks lie on a grid of 32 from position 0. Per
batch a block k holding answer positions is drawn; the sequence is cut at its end; the blocks before k are clean, and
in block k each answer position is replaced by <|mask|> with probability p = (1 - 1e-3) t + 1e-3, t ~ U(0, 1) per
sequence (prompt positions stay clean). The model sees the block-causal mask (0 / -inf: a block attends to itself
and the blocks before it), and the loss is the cross-entropy of the masked positions (same position, no shift),
weighted by 1 / (p * answer positions in the block), summed and divided by the batch size. AdamW (0.9/0.999, eps
1e-8, weight decay 0.01), peak lr 2e-3 after 100 warm-up steps, cosine to a tenth, gradient norm clipped to 1.0,
batch 16. Seed 1, one CPU thread: a run is reproducible bit for bit.

Evaluation (also after training): the published 2.0 `generate` with 2.1's sampling function (make_golden's pairing:
2.0 draws with torch.multinomial even at temperature 0), greedy, block 32, 32 steps per block, threshold 0.95,
gen_length 64, on the first N held-out tasks; a task counts when the 64 generated characters equal `expected`.
"""

import argparse
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
from make_golden import load_published, record_calls  # noqa: E402
from task_training import StepLog, alternating_batches, kind_of, learning_rate, read_tasks  # noqa: E402

REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
HELDOUT = os.path.join(REPO, "models", "tasks", "heldout.jsonl")
ANSWER_LEN = 64
BLOCK = 32
KINDS = ("FILL", "SHIFT")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def prompt_ids(tok, task):
    return tok.apply_chat_template([{"role": "user", "content": task["prompt"]}], add_generation_prompt=True)


def answer_ids(tok, task):
    ids = tok.encode(task["expected"], add_special_tokens=False)
    assert len(ids) == ANSWER_LEN, (task["expected"], ids)
    return ids


def block_causal_mask(length):
    blocks = torch.arange(length) // BLOCK
    visible = blocks[None, :] <= blocks[:, None]
    return torch.where(visible, 0.0, float("-inf"))[None, None]


def make_batch(tok, tasks, response_len, eos, mask, g, editing_noise=0.0, alphabet=None):
    """Inputs (cut at the end of the drawn block, its answer positions noised), targets, the positions the loss
    covers, their weights."""
    prompts = [prompt_ids(tok, t) for t in tasks]
    assert len({len(p) for p in prompts}) == 1, "one kind per batch: equal prompt lengths"
    plen = len(prompts[0])
    total = -(-(plen + response_len) // BLOCK) * BLOCK
    rows = [p + answer_ids(tok, t) + [eos] * (total - plen - ANSWER_LEN) for p, t in zip(prompts, tasks)]
    x = torch.tensor(rows, dtype=torch.long)
    first, last = plen // BLOCK, total // BLOCK - 1
    k = first + int(torch.randint(last - first + 1, (1,), generator=g))
    end = (k + 1) * BLOCK
    x = x[:, :end]
    b = len(tasks)
    answer = torch.zeros(end, dtype=torch.bool)
    answer[max(plen, k * BLOCK) :] = True
    t = torch.rand(b, generator=g)
    p = (1 - 1e-3) * t + 1e-3
    noised = (torch.rand(b, end, generator=g) < p[:, None]) & answer[None, :]
    inputs = torch.where(noised, torch.full_like(x, mask), x)
    n = int(answer.sum())
    if editing_noise == 0.0:
        return inputs, x, noised, (1.0 / (p * n))[:, None].expand(b, end)
    # 2.1's editing: some unmasked answer positions hold a wrong token; every answer position of the block is
    # learnt (masked ones weighted 1 / p as above, the others 1), so a token that is there is kept or mended.
    swapped = (torch.rand(b, end, generator=g) < editing_noise) & answer[None, :] & ~noised
    wrong = alphabet[torch.randint(len(alphabet), (b, end), generator=g)]
    inputs = torch.where(swapped, wrong, inputs)
    weight = torch.where(noised, 1.0 / p[:, None], torch.ones(b, end)) / n
    return inputs, x, answer[None, :].expand(b, end), weight


def train(args, v20):
    from transformers import AutoTokenizer

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.base)
    eos, mask = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|mask|>")
    heldout = read_tasks(args.heldout)
    with tempfile.TemporaryDirectory(prefix="llada2_tiny_tasks_") as tmp:
        train_file = os.path.join(tmp, "train.jsonl")
        subprocess.run([args.tasks_bin, "--seed", str(args.data_seed), "--count", str(args.steps * args.batch + 1000), "-o", train_file], check=True)
        tasks = read_tasks(train_file)
    held = {t["prompt"] for t in heldout}
    by_kind = {k: [t for t in tasks if kind_of(t) == k and t["prompt"] not in held] for k in KINDS}
    print("training tasks: " + ", ".join(f"{k} {len(v)}" for k, v in by_kind.items()))

    config = v20.LLaDA2MoeConfig.from_pretrained(args.base)
    config.num_hidden_layers = args.layers
    config.initializer_range = 0.02
    config._attn_implementation = "eager"
    model = v20.LLaDA2MoeModelLM(config).float()
    model.train()
    print(f"LLaDA2MoeModelLM: {sum(p.numel() for p in model.parameters())} parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    # The wrong tokens of --editing-noise: the answers' characters (digits and A to P).
    alphabet = torch.tensor(tok.encode("0123456789ABCDEFGHIJKLMNOP", add_special_tokens=False))
    log = StepLog(KINDS, args.steps, 100, "masked-token")
    for step, kind, batch in alternating_batches(by_kind, KINDS, args.batch, args.steps):
        response_len = (64, 96)[int(torch.randint(2, (1,), generator=g))]
        inputs, target, noised, weight = make_batch(tok, batch, response_len, eos, mask, g, args.editing_noise, alphabet)
        lr = learning_rate(step, args.steps, args.lr, 100)
        for group in opt.param_groups:
            group["lr"] = lr
        n = inputs.shape[1]
        am = block_causal_mask(n).expand(inputs.shape[0], 1, n, n)
        logits = model(inputs, attention_mask=am, position_ids=torch.arange(n)[None]).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view_as(target)
        loss = (ce * noised * weight).sum() / args.batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            log.add(step, kind, loss.item(), int(((logits.argmax(-1) == target) & noised).sum()), int(noised.sum()), lr)
    print(f"trained {args.steps} steps in {log.seconds():.0f} s")
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(args.base, f), os.path.join(args.out, f))
    print(f"wrote {args.out}")


def evaluate(ckpt, v20, v21, heldout, n, editing):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    eos, mask = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|mask|>")
    model = (v20 if editing is None else v21).LLaDA2MoeModelLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    score = {k: [0, 0] for k in KINDS}
    start = time.perf_counter()
    for task in read_tasks(heldout)[:n]:
        ids = prompt_ids(tok, task)
        with torch.no_grad():
            if editing is None:
                out = model.generate(inputs=torch.tensor([ids]), temperature=0.0, block_length=BLOCK, steps=32, gen_length=ANSWER_LEN,
                                     threshold=0.95, eos_id=eos, mask_id=mask)
            else:
                # 2.1's generate, its 0/1 mask given to the model as its log (make_golden's reading).
                out, _ = record_calls(model, True, lambda: model.generate(
                    inputs=torch.tensor([ids]), temperature=0.0, block_length=BLOCK, gen_length=ANSWER_LEN, threshold=0.95,
                    editing_threshold=editing, eos_id=eos, mask_id=mask))
        got = tok.decode(out[0].tolist()[:ANSWER_LEN])
        k = kind_of(task)
        score[k][0] += got == task["expected"]
        score[k][1] += 1
    loop = "published 2.0 generate (2.1's greedy sampling), 32 steps a block" if editing is None else f"published 2.1 generate, editing_threshold {editing}"
    print(f"held-out evaluation of {ckpt}: first {n} tasks, {loop}, block 32, threshold 0.95, gen_length 64, {time.perf_counter() - start:.0f} s")
    for k, (c, m) in score.items():
        print(f"  {k}: {c}/{m} exact")


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--modeling", required=True)
    a.add_argument("--base", help="gen-checkpoint --preset tiny-llada2 --dtype f32 output (config and tokenizer)")
    a.add_argument("--tasks-bin", default=os.path.join(REPO, "target", "release", "gen-tasks"))
    a.add_argument("--out", default=os.path.join(REPO, "models", "llada2-tiny-tasks"))
    a.add_argument("--eval-only", metavar="DIR")
    a.add_argument("--eval-count", type=int, default=100)
    a.add_argument("--heldout", default=HELDOUT)
    a.add_argument("--data-seed", type=int, default=7)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--steps", type=int, default=2400)
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--layers", type=int, default=4)
    a.add_argument("--lr", type=float, default=2e-3)
    a.add_argument("--eval-editing", type=float, help="also evaluate with 2.1's generate at this editing_threshold")
    a.add_argument("--editing-noise", type=float, default=0.0,
                   help="2.1-style: this share of the block's unmasked answer positions hold a wrong token, and every answer "
                        "position of the block is learnt (0: 2.0's objective, masked positions only)")
    args = a.parse_args()
    torch.set_num_threads(1)
    v20, v21 = load_published(args.modeling)
    if not args.eval_only:
        train(args, v20)
    evaluate(args.eval_only or args.out, v20, v21, args.heldout, args.eval_count, None)
    if args.editing_noise > 0 or args.eval_editing is not None:
        evaluate(args.eval_only or args.out, v20, v21, args.heldout, args.eval_count, 0.9 if args.eval_editing is None else args.eval_editing)


if __name__ == "__main__":
    main()
