#!/usr/bin/env python3
"""Writes a tiny random-weight DiffusionGemma checkpoint in the layout of google/diffusiongemma-26B-A4B-it.

    python tools/diffusion_gemma/make_tiny_checkpoint.py [--seed N]

The model is the published DiffusionGemmaForBlockDiffusion (transformers 5.23.0), built from the published
DiffusionGemmaConfig with a nested text_config and a tiny gemma4_vision vision_config, and saved with
save_pretrained, so tensor names, shapes, the ties (encoder text weights and lm_head tied to model.decoder.*) and
the safetensors layout are the published ones; the vision tower and embed_vision tensors are there, in their
layout, for a text-only importer to skip. config.json and generation_config.json are then rewritten with the
key sets of the real checkpoint (tiny values); the checkpoint is reloaded with from_pretrained and checked to be
the same model.

Two copies: tiny-dg-A (float32, one model.safetensors) and tiny-dg-A-bf16 (bfloat16, sharded with
model.safetensors.index.json). Every weight is exactly representable in bfloat16, so both hold the same values.

The weights are NOT the default init (normal std 0.02, unit norms, unit layer scalars and router scales): that
gives near-uniform softmaxes. See init_weights: larger linears, norms / scales / layer scalars varied, and the
encoder's layer_scalar values different from the decoder's.
"""

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dg_common as C  # noqa: E402

LLADA_TOKENIZER = os.path.join(C.REPO, "..", "shared", "conformance", "tiny-llada-A", "tokenizer.json")

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}

# Init (see init_weights). Linear weights: normal(0, gain / sqrt(fan_in)).
EMB_STD = 0.5  # tied embedding / lm_head; input embeddings are scaled by sqrt(64) = 8
QK_GAIN = 1.0  # q/k are RMS-normalised per head (q_norm/k_norm) and attention is unscaled (scaling 1.0)
VO_GAIN = 1.0
MLP_GAIN = 1.5
EXPERT_GAIN = 1.5
ROUTER_GAIN = 3.0
EMB_BIAS_DIM = 0.5  # every embedding row has this value in dimension 0 (see init_weights)
SC_ALPHA = 1.5  # the self-conditioning MLP is made close to x -> SC_ALPHA * x (see init_weights)
NORM_RANGE = (0.5, 1.5)  # RMSNorm weights (used directly, not 1 + w) uniform in this range
POST_NORM_RANGE = (0.3, 0.9)  # post_attention_layernorm / post_feedforward_layernorm
QK_NORM_RANGE = (0.25, 0.75)  # q_norm / k_norm: softer attention (scores are not scaled by 1/sqrt(d))
# SC_ALPHA, QK_NORM_RANGE and POST_NORM_RANGE were tuned so that the denoising loop is not chaotic: a relative
# perturbation of 1e-6 of the logits, or another float32 kernel (eager attention, eager experts), must leave every
# case's trajectory unchanged (make_golden.py checks it), while adaptive stopping still fires.
FINAL_NORM_RANGE = (1.0, 2.0)
LAYER_SCALAR_RANGE = (0.6, 1.4)
PER_EXPERT_RANGE = (0.5, 1.5)
ROUTER_SCALE_RANGE = (0.5, 1.5)


def text_config_dict(dtype):
    """text_config with the key set of the real config.json (values tiny)."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": C.BOS,
        "dtype": dtype,
        "eos_token_id": C.EOS,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 32,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_types": LAYER_TYPES,
        "max_position_embeddings": 512,
        "model_type": "diffusion_gemma_text",
        "moe_intermediate_size": 16,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_global_key_value_heads": 1,
        "num_hidden_layers": 6,
        "num_key_value_heads": 2,
        "pad_token_id": C.PAD,
        "rms_norm_eps": 1e-06,
        "rope_parameters": ROPE,
        "sliding_window": C.SLIDING_WINDOW,
        "tie_word_embeddings": True,
        "top_k_experts": 2,
        "use_bidirectional_attention": "vision",
        "vocab_size": C.VOCAB,
    }


def vision_config_dict(dtype):
    """A tiny gemma4_vision config with the real vision_config's key set."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "default_output_length": 4,
        "dtype": dtype,
        "global_head_dim": 16,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 131072,
        "model_type": "gemma4_vision",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "position_embedding_size": 64,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
        "standardize": True,
        "use_clipped_linears": False,
    }


def config_dict(dtype):
    """config.json with the real checkpoint's top-level keys (values tiny)."""
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "boi_token_id": C.BOI,
        "canvas_length": C.CANVAS,
        "dtype": dtype,
        "eoi_token_id": C.EOI,
        "eos_token_id": list(C.EOS_IDS),
        "image_token_id": C.IMAGE,
        "initializer_range": 0.02,
        "model_type": "diffusion_gemma",
        "text_config": text_config_dict(dtype),
        "tie_word_embeddings": True,
        "transformers_version": C.TRANSFORMERS_VERSION,
        "vision_config": vision_config_dict(dtype),
        "vision_soft_tokens_per_image": 4,
    }


def generation_config_dict():
    """generation_config.json with the real file's keys and defaults, tiny max_new_tokens (one canvas as there)."""
    return {
        "bos_token_id": C.BOS,
        "confidence_threshold": 0.005,
        "eos_token_id": list(C.EOS_IDS),
        "max_denoising_steps": 48,
        "max_new_tokens": C.CANVAS,
        "pad_token_id": C.PAD,
        "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
        "stability_threshold": 1,
        "t_max": 0.8,
        "t_min": 0.4,
        "transformers_version": C.TRANSFORMERS_VERSION,
    }


# Gemma-4-style chat template (the 26B-A4B generation prompt: '<|turn>model\n', then, unless thinking is enabled,
# the closed empty thought channel '<|channel>thought\n<channel|>'; a system turn carries '<|think|>' when
# thinking is enabled). Tools, tool calls and media are left out.
CHAT_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}\n"
    "    {{- '<|turn>system\\n' -}}\n"
    "    {%- if enable_thinking is defined and enable_thinking -%}\n"
    "        {{- '<|think|>\\n' -}}\n"
    "    {%- endif -%}\n"
    "    {%- if messages[0]['role'] in ['system', 'developer'] -%}\n"
    "        {{- messages[0]['content'] | trim -}}\n"
    "        {%- set loop_messages = messages[1:] -%}\n"
    "    {%- else -%}\n"
    "        {%- set loop_messages = messages -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- else -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "    {{- '<|turn>' + role + '\\n' -}}\n"
    "    {{- message['content'] | trim -}}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|turn>model\\n' -}}\n"
    "    {%- if not enable_thinking | default(false) -%}\n"
    "        {{- '<|channel>thought\\n<channel|>' -}}\n"
    "    {%- endif -%}\n"
    "{%- endif -%}\n"
)


def all_added_tokens():
    toks = list(C.SPECIALS) + [(C.BOI, "<|image>"), (C.IMAGE, "<|image|>"), (C.EOI, "<image|>")]
    toks += [(i, f"<unused{i - C.EOI - 1}>") for i in range(C.EOI + 1, C.VOCAB)]
    return toks


def write_tokenizer(out, llada_tokenizer):
    with open(llada_tokenizer) as f:
        tok = json.load(f)
    byte_vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < 256}
    assert sorted(byte_vocab.values()) == list(range(256)), "the LLaDA kit's byte tokens must be ids 0..255"
    added = all_added_tokens()
    assert len(added) + 256 == C.VOCAB
    # The special tokens are in the BPE vocab too (as in real Hugging Face tokenizers): an added token that is
    # not in the model vocab gets the id vocab_size + n when tokenizer.json is loaded, whatever its "id" says.
    vocab = {s: i for i, s in added}
    vocab.update({k: v + C.BYTE_BASE for k, v in byte_vocab.items()})
    assert sorted(vocab.values()) == list(range(C.VOCAB))
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    tok["model"]["merges"] = []
    tok["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, s in added
    ]
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for i, s in added:
        assert t.token_to_id(s) == i and t.id_to_token(i) == s, (i, s)
    assert t.encode("<bos><|turn>a\xff", add_special_tokens=False).ids == [C.BOS, C.TURN_OPEN, ord("a") + C.BYTE_BASE, 0xC3 + C.BYTE_BASE, 0xBF + C.BYTE_BASE]
    cfg = {
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
            for i, s in added
        },
        "bos_token": "<bos>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<eos>",
        "extra_special_tokens": ["<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"],
        "mask_token": "<mask>",
        "model_max_length": 512,
        "pad_token": "<pad>",
        "padding_side": "left",
        "split_special_tokens": False,
        # The real repo's tokenizer class is Gemma's; the kit's byte-level tokenizer.json is read by the fast one.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)

    def normal(t, std):
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=g) * std)

    def uniform(t, lo, hi):
        with torch.no_grad():
            t.copy_(lo + torch.rand(t.shape, generator=g) * (hi - lo))

    def linear(lin, gain):
        normal(lin.weight, gain / lin.weight.shape[1] ** 0.5)

    def norm(n, rng=NORM_RANGE):
        uniform(n.weight, *rng)

    dec = model.model.decoder
    normal(dec.embed_tokens.weight, EMB_STD)
    with torch.no_grad():
        dec.embed_tokens.weight[:, 0] = EMB_BIAS_DIM
    for layer in dec.layers:
        a = layer.self_attn
        linear(a.q_proj, QK_GAIN)
        linear(a.k_proj, QK_GAIN)
        if a.v_proj is not None:
            linear(a.v_proj, VO_GAIN)
        linear(a.o_proj, VO_GAIN)
        norm(a.q_norm, QK_NORM_RANGE)
        norm(a.k_norm, QK_NORM_RANGE)
        linear(layer.mlp.gate_proj, MLP_GAIN)
        linear(layer.mlp.up_proj, MLP_GAIN)
        linear(layer.mlp.down_proj, MLP_GAIN)
        r = layer.router
        linear(r.proj, ROUTER_GAIN)
        uniform(r.scale, *ROUTER_SCALE_RANGE)
        uniform(r.per_expert_scale, *PER_EXPERT_RANGE)
        e = layer.experts
        normal(e.gate_up_proj, EXPERT_GAIN / e.gate_up_proj.shape[2] ** 0.5)
        normal(e.down_proj, EXPERT_GAIN / e.down_proj.shape[2] ** 0.5)
        for n in ("input_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm_1",
                  "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
            norm(getattr(layer, n))
        norm(layer.post_attention_layernorm, POST_NORM_RANGE)
        norm(layer.post_feedforward_layernorm, POST_NORM_RANGE)
        uniform(layer.layer_scalar, *LAYER_SCALAR_RANGE)
    for layer in model.model.encoder.language_model.layers:
        uniform(layer.layer_scalar, *LAYER_SCALAR_RANGE)  # the encoder's own values (not tied)
    norm(dec.norm, FINAL_NORM_RANGE)
    # Self-conditioning close to a scaled identity, so that the previous step's prediction persists and the
    # denoising loop settles (stable argmax canvases, low entropies: adaptive stopping fires). Dimension 0 of every
    # embedding row is EMB_BIAS_DIM, so dimension 0 of the soft embedding p @ E * 8 is 8 * EMB_BIAS_DIM whatever p
    # is: a constant input. gate_proj reads mostly that dimension, so gelu(gate x) is a positive per-row constant
    # k; up_proj is a random orthogonal Q and down_proj = SC_ALPHA * Q^T / k: down(gelu(gate x) * up x) ~ SC_ALPHA x.
    sc = dec.self_conditioning
    norm(sc.pre_norm)
    hdim, idim = sc.up_proj.weight.shape[1], sc.up_proj.weight.shape[0]
    assert hdim == idim
    q, _ = torch.linalg.qr(torch.randn(hdim, hdim, generator=g))
    k = 1.0 + 2.0 * torch.rand(idim, generator=g)
    with torch.no_grad():
        sc.up_proj.weight.copy_(q)
        gate = torch.randn(idim, hdim, generator=g) * (0.1 / hdim**0.5)
        gate[:, 0] = k / float(sc.pre_norm.weight[0])
        sc.gate_proj.weight.copy_(gate)
        sc.down_proj.weight.copy_(SC_ALPHA * q.T / k[None, :])
    # Vision tower and embed_vision: unused by text generation; random so that they are not trivially constant.
    for name, p in list(model.model.encoder.vision_tower.named_parameters()) + list(model.model.encoder.embed_vision.named_parameters()):
        if p.dim() >= 2:
            normal(p, 0.1)
        else:
            uniform(p, 0.5, 1.5)
    # Exactly representable in bfloat16: round every parameter and persistent buffer.
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).to(torch.float32))


def build_model(seed):
    configuration, modeling, _ = C.published()
    d = config_dict("float32")
    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "transformers_version", "text_config", "vision_config", "dtype")}
    text = configuration.DiffusionGemmaTextConfig(**{k: v for k, v in d["text_config"].items() if k not in ("model_type", "dtype")})
    config = configuration.DiffusionGemmaConfig(text_config=text, vision_config=d["vision_config"], **kw)
    config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    torch.manual_seed(seed)
    model = modeling.DiffusionGemmaForBlockDiffusion(config).float().eval()
    init_weights(model, seed)
    # The encoder's text weights are the decoder's (tied), except layer_scalar.
    enc, dec = model.model.encoder.language_model, model.model.decoder
    assert enc.embed_tokens.weight.data_ptr() == dec.embed_tokens.weight.data_ptr()
    assert model.lm_head.weight.data_ptr() == dec.embed_tokens.weight.data_ptr()
    for le, ld in zip(enc.layers, dec.layers):
        assert le.self_attn.q_proj.weight.data_ptr() == ld.self_attn.q_proj.weight.data_ptr()
        assert le.experts.gate_up_proj.data_ptr() == ld.experts.gate_up_proj.data_ptr()
        assert le.router.per_expert_scale.data_ptr() == ld.router.per_expert_scale.data_ptr()
        assert not torch.equal(le.layer_scalar, ld.layer_scalar)
    return model


def write_checkpoint(model, out, dtype_name, llada_tokenizer, max_shard_size=None):
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config_dict(dtype_name), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config_dict(), f, indent=2)
        f.write("\n")
    write_tokenizer(out, llada_tokenizer)


def verify(model, out, dtype):
    """Reloads `out` with the published from_pretrained and checks that it is the same model."""
    _, modeling, _ = C.published()
    m2 = modeling.DiffusionGemmaForBlockDiffusion.from_pretrained(out, dtype=dtype).eval()
    sd1, sd2 = model.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k].to(dtype), sd2[k]), k
    tc1, tc2 = model.config.text_config, m2.config.text_config
    for k in ("sliding_window", "layer_types", "rope_parameters", "vocab_size", "hidden_size", "num_experts", "top_k_experts"):
        assert getattr(tc1, k) == getattr(tc2, k), k
    for i in range(tc1.num_hidden_layers):
        a, b = tc1.per_layer_config[i], tc2.per_layer_config[i]
        assert (a.head_dim, a.num_key_value_heads) == (b.head_dim, b.num_key_value_heads), i
    assert m2.config.canvas_length == C.CANVAS
    g = m2.generation_config
    assert g.sampler_config.entropy_bound == 0.1 and g.max_denoising_steps == 48 and g.eos_token_id == C.EOS_IDS
    return m2


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--out", default=C.CKPT_F32)
    a.add_argument("--out-bf16", default=C.CKPT_BF16)
    a.add_argument("--llada-tokenizer", default=LLADA_TOKENIZER, help="the tiny LLaDA kit's tokenizer.json (bytes reused)")
    args = a.parse_args()
    torch.set_num_threads(1)
    model = build_model(args.seed)

    write_checkpoint(model, args.out, "float32", args.llada_tokenizer)
    verify(model, args.out, torch.float32)
    bf = build_model(args.seed).to(torch.bfloat16)
    write_checkpoint(bf, args.out_bf16, "bfloat16", args.llada_tokenizer, max_shard_size="400KB")
    verify(model, args.out_bf16, torch.bfloat16)
    n_shards = len([f for f in os.listdir(args.out_bf16) if f.endswith(".safetensors")])
    assert n_shards >= 2 and os.path.isfile(os.path.join(args.out_bf16, "model.safetensors.index.json")), n_shards

    from safetensors import safe_open

    with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    n = sum(t.numel() for t in model.state_dict().values())
    print(f"wrote {args.out} ({len(names)} tensors, {n} values with the tied copies) and {args.out_bf16} "
          f"({n_shards} shards), seed {args.seed}")


if __name__ == "__main__":
    main()
