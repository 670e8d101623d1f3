"""Shared by the tiny task models' training scripts (tools/dream, tools/llada2, tools/diffusion_gemma): the task
file, the learning-rate schedule and the training log. Standard library only."""

import json
import math
import time


def read_tasks(path):
    """A `gen-tasks` file: one JSON task a line."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def kind_of(task):
    """FILL, SHIFT, ...: the prompt's prefix."""
    return task["prompt"].split(":", 1)[0]


def learning_rate(step, steps, peak, warmup):
    """Linear warm-up to `peak`, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def alternating_batches(by_kind, kinds, size, steps):
    """(step, kind, tasks) for each step: one kind per batch in turn, each kind's tasks in file order."""
    cursor = {k: 0 for k in kinds}
    for step in range(steps):
        kind = kinds[step % len(kinds)]
        batch = by_kind[kind][cursor[kind] : cursor[kind] + size]
        if len(batch) != size:
            raise SystemExit(f"ran out of {kind} training tasks at step {step}")
        cursor[kind] += size
        yield step, kind, batch


class StepLog:
    """The mean loss and each kind's accuracy on the learnt positions, printed every `every` steps."""

    def __init__(self, kinds, steps, every, label):
        self.kinds, self.steps, self.every, self.label = kinds, steps, every, label
        self.start = time.perf_counter()
        self._reset()

    def _reset(self):
        self.loss_sum, self.loss_n, self.seen = 0.0, 0, {k: [0, 0] for k in self.kinds}

    def add(self, step, kind, loss, hits, positions, lr):
        """`hits` of `positions` learnt positions predicted right at 0-based `step`."""
        self.loss_sum, self.loss_n = self.loss_sum + loss, self.loss_n + 1
        self.seen[kind][0] += hits
        self.seen[kind][1] += positions
        if (step + 1) % self.every == 0 or step + 1 == self.steps:
            acc = " ".join(f"{k} {c / max(m, 1):.4f}" for k, (c, m) in self.seen.items())
            print(f"step {step + 1:>5}  loss {self.loss_sum / self.loss_n:.4f}  {self.label} accuracy {acc}  lr {lr:.2e}  "
                  f"{self.seconds():.0f} s", flush=True)
            self._reset()

    def seconds(self):
        return time.perf_counter() - self.start
