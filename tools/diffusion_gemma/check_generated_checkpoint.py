#!/usr/bin/env python3
"""Checks a checkpoint written by `gen-checkpoint --preset tiny-diffusiongemma | diffusiongemma-26b-a4b` against
the published DiffusionGemma code (transformers 5.23.0).

    python tools/diffusion_gemma/check_generated_checkpoint.py load DIR [--real-config]
    python tools/diffusion_gemma/check_generated_checkpoint.py logits DIR --out FILE

`load`: `DiffusionGemmaForBlockDiffusion.from_pretrained(DIR, output_loading_info=True)` must report no missing,
unexpected or mismatched key (the report is printed), the full layers must have no v_proj, and the tokenizer must load
and render the chat template. With --real-config, the loaded config and generation config must parse to the values
of the real google/diffusiongemma-26B-A4B-it files (compiler/tests/data/diffusiongemma-26b-a4b-it.*.json), the
layer count and layer types aside when the checkpoint was written with fewer layers.

`logits`: the first decoder pass of the published `generate` on a chat-framed "hello" (the tokenizer's chat
template) and a fixed canvas passed as `decoder_input_ids`, captured from `model.forward`: writes the raw logits (after
the soft-cap) of every canvas row, with the prompt, canvas and position ids, to FILE for the Rust test
(tests/tests/diffusion_gemma_generated.rs). A fingerprint of the weights (the float64 sum of every stored value) lets
the test tell a changed generator from a wrong runtime.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dg_common as C  # noqa: E402

REAL = os.path.join(C.REPO, "compiler", "tests", "data", "diffusiongemma-26b-a4b-it")


def load(ckpt, dtype):
    _, modeling, _ = C.published()
    model, info = modeling.DiffusionGemmaForBlockDiffusion.from_pretrained(ckpt, dtype=dtype, output_loading_info=True)
    return model.eval(), info


def check_load(ckpt, real_config):
    model, info = load(ckpt, torch.bfloat16)
    report = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items()}
    print("loading info:", json.dumps(report, default=str))
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{key}: {info.get(key)}"
    tc = model.config.text_config
    for i, layer in enumerate(model.model.decoder.layers):
        full = tc.layer_types[i] == "full_attention"
        assert (layer.self_attn.v_proj is None) == full, i
    from safetensors import safe_open

    stored = set()
    for f in os.listdir(ckpt):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt, f), "pt") as st:
                stored.update(st.keys())
    print(f"{len(stored)} stored tensors, {sum(p.numel() for p in model.parameters())} parameters with the tied copies")
    tokenizer_check(ckpt)
    if real_config:
        compare_with_real(model)


def tokenizer_check(ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    text = tok.decode(ids)
    want = "<bos><|turn>user\nhello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert text == want, text
    assert ids[0] == tok.bos_token_id and tok.convert_ids_to_tokens(ids[1]) == "<|turn>", ids
    print(f"chat template: {len(ids)} ids, decodes to {text!r}")
    return ids


def compare_with_real(model):
    configuration, _, _ = C.published()
    with open(REAL + ".config.json") as f:
        real = json.load(f)
    with open(REAL + ".generation_config.json") as f:
        real_generation = json.load(f)
    ours = model.config.to_dict()
    theirs = configuration.DiffusionGemmaConfig(**real).to_dict()
    layers = ours["text_config"]["num_hidden_layers"]
    # The same construction with our layer count: what the real config would be at this depth.
    if layers != theirs["text_config"]["num_hidden_layers"]:
        print(f"{layers} layers: comparing with the real config at {layers} layers (layer_types by its 5:1 pattern)")
        assert real["text_config"]["layer_types"][: layers - 1] == ours["text_config"]["layer_types"][:-1]
        shallow = json.loads(json.dumps(real))
        shallow["text_config"]["num_hidden_layers"] = layers
        shallow["text_config"]["layer_types"] = ours["text_config"]["layer_types"]
        theirs = configuration.DiffusionGemmaConfig(**shallow).to_dict()
    differ = diff(ours, theirs)
    assert not differ, differ
    print(f"config: {len(flatten(ours))} values equal the real config's")
    g = model.generation_config.to_dict()
    for k, v in real_generation.items():
        if k == "sampler_config":
            ours = g[k] if isinstance(g[k], dict) else g[k].to_dict()
            assert ours["entropy_bound"] == v["entropy_bound"] and type(g[k]).__name__ in (v["_cls_name"], "dict"), (k, g[k])
        elif k != "transformers_version":
            assert g[k] == v, (k, g[k], v)
    print(f"generation config: {len(real_generation)} values equal the real file's")


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("rope_parameters",):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def diff(a, b):
    fa, fb = flatten(a), flatten(b)
    ignore = {"_name_or_path", "transformers_version"}
    return {k: (fa.get(k), fb.get(k)) for k in set(fa) | set(fb) if k.split(".")[-1] not in ignore and fa.get(k) != fb.get(k)}


def first_decoder_pass(ckpt, out):
    torch.set_num_threads(1)
    model, info = load(ckpt, torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    prompt = tokenizer_check(ckpt)
    canvas_length = model.config.canvas_length
    vocab = model.config.text_config.vocab_size
    canvas = [(37 * i + 11) % vocab for i in range(canvas_length)]
    captured = {}
    real_forward = model.forward

    def forward(*a, **k):
        o = real_forward(*a, **k)
        if not captured:
            captured.update(
                canvas_ids=k["decoder_input_ids"][0].tolist(),
                decoder_position_ids=k["decoder_position_ids"][0].tolist(),
                # Each float32 as its shortest decimal, which reads back as the same float32.
                logits=[[float(str(x)) for x in row] for row in o.logits[0].float().numpy()],
            )
        return o

    model.forward = forward
    torch.manual_seed(0)
    with torch.no_grad():
        model.generate(
            input_ids=torch.tensor([prompt]),
            decoder_input_ids=torch.tensor([canvas]),
            max_new_tokens=canvas_length,
            max_denoising_steps=1,
        )
    assert captured["canvas_ids"] == canvas
    from safetensors import safe_open

    total, n = 0.0, 0
    for f in sorted(os.listdir(ckpt)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt, f), "pt") as st:
                for name in st.keys():
                    total += float(st.get_tensor(name).double().sum())
                    n += 1
    versions = C.check_versions()
    result = dict(
        checkpoint="gen-checkpoint --preset tiny-diffusiongemma --dtype f32 (seed 0, init-std 0.02)",
        transformers_version=versions[0],
        torch_version=versions[1],
        weights_sum=total,
        tensors=n,
        prompt_ids=prompt,
        **captured,
    )
    with open(out, "w") as f:
        json.dump(result, f)
        f.write("\n")
    print(f"wrote {out}: {len(captured['logits'])} rows of {vocab} logits, prompt of {len(prompt)} ids")


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = a.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("load")
    p.add_argument("ckpt")
    p.add_argument("--real-config", action="store_true")
    p = sub.add_parser("logits")
    p.add_argument("ckpt")
    p.add_argument("--out", required=True)
    args = a.parse_args()
    if args.cmd == "load":
        check_load(args.ckpt, args.real_config)
    else:
        first_decoder_pass(args.ckpt, args.out)


if __name__ == "__main__":
    main()
