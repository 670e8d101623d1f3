#!/usr/bin/env bash
# Issue 9's measurements in one run: the embedded model on the 200 held-out tasks (exact, dual,
# mbsd without and with revision), and a 1B-shape q4 generation (dual against mbsd: the default,
# revision off, revision on; with a trace of the dense and side paths). Usage: tools/bench/mbsd.sh CKPT_1B OUT_DIR
set -euo pipefail
ckpt1b=$1 out=$2
mkdir -p "$out"
cargo build --release -q -p lladac -p llada-rt-tools
lladac=target/release/lladac rt=target/release/llada-rt
$lladac compile --model models/llada-tiny-tasks -o "$out/tiny.lad" > /dev/null
tasks=models/tasks/heldout.jsonl args="--gen-len 64 --block-len 32 --steps 64"
$rt eval "$out/tiny.lad" --tasks $tasks $args --policy exact --json > "$out/eval-exact.json"
$rt eval "$out/tiny.lad" --tasks $tasks $args --policy dual --reference "$out/eval-exact.json" --json > "$out/eval-dual.json"
$rt eval "$out/tiny.lad" --tasks $tasks $args --policy mbsd --revision off --reference "$out/eval-exact.json" --json > "$out/eval-mbsd-off.json"
$rt eval "$out/tiny.lad" --tasks $tasks $args --policy mbsd --revision dual-path --reference "$out/eval-exact.json" --json > "$out/eval-mbsd.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for n in ["exact", "dual", "mbsd-off", "mbsd"]:
    d = json.load(open(f"{out}/eval-{n}.json")); t = d["tasks"]; m = d.get("mbsd") or {}; s = m.get("side") or {}
    print(f"{n:9} accuracy {d['accuracy']:.3f} exact-match {d['exact_match'] if d['exact_match'] is not None else '-'} "
          f"passes/task {d['forward_passes']/t:.2f} rows/task {d['rows_computed']/t:.1f} seconds {d['seconds']:.1f} "
          f"drafts {m.get('drafts_accepted', '-')}/{m.get('drafts_dropped', '-')} revisions {s.get('revisions', '-')}")
PY
[ -f "$out/1b-q4.lad" ] || $lladac compile --model "$ckpt1b" --quant q4 -o "$out/1b-q4.lad" > /dev/null
ids=$(python3 -c "print(','.join(str((i*104729+7)%126000) for i in range(32)))")
gen="--gen-len 128 --block-len 32 --steps 128"
for run in "dual --threads 2" "mbsd --threads 2" "mbsd --revision off --threads 2" "mbsd --revision dual-path --threads 2" "mbsd --revision dual-path --threads 1"; do
  name=$(echo "$run" | tr -d ' -')
  $rt run "$out/1b-q4.lad" --prompt-ids "$ids" $gen --policy $run --json --trace "$out/trace-$name.json" > "$out/run-$name.json"
  python3 - "$out" "$name" <<'PY'
import json, sys
out, name = sys.argv[1:]
d = json.load(open(f"{out}/run-{name}.json")); m = d.get("mbsd") or {}; s = m.get("side") or {}
t = json.load(open(f"{out}/trace-{name}.json"))["traceEvents"]
dense = [e for e in t if e.get("ph") == "X" and e["tid"] == 1 and e["name"].startswith("pass")]
side = [e for e in t if e.get("ph") == "X" and e["tid"] == 3]
dense_s = sum(e["dur"] for e in dense) / 1e6
inside = sum(max(0, min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"])) for a in side for b in dense) / 1e6
print(f"{name:24} {d['seconds']:.2f} s, {d['forward_passes']} passes, {d['rows_computed']} rows; dense passes {dense_s:.2f} s; "
      f"side path {len(side)} passes {sum(e['dur'] for e in side)/1e6:.2f} s, {inside:.2f} s of it during dense passes; "
      f"stall {s.get('stall_seconds', 0):.3f} s ({100*s.get('stall_seconds', 0)/max(dense_s, 1e-9):.2f}% of dense time)")
PY
done
