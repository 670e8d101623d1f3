#!/usr/bin/env bash
# Rebuilds the checked-in SPIR-V from the GLSL beside it (glslang: Debian `glslang-tools`).
# matmul.comp is built twice: plain, and with INT8_DOT for devices with integer dot products.
# The test `shaders_are_built_from_their_sources` fails when they differ.
set -euo pipefail
cd "$(dirname "$0")"
for src in *.comp; do
  glslangValidator -V --target-env vulkan1.1 -o "${src%.comp}.spv" "$src" >/dev/null
done
glslangValidator -V --target-env vulkan1.1 -DINT8_DOT -o matmul_dot.spv matmul.comp >/dev/null
