#!/usr/bin/env bash
# mbsd on Dream against Dream's exact sampler on a task set: the trained tiny Dream
# (models/dream-tiny-tasks) on the 200 held-out tasks, exact (the published diffusion_generate,
# no blocks), dual (Fast-dLLM's blocked sampler), and mbsd with and without revision.
# Usage: tools/bench/dream_mbsd.sh OUT_DIR
set -euo pipefail
out=$1
mkdir -p "$out"
cargo build --release -q -p lladac -p llada-rt-tools
lladac=target/release/lladac rt=target/release/llada-rt
$lladac compile --model "${MODEL:-models/dream-tiny-tasks}" -o "$out/dream-tiny.lad" > /dev/null
tasks=models/tasks/heldout.jsonl gen="--gen-len 64 --steps 64"
$rt eval "$out/dream-tiny.lad" --tasks $tasks $gen --block-len 64 --policy exact --json > "$out/eval-exact.json"
ref="--reference $out/eval-exact.json"
$rt eval "$out/dream-tiny.lad" --tasks $tasks $gen --block-len 32 --policy dual $ref --json > "$out/eval-dual.json"
$rt eval "$out/dream-tiny.lad" --tasks $tasks $gen --block-len 32 --policy mbsd --revision off $ref --json > "$out/eval-mbsd-off.json"
$rt eval "$out/dream-tiny.lad" --tasks $tasks $gen --block-len 32 --policy mbsd --revision dual-path $ref --json > "$out/eval-mbsd-revision.json"
$rt eval "$out/dream-tiny.lad" --tasks $tasks $gen --block-len 32 --policy mbsd --spec-blocks 0 --revision off $ref --json > "$out/eval-mbsd-nospec.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| policy | accuracy | exact match vs exact | dense passes / task | dense rows / task | drafts accepted / dropped | side checks / revisions | seconds |")
print("|---|---|---|---|---|---|---|---|")
for n in ["exact", "dual", "mbsd-off", "mbsd-revision", "mbsd-nospec"]:
    d = json.load(open(f"{out}/eval-{n}.json")); t = d["tasks"]; m = d.get("mbsd") or {}; s = m.get("side") or {}
    em = d.get("exact_match")
    print(f"| {n} | {100*d['accuracy']:.1f}% | {'-' if em is None else f'{100*em:.1f}%'} | {d['forward_passes']/t:.2f} | {d['rows_computed']/t:.1f} | "
          f"{m.get('drafts_accepted', '-')} / {m.get('drafts_dropped', '-')} | {s.get('checks', '-')} / {s.get('revisions', '-')} | {d['seconds']:.1f} |")
PY
