#!/usr/bin/env bash
# LLaDA 2.x's policies on a task set: the trained tiny LLaDA 2.x (models/llada2-tiny-tasks) on
# the 200 held-out tasks, gen 64 in blocks of 32: its published 2.0 generate (exact, 32 steps a
# block, threshold 0.95), mbsd without and with drafts of the next block, the same under the
# schedule alone (threshold 1, 8 steps a block; agreement against that schedule's exact run),
# and 2.1's generate with token editing (the published default 0.9, and the card's speed mode;
# agreement against exact). Each run's
# accuracy, agreement with exact, model calls (= passes), rows and seconds, one thread.
# Usage: tools/bench/llada2_mbsd.sh OUT_DIR
set -euo pipefail
out=$1
mkdir -p "$out"
cargo build --release -q -p lladac -p llada-rt-tools
lladac=target/release/lladac rt=target/release/llada-rt
grep -m1 "model name" /proc/cpuinfo; date -u
$lladac compile --model "${MODEL:-models/llada2-tiny-tasks}" -o "$out/llada2-tiny.lad" > /dev/null
tasks=models/tasks/heldout.jsonl gen="--gen-len 64 --block-len 32 --threads 1 --cpu-threads 1"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --policy exact --json > "$out/eval-exact.json"
ref="--reference $out/eval-exact.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --policy mbsd --spec-blocks 0 $ref --json > "$out/eval-mbsd-nodrafts.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --policy mbsd --spec-blocks 1 $ref --json > "$out/eval-mbsd.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --policy mbsd --spec-blocks 1 --spec-threshold 0.9 $ref --json > "$out/eval-mbsd-0.9.json"
# The schedule alone (no threshold commit above it: 8 calls of 4 a block), where a call commits
# few and drafts can save calls.
sched="--threshold 1 --steps 8"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen $sched --policy exact --json > "$out/eval-sched-exact.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen $sched --policy mbsd --spec-blocks 0 --reference "$out/eval-sched-exact.json" --json > "$out/eval-sched-mbsd-nodrafts.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen $sched --policy mbsd --spec-blocks 1 --reference "$out/eval-sched-exact.json" --json > "$out/eval-sched-mbsd.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --editing-threshold 0.9 $ref --json > "$out/eval-edit-0.9.json"
$rt eval "$out/llada2-tiny.lad" --tasks $tasks $gen --threshold 0.5 --editing-threshold 0 $ref --json > "$out/eval-edit-speed.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| run | accuracy | exact match vs exact | model calls (= passes) / task | rows / task | drafts accepted / dropped | seconds |")
print("|---|---|---|---|---|---|---|")
for n in ["exact", "mbsd-nodrafts", "mbsd", "mbsd-0.9", "sched-exact", "sched-mbsd-nodrafts", "sched-mbsd", "edit-0.9", "edit-speed"]:
    d = json.load(open(f"{out}/eval-{n}.json")); t = d["tasks"]; m = d.get("mbsd") or {}
    em = d.get("exact_match")
    print(f"| {n} | {100*d['accuracy']:.1f}% | {'-' if em is None else f'{100*em:.1f}%'} | {d['forward_passes']/t:.2f} | {d['rows_computed']/t:.1f} | "
          f"{m.get('drafts_accepted', '-')} / {m.get('drafts_dropped', '-')} | {d['seconds']:.2f} |")
PY
