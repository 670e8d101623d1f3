#!/usr/bin/env python3
"""Writes tests/data/gguf/blocks/: random blocks of every block type lladac decodes (random
bytes, with each f16 scale and minimum replaced by a finite random value), and what
llama.cpp's `gguf` package (`gguf.quants.dequantize`) decodes them to, for
compiler/src/gguf/quant.rs's bit-exact test. K-quant blocks need rows of 256, which the tiny
models' files never have, so they are checked here.

    python3 tools/gguf/block_golden.py
"""
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "gguf" / "blocks"
# Where each type keeps its f16 scale (and minimum), in bytes.
SCALES = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
BLOCKS = 24


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(60)
    for ty, offsets in SCALES.items():
        elems, size = GGML_QUANT_SIZES[ty]
        raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
        for at in offsets:
            scales = (rng.standard_normal(BLOCKS) * 0.05).astype(np.float16)
            raw[:, at:at + 2] = scales.view(np.uint8).reshape(BLOCKS, 2)
        values = dequantize(raw, ty).astype("<f4")
        assert values.size == BLOCKS * elems
        (OUT / f"{ty.name}.blocks").write_bytes(raw.tobytes())
        (OUT / f"{ty.name}.f32").write_bytes(values.tobytes())


if __name__ == "__main__":
    main()
