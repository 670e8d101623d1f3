#!/usr/bin/env bash
# Issue 8's measurements in one run: the LLaDA-8B-shape q4 forward pass with every weight
# resident against a 2 GiB window that stages most of them (async, and sync for
# comparison), peak resident memory of a generation under each plan, and the cost model's
# predictions from this machine's measured rates against measured pass times (1B and 8B).
#
#   tools/bench/window.sh CKPT_8B CKPT_1B OUT_DIR
#
# CKPT_*: checkpoints from `gen-checkpoint --preset llada-8b|llada-1b`. Artifacts and JSON
# reports go to OUT_DIR. Needs about 25 GB of disk and 10 GB of memory.
set -euo pipefail
ckpt8="$1"; ckpt1="$2"; out="$3"
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release"
mkdir -p "$out"; cd "$out"
grep -m1 "model name" /proc/cpuinfo; date -u
[ -f 8b-q4-resident.lad ] || "$bin/lladac" compile --model "$ckpt8" -o 8b-q4-resident.lad --quant q4 --max-seq 1024
[ -f 8b-q4-2g.lad ] || "$bin/lladac" compile --model "$ckpt8" -o 8b-q4-2g.lad --quant q4 --max-seq 1024 --window-bytes 2G
[ -f 1b-q4.lad ] || "$bin/lladac" compile --model "$ckpt1" -o 1b-q4.lad --quant q4 --max-seq 1024
"$bin/llada-rt" roofline --json > roofline.json
for a in 1b-q4 8b-q4-resident; do
  "$bin/lladac" inspect $a.lad --estimate --rows 32,64,128 --rates roofline.json --json > estimate-$a.json
done
# The three 8B passes back to back.
"$bin/llada-rt" bench 8b-q4-resident.lad --rows 32,64,128 --repeat 3 --json > bench-8b-resident.json
"$bin/llada-rt" bench 8b-q4-2g.lad --rows 32,64,128 --repeat 3 --json > bench-8b-2g-async.json
"$bin/llada-rt" bench 8b-q4-2g.lad --rows 32,64,128 --repeat 3 --staging sync --json > bench-8b-2g-sync.json
"$bin/llada-rt" bench 1b-q4.lad --rows 32,64,128 --repeat 3 --json > bench-1b.json
ids=$(seq -s, 1000 1031)
for a in 8b-q4-2g 8b-q4-resident; do
  /usr/bin/time -v "$bin/llada-rt" run $a.lad --prompt-ids "$ids" --gen-len 128 --block-len 32 --steps 4 --json > run-$a.json 2> time-$a.txt
done
python3 - <<'PY'
import json
def passes(f): return {p["rows"]: p for p in json.load(open(f))["passes"]}
res, asy, syn, b1 = passes("bench-8b-resident.json"), passes("bench-8b-2g-async.json"), passes("bench-8b-2g-sync.json"), passes("bench-1b.json")
print("8B q4 pass seconds: rows | resident | 2G async (ratio, stall s, staged MiB, overlap) | 2G sync (ratio, stall s)")
for r in (32, 64, 128):
    a, s = asy[r], syn[r]
    print(f"{r:4} | {res[r]['seconds']:.3f} | {a['seconds']:.3f} ({a['seconds']/res[r]['seconds']:.3f}, {a['stall_seconds']:.3f}, {a['staged_bytes']/2**20:.0f}, {a['overlap']:.2f}) | {s['seconds']:.3f} ({s['seconds']/res[r]['seconds']:.3f}, {s['stall_seconds']:.3f})")
for name, meas in (("1b-q4", b1), ("8b-q4-resident", res)):
    est = {p["rows"]: p for p in json.load(open(f"estimate-{name}.json"))["estimate"]["passes"]}
    for r in (32, 64, 128):
        print(f"cost model {name} rows {r}: predicted {est[r]['seconds']:.3f} s, measured {meas[r]['seconds']:.3f} s, error {est[r]['seconds']/meas[r]['seconds']-1:+.1%}")
for a in ("8b-q4-2g", "8b-q4-resident"):
    rss = [l for l in open(f"time-{a}.txt") if "Maximum resident" in l][0].split()[-1]
    w = json.load(open(f"run-{a}.json"))["window"]
    print(f"{a}: peak RSS {int(rss)/2**20:.2f} GiB; window {w['bytes']/2**30:.2f} GiB, staged {w['staged_bytes']/2**30:.1f} GiB, stall {w['stall_seconds']:.2f} s")
PY
