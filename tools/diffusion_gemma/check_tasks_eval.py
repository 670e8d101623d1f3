#!/usr/bin/env python3
"""Checks `llada-rt eval --json` runs of the trained tiny DiffusionGemma (models/diffusiongemma-tiny-tasks).

    python3 tools/diffusion_gemma/check_tasks_eval.py --torch TORCH.json --fast FAST.json --min-accuracy 0.8 \
        [--published tests/data/diffusiongemma-tasks/published_ids.json]

TORCH.json and FAST.json: the same tasks under `--rng torch` and `--rng fast`. Fails unless both accuracies reach
--min-accuracy, and, with --published (the published generate's new ids, train_tiny_tasks.py --ids-json, at the
eval's --seed), unless every task the two share has the published ids and model calls under `--rng torch`. Standard library only.
"""

import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--torch", required=True, help="llada-rt eval --json --rng torch output")
    a.add_argument("--fast", required=True, help="llada-rt eval --json --rng fast output")
    a.add_argument("--min-accuracy", type=float, required=True)
    a.add_argument("--published", help="the published generate's ids (train_tiny_tasks.py --ids-json)")
    args = a.parse_args()
    torch_run, fast_run = load(args.torch), load(args.fast)
    failures = []
    for name, run in (("torch", torch_run), ("fast", fast_run)):
        rng = (run.get("settings") or {}).get("rng")
        if rng != name:
            failures.append(f"{name}: the report's settings say rng {rng!r}")
        print(f"--rng {name}: {run['correct']}/{run['tasks']} correct (accuracy {run['accuracy']:.3f})")
        if run["accuracy"] < args.min_accuracy:
            failures.append(f"--rng {name}: accuracy {run['accuracy']:.3f} below {args.min_accuracy}")
    if args.published:
        published = load(args.published)
        if torch_run["settings"]["seed"] != published["seed"]:
            failures.append(f"the eval's seed {torch_run['settings']['seed']} is not the published run's {published['seed']}")
        n = min(len(published["output_ids"]), len(torch_run["results"]))
        pairs = list(zip(torch_run["results"], published["output_ids"], published["model_calls"]))[:n]
        same = sum(r["output_ids"] == ids for r, ids, _ in pairs)
        # The model calls (encoder and decoder passes) follow the random stream more closely than the ids: the
        # stopping rule reads every step's argmax canvas and entropies.
        same_calls = sum(r["forward_passes"] == calls for r, _, calls in pairs)
        print(f"--rng torch: the published generate's ids on {same}/{n} tasks, its model calls on {same_calls}/{n}")
        if same != n or same_calls != n:
            failures.append(f"--rng torch: {n - same} of {n} tasks differ from the published generate's ids, {n - same_calls} in model calls")
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
