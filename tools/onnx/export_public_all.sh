#!/usr/bin/env bash
# Writes tests/data/onnx-public/: the conformance checkpoints exported by the public LLaDA
# modeling code in each style a user's export takes (see export_public.py). Needs torch 2.x,
# onnx, onnxscript, transformers 4.46, einops and safetensors, and the public modeling files:
#   tools/onnx/export_public_all.sh DIR_WITH_modeling_llada.py [SHARED_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
modeling="$1"
shared="${2:-../shared}"
out=tests/data/onnx-public
A="$shared/conformance/tiny-llada-A"
B="$shared/conformance/tiny-llada-B"
export_() { python tools/onnx/export_public.py --modeling "$modeling" "$@"; }
rm -rf "$out"
export_ --model "$A" --out "$out/A-dynamo-opset18-dynamic" --opset 18 --dynamic
export_ --model "$A" --out "$out/A-dynamo-default-static"
export_ --model "$A" --out "$out/A-dynamo-opset23-static" --opset 23
export_ --model "$A" --out "$out/A-dynamo-opset23-dynamic-bf16" --opset 23 --dynamic --dtype bf16
export_ --model "$A" --out "$out/A-dynamo-opset18-bf16" --opset 18 --dtype bf16
export_ --model "$A" --out "$out/A-dynamo-opset18-f16" --opset 18 --dtype f16
export_ --model "$A" --out "$out/A-dynamo-opset18-external" --opset 18 --dynamic --external-data
export_ --model "$A" --out "$out/A-torchscript-opset17-static" --exporter torchscript --opset 17
export_ --model "$A" --out "$out/A-torchscript-opset17-bf16" --exporter torchscript --opset 17 --dtype bf16
export_ --model "$A" --out "$out/A-torchscript-opset18-dynamic-mask" --exporter torchscript --opset 18 --dynamic --attention-mask
export_ --model "$A" --out "$out/A-torchscript-opset20-unfolded-save-external" --exporter torchscript --opset 20 --no-constant-folding --save-external
export_ --model "$B" --out "$out/B-dynamo-opset18-dynamic" --opset 18 --dynamic
# The opset-23 form with one RotaryEmbedding op per rotation (PyTorch writes Slice/Neg/Concat).
python tools/onnx/fuse_rotary.py "$out/A-dynamo-opset23-static" "$out/A-dynamo-opset23-rotary-op"
python - "$out" <<'PY'
import json, os, sys, onnx, torch
out = sys.argv[1]
index = {}
for d in sorted(os.listdir(out)):
    m = onnx.load(os.path.join(out, d, "model.onnx"), load_external_data=False)
    index[d] = {"torch": torch.__version__, "onnx": onnx.__version__, "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), "producer": f"{m.producer_name} {m.producer_version}"}
json.dump(index, open(os.path.join(out, "exports.json"), "w"), indent=1)
PY
