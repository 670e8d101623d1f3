"""Rewrites an opset-23 export so each rotary embedding is one ONNX `RotaryEmbedding` op (as an
exporter or graph optimiser that emits it leaves the graph), and checks with ONNX's reference
evaluator that the rewritten graph computes the same logits as the original.

PyTorch 2.15's exporters write LLaDA's rotary embedding as Slice, Neg, Concat and products with
the cached tables; this makes the other form lladac reads, from one of those exports:

    python tools/onnx/fuse_rotary.py tests/data/onnx-public/A-dynamo-opset23-static OUT

Each `q*cos + rotate_half(q)*sin` (an Add of a product with the cos table and one with the sin
table) becomes `RotaryEmbedding(q, cos_cache, sin_cache, position_ids)` with caches of half a
head (what the op takes) from the tables the graph already holds.
"""

import os
import shutil
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator


def main():
    src, out = sys.argv[1], sys.argv[2]
    m = onnx.load(os.path.join(src, "model.onnx"))
    g = m.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    produced = {o: n for n in g.node for o in n.output}

    def table(name):
        """The constant behind `name` (an initializer, possibly sliced to the sequence)."""
        if name in inits:
            return inits[name]
        n = produced.get(name)
        if n is not None and n.op_type == "Slice" and n.input[0] in inits:
            return inits[n.input[0]]
        return None

    seq = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim][1]
    rotary = []
    for n in g.node:
        if n.op_type != "Add" or len(n.input) != 2:
            continue
        a, b = (produced.get(i) for i in n.input)
        if not (a and b and a.op_type == "Mul" and b.op_type == "Mul"):
            continue
        cos = next((i for i in a.input if table(i) is not None), None)
        sin = next((i for i in b.input if table(i) is not None), None)
        if cos is None or sin is None:
            continue
        x = next(i for i in a.input if i != cos)
        rotary.append((n, x, table(cos), table(sin)))
    if not rotary:
        raise SystemExit("no rotary embedding found")

    _, _, cos_t, sin_t = rotary[0]
    hd = cos_t.shape[-1]
    cos_cache = cos_t.reshape(-1, hd)[:, : hd // 2].astype(np.float32)
    sin_cache = sin_t.reshape(-1, hd)[:, : hd // 2].astype(np.float32)
    g.initializer.extend([
        numpy_helper.from_array(cos_cache, "rotary_cos_cache"),
        numpy_helper.from_array(sin_cache, "rotary_sin_cache"),
        numpy_helper.from_array(np.arange(seq, dtype=np.int64)[None, :], "rotary_position_ids"),
    ])
    nodes = list(g.node)
    for i, (add, x, _, _) in enumerate(rotary):
        fused = helper.make_node("RotaryEmbedding", [x, "rotary_cos_cache", "rotary_sin_cache", "rotary_position_ids"], list(add.output), name=f"rotary_embedding_{i}", interleaved=0)
        nodes[nodes.index(add)] = fused
    # Drop what only the old form read.
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    del g.node[:]
    g.node.extend(reversed(keep))
    used = {i for n in g.node for i in n.input}
    live_inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live_inits)
    onnx.checker.check_model(m)

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(src):
        if not f.startswith("model.onnx"):
            shutil.copy(os.path.join(src, f), out)
    onnx.save(m, os.path.join(out, "model.onnx"))

    ids = np.random.default_rng(0).integers(0, 270, size=(1, seq), dtype=np.int64)
    want = ReferenceEvaluator(os.path.join(src, "model.onnx")).run(None, {"input_ids": ids})[0]
    got = ReferenceEvaluator(m).run(None, {"input_ids": ids})[0]
    err = float(np.abs(want - got).max())
    print(f"wrote {out}/model.onnx: {len(rotary)} RotaryEmbedding ops; logits within {err:.2e} of the original (ONNX reference evaluator)")
    if err > 1e-3:
        raise SystemExit("the rewritten graph computes something else")


if __name__ == "__main__":
    main()
