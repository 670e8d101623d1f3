#!/usr/bin/env python3
"""Writes what llama.cpp's `gguf` package (GGUFReader) reads from a GGUF file, as the JSON
compiler/src/gguf/container.rs's test compares its own reader with: every key's value (an
array by its length), and every tensor as [name, ne, type, absolute data offset, bytes].

    python3 tools/gguf/dump.py FILE.gguf > FILE.dump.json
"""
import json
import sys

from gguf import GGUFReader, GGUFValueType

r = GGUFReader(sys.argv[1])
kvs = {}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    if f.types[0] == GGUFValueType.ARRAY:
        kvs[name] = len(f.data)
    else:
        v = f.contents()
        kvs[name] = float(v) if isinstance(v, float) else v
tensors = [[t.name, [int(n) for n in t.shape], t.tensor_type.name, int(t.data_offset), int(t.n_bytes)] for t in r.tensors]
json.dump({"kvs": dict(sorted(kvs.items())), "tensors": tensors}, sys.stdout, indent=0)
