#!/usr/bin/env bash
# Issue 12's measurements in one run: the LLaDA-MoE-7B-A1B shape, q4, compiled for a window
# whose expert pools hold a quarter of each layer's experts; generations (32-token prompt,
# gen 128, block 32, steps 128, dual cache) under each expert strategy, with the accelerator
# path and the CPU path one thread each (the host standing in for an NPU and a CPU cluster:
# every strategy gets the same two engines), in ROUNDS rounds of the three back to back (a
# shared VM's speed drifts by tens of percent over minutes: each round's ratios are its
# own); then lru and static with both cores on their one path, for comparison; then the
# plan's phone estimates.
#
#   tools/bench/moe.sh CKPT OUT_DIR [ROUNDS=3]
#
# CKPT: a checkpoint from `gen-checkpoint --preset llada-moe-7b`. Artifacts and JSON go to
# OUT_DIR. Needs about 25 GB of disk (with the checkpoint) and 6 GB of memory.
set -euo pipefail
ckpt="$1"; out="$2"; rounds="${3:-3}"
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release"
. "$(dirname "$0")/expert_window.sh"
mkdir -p "$out"; cd "$out"
grep -m1 "model name" /proc/cpuinfo; nproc; date -u
compile_full_and_quarter "$ckpt" moe
# The artifact's pages in the page cache (compiling read the checkpoint through it).
cat moe-quarter.lad > /dev/null
ids=$(python3 -c "print(','.join(str((i * 104729 + 7) % 157184) for i in range(32)))")
run() {
  local name="$1"; shift
  # Every run starts with the artifact in the page cache: some VMs reclaim cold file pages
  # between runs (DAMON pageout), and an expert read back from disk is not what is compared.
  cat moe-quarter.lad > /dev/null
  "$bin/llada-rt" run moe-quarter.lad --prompt-ids "$ids" --gen-len 128 --block-len 32 --steps 128 --policy dual --json "$@" > "run-$name.json"
}
for r in $(seq 1 "$rounds"); do
  run "hybrid-$r" --experts hybrid --threads 1 --cpu-threads 1
  run "lru-$r" --experts lru --threads 1 --cpu-threads 1
  run "static-$r" --experts static --threads 1 --cpu-threads 1
done
run lru-2threads --experts lru --threads 2
run static-2threads --experts static --threads 1 --cpu-threads 2
ROUNDS="$rounds" python3 - <<'PY'
import json, os, statistics
rounds = int(os.environ["ROUNDS"])
names = [f"{s}-{r}" for r in range(1, rounds + 1) for s in ("hybrid", "lru", "static")] + ["lru-2threads", "static-2threads"]
runs = {n: json.load(open(f"run-{n}.json")) for n in names}
ids = runs["hybrid-1"]["output_ids"]
print("run | threads (accelerator + CPU path) | seconds | same tokens as hybrid-1 | hit rate | accelerator / CPU experts per pass | ms per expert, accelerator / CPU | staged MiB per pass | stall s per pass | CPU-path wait s per pass | prefetched (used) | refreshed")
for n, d in runs.items():
    x = d["window"]["experts"]; c = x["counters"]; p = x["per_pass"]
    threads = {"lru-2threads": "2 + 0", "static-2threads": "1 + 2"}.get(n, "1 + 1")
    per = lambda s, n: f"{1000 * s / n:.2f}" if n else "-"
    print(f"{n} | {threads} | {d['seconds']:.2f} | {d['output_ids'] == ids} | {x['hit_rate']:.3f} | {p['accelerator_experts']:.1f} / {p['cpu_experts']:.1f} | "
          f"{per(c['accelerator_seconds'], c['accelerator_experts'])} / {per(c['cpu_seconds'], c['cpu_experts'])} | "
          f"{p['staged_bytes'] / 2**20:.1f} | {p['stall_seconds']:.4f} | {p['cpu_wait_seconds']:.4f} | {c['prefetched']} ({c['prefetch_used']}) | {c['refreshed']}")
ratios = []
for r in range(1, rounds + 1):
    h, l, s = (runs[f"{x}-{r}"]["seconds"] for x in ("hybrid", "lru", "static"))
    ratios.append(min(l, s) / h)
    print(f"round {r}: hybrid {h:.2f} s, lru {l:.2f} s, static {s:.2f} s: {min(l, s) / h:.3f}x the better baseline")
print(f"median over rounds: {statistics.median(ratios):.3f}x")
PY
for t in sm8650 sm8750 dimensity9400; do
  # The Snapdragon targets' host stand-ins (MoE has no NPU executables yet).
  case "$t" in sm*) only=--host-only ;; *) only= ;; esac
  [ -f "moe-$t.lad" ] || "$bin/lladac" compile --model "$ckpt" --quant q4 --group 32 --target "$t" $only -o "moe-$t.lad"
  "$bin/lladac" inspect "moe-$t.lad" | grep -E "^experts"
  "$bin/lladac" inspect "moe-$t.lad" --estimate --rows 32,160 | sed -n "/^ESTIMATE/,\$p"
done
