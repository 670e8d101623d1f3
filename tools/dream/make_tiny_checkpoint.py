#!/usr/bin/env python3
"""Writes a tiny random-weight Dream checkpoint in the Hugging Face layout of Dream-org/Dream-v0-Instruct-7B.

    python tools/dream/make_tiny_checkpoint.py --modeling DIR --out OUTDIR [--seed N]

DIR holds the published modeling_dream.py, configuration_dream.py and generation_utils.py; the model is built
with the published DreamConfig / DreamModel classes and saved with save_pretrained, so tensor names and the
safetensors layout are the published ones. config.json and generation_config.json are then rewritten with the
published key sets (tiny sizes). The tokenizer is the byte-level tokenizer of the tiny LLaDA kit reduced to
its 256 byte tokens (id = byte value, no merges), with Dream's special tokens at 256..260.

The weights are NOT the default init (normal std 0.02, zero biases, unit norms): that gives almost uniform
softmaxes, so the sampler's top-k would sit on near-ties. They are drawn larger (see init_weights) so that
greedy decoding has well-separated confidences.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dream_public import load_public_code  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLADA_TOKENIZER = os.path.join(HERE, "..", "..", "..", "shared", "conformance", "tiny-llada-A", "tokenizer.json")

VOCAB = 320
# Dream-7B ids in brackets: the relative order is Qwen2.5's.
SPECIALS = [
    (256, "<|endoftext|>"),  # [151643] eos = pad (= config bos_token_id, as published)
    (257, "<|im_start|>"),  # [151644]
    (258, "<|im_end|>"),  # [151645]
    (259, "<|beginoftext|>"),  # [151665] the tokenizer's bos_token
    (260, "<|mask|>"),  # [151666] config.mask_token_id
]
ENDOFTEXT, IM_START, IM_END, BEGINOFTEXT, MASK = (i for i, _ in SPECIALS)

# Qwen2-style chat template (Dream-v0-Instruct-7B's tokenizer_config.json carries this Qwen template: a default
# system turn, <|im_start|>role\n ... <|im_end|>\n, and "<|im_start|>assistant\n" as the generation prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Init scales (see the module docstring). Linear weights: normal(0, gain / sqrt(fan_in)).
EMB_STD = 1.0
QK_GAIN = 2.5  # sharp, position-dependent attention, so that the mask positions differ
VO_GAIN = 1.0
MLP_GAIN = 1.0
LM_GAIN = 4.0  # logits of std ~4 over 320 ids: max probabilities spread over (0, 1) without saturating
BIAS_STD = 0.1
QK_BIAS_STD = 0.5
NORM_SPREAD = 0.25  # norm weights uniform in [1 - spread, 1 + spread]
MASK_ROW_SCALE = 0.05


def published_config(tiny):
    """config.json with the key set of Dream-v0-Instruct-7B's (values tiny)."""
    return {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": ENDOFTEXT,
        "hidden_act": "silu",
        "hidden_size": tiny["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": tiny["intermediate_size"],
        "mask_token_id": MASK,
        "max_position_embeddings": tiny["max_position_embeddings"],
        "max_window_layers": tiny["num_hidden_layers"],
        "model_type": "Dream",
        "num_attention_heads": tiny["num_attention_heads"],
        "num_hidden_layers": tiny["num_hidden_layers"],
        "num_key_value_heads": tiny["num_key_value_heads"],
        "pad_token_id": ENDOFTEXT,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.46.3",
        "use_cache": False,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def generation_config():
    """generation_config.json as published (mask_token_id null there too: diffusion_generate reads config.json's)."""
    return {
        "_from_model_config": True,
        "alg": "origin",
        "alg_temp": None,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": ENDOFTEXT,
        "eps": 0.001,
        "mask_token_id": None,
        "output_history": False,
        "pad_token_id": ENDOFTEXT,
        "steps": 512,
        "temperature": 0.0,
        "top_k": None,
        "top_p": None,
        "transformers_version": "4.46.3",
    }


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)

    def normal(t, std):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=g) * std)

    def linear(lin, gain, bias_std=BIAS_STD):
        normal(lin.weight, gain / lin.weight.shape[1] ** 0.5)
        if lin.bias is not None:
            normal(lin.bias, bias_std)

    def norm(n):
        with torch.no_grad():
            n.weight.copy_(1.0 + (torch.rand(n.weight.shape, generator=g) * 2 - 1) * NORM_SPREAD)

    normal(model.model.embed_tokens.weight, EMB_STD)
    for layer in model.model.layers:
        a = layer.self_attn
        linear(a.q_proj, QK_GAIN, QK_BIAS_STD)
        linear(a.k_proj, QK_GAIN, QK_BIAS_STD)
        linear(a.v_proj, VO_GAIN)
        linear(a.o_proj, VO_GAIN)
        linear(layer.mlp.gate_proj, MLP_GAIN)
        linear(layer.mlp.up_proj, MLP_GAIN)
        linear(layer.mlp.down_proj, MLP_GAIN)
        norm(layer.input_layernorm)
        norm(layer.post_attention_layernorm)
    norm(model.model.norm)
    linear(model.lm_head, LM_GAIN)
    # The published sampler writes whatever token it picks into a selected position, the mask id included (the
    # position then stays masked and is counted as transferred). Keep the model from ever predicting <|mask|>:
    # its lm_head row is scaled down so its logit stays near 0, far below the maximum.
    with torch.no_grad():
        model.lm_head.weight[MASK] *= MASK_ROW_SCALE


def write_tokenizer(out, llada_tokenizer):
    with open(llada_tokenizer) as f:
        tok = json.load(f)
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < 256}
    assert sorted(vocab.values()) == list(range(256)), "the LLaDA kit's byte tokens must be ids 0..255"
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = []
    tok["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, s in SPECIALS
    ]
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    # The published Dream tokenizer files are vocab.json + merges.txt (slow DreamTokenizer); the same here.
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump(dict(sorted(vocab.items(), key=lambda kv: kv[1])), f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for i, s in SPECIALS
    }
    cfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|beginoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        # Published: "DreamTokenizer" with auto_map to tokenization_dream.py. The kit ships no code, so the
        # fast tokenizer reads tokenizer.json; it encodes exactly as the byte-level DreamTokenizer would here.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump(
            {
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                "bos_token": "<|beginoftext|>",
                "eos_token": "<|endoftext|>",
                "mask_token": "<|mask|>",
                "pad_token": "<|endoftext|>",
            },
            f,
            indent=2,
        )


TINY = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def dream_config(configuration, cfg_dict):
    """The published DreamConfig built from a config.json dict (see published_config)."""
    kw = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "auto_map", "model_type", "transformers_version")}
    config = configuration.DreamConfig(**kw)
    config.architectures = ["DreamModel"]
    config._attn_implementation = "sdpa"
    return config


def write_checkpoint(model, out, cfg_dict, llada_tokenizer):
    """Writes model.safetensors (save_pretrained), config.json, generation_config.json and the tokenizer files."""
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config(), f, indent=2)
        f.write("\n")
    write_tokenizer(out, llada_tokenizer)


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--modeling", required=True, help="directory with the published Dream python files")
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=3)
    a.add_argument("--llada-tokenizer", default=LLADA_TOKENIZER, help="the tiny LLaDA kit's tokenizer.json (bytes reused)")
    args = a.parse_args()
    torch.set_num_threads(1)
    modeling, configuration, _ = load_public_code(args.modeling)

    cfg_dict = published_config(TINY)
    config = dream_config(configuration, cfg_dict)
    torch.manual_seed(args.seed)
    model = modeling.DreamModel(config).float().eval()
    init_weights(model, args.seed)

    write_checkpoint(model, args.out, cfg_dict, args.llada_tokenizer)

    from safetensors import safe_open

    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {len(names)} tensors, {n} parameters, seed {args.seed}")


if __name__ == "__main__":
    main()
