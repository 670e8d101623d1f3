# Sourced by the MoE benches (moe.sh, llada2.sh), after they set `bin` and cd into OUT_DIR.
#
# compile_full_and_quarter CKPT NAME: NAME-full.lad, q4 with every expert resident, and
# NAME-quarter.lad, compiled for the window that ends a quarter of the way through the full
# plan's expert pools (each compiled only when absent); then the quarter plan's expert lines.
compile_full_and_quarter() {
  local ckpt="$1" name="$2" window
  [ -f "$name-full.lad" ] || "$bin/lladac" compile --model "$ckpt" --quant q4 --max-seq 256 -o "$name-full.lad"
  window=$("$bin/lladac" inspect "$name-full.lad" --json | python3 -c "
import json, sys
for r in json.load(sys.stdin)['window']['map']:
    if r['what'].startswith('expert slots'):
        print(r['offset'] + r['bytes'] // 4)")
  [ -f "$name-quarter.lad" ] || "$bin/lladac" compile --model "$ckpt" --quant q4 --max-seq 256 --window-bytes "$window" -o "$name-quarter.lad"
  "$bin/lladac" inspect "$name-quarter.lad" | grep -E "^experts|expert slots"
}
