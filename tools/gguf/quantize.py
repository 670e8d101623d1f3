#!/usr/bin/env python3
"""Quantizes an F32 GGUF with llama.cpp's `gguf` package (`gguf.quants.quantize`, the
package's port of ggml's reference quantizers) and records, for the test that checks lladac's
decoding, a CRC-32 of `gguf.quants.dequantize` of every quantized tensor.

    python3 tools/gguf/quantize.py IN.f32.gguf OUT.gguf MIX

MIX is one of:
  q8_0     every matrix Q8_0 (what `convert_hf_to_gguf.py --outtype q8_0` writes);
  q4_0     every matrix Q4_0, `output.weight` Q8_0: llama-quantize's Q4_0 mix, whose Q6_K head
           falls back to Q8_0 on rows whose width is not a multiple of 256 (as here);
  q4_k_m   llama-quantize's Q4_K_M mix at these widths, where every K-quant falls back
           (llama-quant.cpp): Q4_K -> Q5_0 for most matrices, Q6_K -> Q8_0 for the head,
           `attn_v` and `ffn_down`; Q4_1 and Q5_1 on the embedding and attn_output, so every
           legacy block type is exercised.
Norms and biases stay F32, as in llama.cpp's files. The CRCs go to OUT.dequant.json:
{tensor: [type, elements, crc32 of the little-endian f32 values]}.
"""
import json
import sys
import zlib

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize


def mix_type(mix: str, name: str, ndim: int) -> T:
    if ndim != 2:
        return T.F32
    if mix == "q8_0":
        return T.Q8_0
    if mix == "q4_0":
        return T.Q8_0 if name == "output.weight" else T.Q4_0
    if mix == "q4_k_m":
        if name == "output.weight" or name.endswith((".attn_v.weight", ".ffn_down.weight")):
            return T.Q8_0
        if name == "token_embd.weight":
            return T.Q4_1
        if name.endswith(".attn_output.weight"):
            return T.Q5_1
        return T.Q5_0
    raise SystemExit(f"unknown mix {mix}")


def main() -> None:
    src, dst, mix = sys.argv[1:4]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub)
    w.add_file_type({"q8_0": 7, "q4_0": 2, "q4_k_m": 15}[mix])
    crcs = {}
    for t in r.tensors:
        data = np.array(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        qtype = mix_type(mix, t.name, data.ndim)
        if qtype == T.F32:
            w.add_tensor(t.name, data)
            continue
        q = quantize(data, qtype)
        w.add_tensor(t.name, q, raw_dtype=qtype)
        values = dequantize(q, qtype).astype("<f4")
        crcs[t.name] = [qtype.name, int(values.size), zlib.crc32(values.tobytes())]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(dst.removesuffix(".gguf") + ".dequant.json", "w") as out:
        json.dump(crcs, out, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
