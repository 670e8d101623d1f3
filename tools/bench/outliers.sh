#!/usr/bin/env bash
# Activation quantisation against residual-stream outliers (issue 29, item 4): for a 1B-shape
# checkpoint without outliers and the same checkpoint with 6 large channels
# (gen-checkpoint --outlier-channels 6 --outlier-gain G), the q8 and q4 artifacts with
# activation scales per row and per 32-input block, each against the unquantised artifact
# (bf16 weights, f32 activations): first-pass logit error, top-1 and token agreement, and the
# generation time of each (llada-rt compare, dual, gen 32). Then, on the checkpoint without
# outliers, one mbsd generation per artifact (gen 128, the settings of tools/bench/mbsd.sh)
# for the speed of each, one after another.
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
  [ -f "$out/ref-$gain.lad" ] || $lladac compile --model "$ckpt" -o "$out/ref-$gain.lad" 2> /dev/null
  for q in q8 q4; do
    for s in row block; do
      lad="$out/$q-$s-$gain.lad"
      [ -f "$lad" ] || $lladac compile --model "$ckpt" --quant $q --activation-scales $s -o "$lad" 2> /dev/null
      $rt compare "$out/ref-$gain.lad" "$lad" --prompt-ids "$ids" $args --json > "$out/compare-$q-$s-$gain.json"
      [ "$gain" = 0 ] || rm -f "$lad"
    done
  done
  rm -rf "$ckpt"
  [ "$gain" = 0 ] || rm -f "$out/ref-$gain.lad"
done
for q in q8 q4; do
  for s in row block; do
    $rt run "$out/$q-$s-0.lad" --prompt-ids "$ids" --gen-len 128 --block-len 32 --steps 128 --policy mbsd --threads 2 --json > "$out/run-$q-$s.json"
  done
done
python3 - "$out" $gains <<'PY'
import json, sys
out, gains = sys.argv[1], ["0"] + sys.argv[2:]
print("| outliers (6 channels) | weights | activation scales | logit error (L2, relative) | largest error / largest logit | top-1 agreement | token agreement |")
print("|---|---|---|---|---|---|---|")
for g in gains:
    for q in ["q8", "q4"]:
        for s in ["row", "block"]:
            d = json.load(open(f"{out}/compare-{q}-{s}-{g}.json"))
            label = "none" if g == "0" else f"gain {g}"
            print(f"| {label} | {q} | per {s} | {d['logit_relative_error']:.4f} | {d['logit_max_error']:.4f} | {100*d['top1_agreement']:.1f}% | {100*d['token_agreement']:.1f}% |")
print()
print("| weights | activation scales | mbsd gen 128 seconds | dual gen 32 seconds (unquantised: seconds) |")
print("|---|---|---|---|")
for q in ["q8", "q4"]:
    for s in ["row", "block"]:
        r = json.load(open(f"{out}/run-{q}-{s}.json")); c = json.load(open(f"{out}/compare-{q}-{s}-0.json"))
        print(f"| {q} | per {s} | {r['seconds']:.2f} | {c['other_seconds']:.2f} ({c['reference_seconds']:.2f}) |")
PY
