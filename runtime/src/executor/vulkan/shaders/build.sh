#!/usr/bin/env bash
# Rebuilds the checked-in SPIR-V from the GLSL beside it (glslang: Debian `glslang-tools`).
# The test `shaders_are_built_from_their_sources` fails when they differ.
set -euo pipefail
cd "$(dirname "$0")"
for src in *.comp; do
  glslangValidator -V --target-env vulkan1.1 -o "${src%.comp}.spv" "$src" >/dev/null
done
