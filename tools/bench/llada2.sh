#!/usr/bin/env bash
# Issue 45's measurement: the LLaDA2.0-mini shape (16B parameters, 256 experts of which 8 a
# token, one shared), q4, with every expert resident, then compiled for a window whose expert
# pools hold a quarter of each layer's experts; one generation on each (32-token prompt, gen 64,
# LLaDA 2.x's published schedule: block 32, 32 steps per block, threshold 0.95) under each
# expert strategy, timed with its peak RSS, and mbsd on the resident plan; then the plan's phone
# estimates (host stand-ins for sm8650 and sm8750: LLaDA 2.x has no NPU executables).
#
#   tools/bench/llada2.sh CKPT OUT_DIR
#
# CKPT: a checkpoint from `gen-checkpoint --preset llada2-mini --dtype bf16` (32.5 GB).
# Artifacts (8.3 GiB each; the phone ones are removed after their estimate, one at a time) and JSON go to
# OUT_DIR. Needs about 18 GB of disk beside the checkpoint, and 10 GB of memory.
set -euo pipefail
ckpt="$1"; out="$2"
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release"
. "$(dirname "$0")/expert_window.sh"
mkdir -p "$out"; cd "$out"
grep -m1 "model name" /proc/cpuinfo; nproc; date -u
compile_full_and_quarter "$ckpt" mini
ids=$(python3 -c "print(','.join(str((i * 104729 + 7) % 156000) for i in range(32)))")
run() {
  local name="$1" art="$2"; shift 2
  # Every run starts with the artifact in the page cache (an expert read back from disk is
  # not what is compared).
  cat "$art" > /dev/null
  /usr/bin/time -f "%M" -o "rss-$name.txt" "$bin/llada-rt" run "$art" --prompt-ids "$ids" --gen-len 64 --json "$@" > "run-$name.json"
}
run resident mini-full.lad --experts hybrid --threads 1 --cpu-threads 1
# mbsd on the same plan: the block's masked and stale rows, drafts of the next block.
run resident-mbsd mini-full.lad --experts hybrid --threads 1 --cpu-threads 1 --policy mbsd
for s in hybrid lru static; do
  run "quarter-$s" mini-quarter.lad --experts "$s" --threads 1 --cpu-threads 1
done
python3 - <<'PY'
import json
names = ["resident", "resident-mbsd", "quarter-hybrid", "quarter-lru", "quarter-static"]
runs = {n: json.load(open(f"run-{n}.json")) for n in names}
ids = runs["resident"]["output_ids"]
print("run | seconds | peak RSS MiB | same tokens as resident | model calls | passes | rows | hit rate | experts per pass acc / CPU | staged experts | staged MiB | stall s")
for n, d in runs.items():
    x = d["window"]["experts"]; c = x["counters"]; p = x["per_pass"]
    rss = int(open(f"rss-{n}.txt").read().split()[-1]) / 1024
    print(f"{n} | {d['seconds']:.2f} | {rss:.0f} | {d['output_ids'] == ids} | {len(d['reveals'])} | {d['forward_passes']} | {d['rows_computed']} | {x['hit_rate']:.3f} | "
          f"{p['accelerator_experts']:.1f} / {p['cpu_experts']:.1f} | {c['staged_experts']} | {c['staged_bytes'] / 2**20:.1f} | {c['stall_seconds']:.3f}")
PY
for t in sm8650 sm8750; do
  "$bin/lladac" compile --model "$ckpt" --quant q4 --max-seq 1024 --target "$t" --host-only -o "mini-$t.lad"
  "$bin/lladac" inspect "mini-$t.lad" | grep -E "^experts"
  # A 32-row pass, and a generation under LLaDA 2.x's schedule at its slowest (prompt 32, gen
  # 128, 32 steps a block: one token a call).
  "$bin/lladac" inspect "mini-$t.lad" --estimate --rows 32 | sed -n "/^ESTIMATE/,\$p"
  rm -f "mini-$t.lad"
done
