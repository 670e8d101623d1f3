"""Exports a LLaDA checkpoint to ONNX with the *public* LLaDA modeling code, as a user would:
`modeling_llada.py` and `configuration_llada.py` of GSAI-ML/LLaDA-8B-Instruct (NVlabs/Fast-dLLM
vendors the same files under `llada/model/`). That code is not in this repository: pass the
directory holding the two files with `--modeling`.

One run writes one export style into `--out` (model.onnx, its external data if asked, and the
checkpoint's config and tokenizer files beside it, as Hugging Face Optimum lays an export out):

    python tools/onnx/export_public.py --modeling DIR --model ../shared/conformance/tiny-llada-A \
        --out OUT --exporter dynamo --opset 18 --dynamic --dtype bf16 --external-data

Styles: `--exporter dynamo|torchscript`, `--opset N`, `--dynamic` (a dynamic sequence axis and
batch axis) or a static `--seq-len`, `--dtype f32|bf16|f16`, `--external-data` (the exporter's own
option) or `--save-external` (onnx.save_model with save_as_external_data afterwards).

The public code wraps its attention function in `torch.compile`, which the TorchScript
exporter cannot trace; as a user does, the script replaces the module's
`scaled_dot_product_attention` with the uncompiled PyTorch function (for both exporters, so
they export the same computation). Nothing else of the public code is changed.
"""

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_llada import copy_sidecars  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def load_public_code(modeling_dir):
    """Imports the two public files as a package (they import each other relatively)."""
    pkg = tempfile.mkdtemp(prefix="llada_public_")
    os.makedirs(os.path.join(pkg, "llada_public"))
    open(os.path.join(pkg, "llada_public", "__init__.py"), "w").close()
    for f in ("modeling_llada.py", "configuration_llada.py"):
        shutil.copy(os.path.join(modeling_dir, f), os.path.join(pkg, "llada_public", f))
    sys.path.insert(0, pkg)
    modeling = importlib.import_module("llada_public.modeling_llada")
    config = importlib.import_module("llada_public.configuration_llada")
    # The compiled wrapper cannot be traced by TorchScript; the plain function computes the same.
    modeling.scaled_dot_product_attention = lambda q, k, v, mask=None, attn_mask=None, dropout_p=0.0, is_causal=False: F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )
    return modeling, config


class Logits(torch.nn.Module):
    """The model with token ids in and logits out, as an app calls it."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids).logits


class LogitsWithMask(Logits):
    """The same with the attention mask Optimum-style exports take as a second input."""

    def forward(self, input_ids, attention_mask):
        return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--modeling", required=True, help="directory with the public modeling_llada.py and configuration_llada.py")
    a.add_argument("--model", required=True, help="Hugging Face LLaDA checkpoint directory")
    a.add_argument("--out", required=True)
    a.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    a.add_argument("--opset", type=int, default=None, help="default: the exporter's")
    a.add_argument("--dynamic", action="store_true", help="dynamic batch and sequence axes")
    a.add_argument("--seq-len", type=int, default=64)
    a.add_argument("--dtype", choices=list(DTYPES), default="f32")
    a.add_argument("--external-data", action="store_true", help="the exporter writes the weights beside the graph")
    a.add_argument("--save-external", action="store_true", help="re-save with onnx.save_model(save_as_external_data=True)")
    a.add_argument("--no-optimize", action="store_true", help="dynamo: skip the exporter's graph optimisation")
    a.add_argument("--no-constant-folding", action="store_true", help="torchscript: skip the exporter's constant folding")
    a.add_argument("--attention-mask", action="store_true", help="the graph also takes an attention_mask input (all ones when traced)")
    args = a.parse_args()

    modeling, configuration = load_public_code(args.modeling)
    cfg = configuration.LLaDAConfig.from_pretrained(args.model)
    cfg.init_device = "cpu"
    lm = modeling.LLaDAModelLM(cfg, init_params=False)
    state = {}
    for f in sorted(os.listdir(args.model)):  # one file or the shards of a sharded checkpoint
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(args.model, f)))
    missing, unexpected = lm.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"checkpoint does not match the public module: missing {missing}, unexpected {unexpected}")
    model = (LogitsWithMask if args.attention_mask else Logits)(lm.to(DTYPES[args.dtype])).eval()

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.onnx")
    ids = torch.zeros((1, args.seq_len), dtype=torch.long)
    inputs = (ids, torch.ones_like(ids)) if args.attention_mask else (ids,)
    names = ["input_ids", "attention_mask"][: len(inputs)]
    kw = dict(input_names=names, output_names=["logits"])
    if args.opset is not None:
        kw["opset_version"] = args.opset
    if args.exporter == "dynamo":
        kw["dynamo"] = True
        kw["external_data"] = args.external_data
        kw["optimize"] = not args.no_optimize
        if args.dynamic:
            axes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=cfg.max_sequence_length)}
            kw["dynamic_shapes"] = {n: axes for n in names}
    else:
        kw["dynamo"] = False
        kw["do_constant_folding"] = not args.no_constant_folding
        if args.dynamic:
            kw["dynamic_axes"] = {**{n: {0: "batch", 1: "seq"} for n in names}, "logits": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        torch.onnx.export(model, inputs, path, **kw)
    if args.save_external:
        import onnx

        m = onnx.load(path)
        for f in os.listdir(args.out):
            if f.startswith("model.onnx"):
                os.remove(os.path.join(args.out, f))
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx_data", size_threshold=1024)
    copy_sidecars(args.model, args.out)
    print(f"wrote {path} (torch {torch.__version__}, {args.exporter}, opset {args.opset or 'default'}, {args.dtype}{', dynamic' if args.dynamic else ''})")


if __name__ == "__main__":
    main()
