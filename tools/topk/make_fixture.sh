#!/usr/bin/env bash
# Regenerates the top-k fixture from the real libstdc++ algorithms (needs g++).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(mktemp -d)/reference
g++ -O2 -std=c++17 -o "$bin" "$root/tools/topk/reference.cpp"
"$bin" > "$root/runtime/tests/data/topk_libstdcxx.txt.tmp"
mv "$root/runtime/tests/data/topk_libstdcxx.txt.tmp" "$root/runtime/tests/data/topk_libstdcxx.txt"
echo "wrote runtime/tests/data/topk_libstdcxx.txt ($(g++ --version | head -1))"
