#!/usr/bin/env bash
# Makes tests/data/gguf/llada-w256-tasks.q4_k_m.gguf: a real K-quant file, written by
# llama.cpp's own quantizer (`llama-quantize ... Q4_K_M`) from `models/llada-w256-tasks`.
#
# Why that model: K-quant blocks span 256 weights of a row, and llama-quantize falls back to
# legacy types (Q5_0, Q8_0...) for any matrix whose rows are not a multiple of 256, which is
# every matrix of the 128-wide embedded model. The 256-wide model's matrices (rows of 256 and
# 768) all take K blocks: Q4_K, with Q6_K for the head and for the last layer's attn_v and
# ffn_down (Q4_K_M's "more bits" layers).
#
# Run by a developer, not by CI (it builds llama.cpp's C++). Usage:
#
#     LLAMA_CPP=/path/to/llama.cpp tools/gguf/make_kquant.sh
#
# where LLAMA_CPP is the `vendor/llama.cpp` folder of the `llama-cpp-python` 0.3.36 source
# distribution on PyPI, unpacked whole (`pip download --no-deps --no-binary=llama-cpp-python
# llama-cpp-python==0.3.36`). cmake and ninja come from PyPI if they are missing. The python
# used needs torch, transformers and sentencepiece (for llama.cpp's converter).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${LLAMA_CPP:?set LLAMA_CPP to an unpacked llama.cpp source tree}"
python=${PYTHON:-python3}
out="$root/tests/data/gguf"

if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  "$python" -m pip install -q cmake ninja
fi
quantize="$LLAMA_CPP/build/bin/llama-quantize"
if [ ! -x "$quantize" ]; then
  cmake -S "$LLAMA_CPP" -B "$LLAMA_CPP/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF
  ninja -C "$LLAMA_CPP/build" llama-quantize
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The F32 file, as make_fixtures.py converts the other fixtures (and with its one change).
LLAMA_CPP="$LLAMA_CPP" "$python" - "$root/models/llada-w256-tasks" "$tmp/llada-w256-tasks.f32.gguf" <<EOF
import os, sys
sys.path.insert(0, "$root/tools/gguf")
import make_fixtures
from pathlib import Path
make_fixtures.convert(Path(sys.argv[1]), Path(sys.argv[2]), os.environ["LLAMA_CPP"])
EOF
"$quantize" "$tmp/llada-w256-tasks.f32.gguf" "$out/llada-w256-tasks.q4_k_m.gguf" Q4_K_M
