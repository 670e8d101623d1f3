#!/usr/bin/env bash
# Activation quantisation against residual-stream outliers (issue 29, item 4): for a 1B-shape
# checkpoint without outliers and the same checkpoint with a few large channels
# (gen-checkpoint --outlier-channels/--outlier-gain), the q8 and q4 artifacts against the
# unquantised one (bf16 weights, f32 activations): first-pass logit error, top-1 and token
# agreement, and the generation time of each (llada-rt compare).
# Usage: tools/bench/outliers.sh OUT_DIR [GAIN ...]   (default gains: 20 100)
set -euo pipefail
out=$1; shift
gains=${*:-20 100}
mkdir -p "$out"
cargo build --release -q -p lladac -p llada-rt-tools -p llada-tools
lladac=target/release/lladac rt=target/release/llada-rt gen=target/release/gen-checkpoint
ids=$(python3 -c "print(','.join(str((i*104729+7)%126000) for i in range(32)))")
args="--gen-len 32 --block-len 32 --steps 32 --policy dual --threads 2"
for gain in 0 $gains; do
  ckpt="$out/ckpt-$gain"
  if [ "$gain" = 0 ]; then extra=""; else extra="--outlier-channels 6 --outlier-gain $gain"; fi
  [ -d "$ckpt" ] || $gen --preset llada-1b --dtype bf16 $extra -o "$ckpt" 2> /dev/null
  [ -f "$out/ref-$gain.lad" ] || $lladac compile --model "$ckpt" -o "$out/ref-$gain.lad" > /dev/null
  for q in q8 q4; do
    [ -f "$out/$q-$gain.lad" ] || $lladac compile --model "$ckpt" --quant $q -o "$out/$q-$gain.lad" > /dev/null
    $rt compare "$out/ref-$gain.lad" "$out/$q-$gain.lad" --prompt-ids "$ids" $args --json > "$out/compare-$q-$gain.json"
  done
  rm -rf "$ckpt"
done
python3 - "$out" $gains <<'PY'
import json, sys
out, gains = sys.argv[1], ["0"] + sys.argv[2:]
print("| outliers (6 channels) | weights | activation scale | logit error (L2, relative) | largest error / largest logit | top-1 agreement | token agreement | seconds (vs unquantised) |")
print("|---|---|---|---|---|---|---|---|")
for g in gains:
    for q in ["q8", "q4"]:
        d = json.load(open(f"{out}/compare-{q}-{g}.json"))
        label = "none" if g == "0" else f"gain {g}"
        print(f"| {label} | {q} | per row | {d['logit_relative_error']:.4f} | {d['logit_max_error']:.4f} | {100*d['top1_agreement']:.1f}% | {100*d['token_agreement']:.1f}% | {d['other_seconds']:.2f} ({d['reference_seconds']:.2f}) |")
PY
