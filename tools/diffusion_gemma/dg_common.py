"""Shared by the DiffusionGemma kit scripts: the tiny sizes, the token ids, and the published-code import.

The reference is the published Hugging Face implementation, transformers 5.23.0,
`transformers/models/diffusion_gemma/` (configuration_diffusion_gemma.py, modeling_diffusion_gemma.py,
generation_diffusion_gemma.py). Nothing of it is copied here: the scripts import the installed package and
refuse any other transformers version.
"""

import os

import torch

TRANSFORMERS_VERSION = "5.23.0"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
KIT = os.path.join(REPO, "tests", "data", "diffusiongemma-conformance")
CKPT_F32 = os.path.join(KIT, "tiny-dg-A")
CKPT_BF16 = os.path.join(KIT, "tiny-dg-A-bf16")

VOCAB = 320
CANVAS = 16
SLIDING_WINDOW = 8  # as stored in config.json; use_bidirectional_attention "vision" keeps it as is (see README)

# Gemma 4 special tokens in Gemma 4's relative order (real ids in brackets), then the 256 bytes, then the image
# markers, then <unusedN> up to the vocabulary size.
SPECIALS = [
    (0, "<pad>"),  # [0]
    (1, "<eos>"),  # [1]
    (2, "<bos>"),  # [2]
    (3, "<unk>"),  # [3]
    (4, "<mask>"),  # [4] (Gemma 3's id; unused by DiffusionGemma, which has no mask token)
    (5, "<|tool>"),  # [46]
    (6, "<tool|>"),  # [47]
    (7, "<|tool_call>"),  # [48]
    (8, "<tool_call|>"),  # [49]
    (9, "<|tool_response>"),  # [50] (in the real generation_config's eos list)
    (10, "<tool_response|>"),  # [51]
    (11, '<|"|>'),  # [52]
    (12, "<|think|>"),  # [98]
    (13, "<|channel>"),  # [100]
    (14, "<channel|>"),  # [101]
    (15, "<|turn>"),  # [105]
    (16, "<turn|>"),  # [106] (in the real eos list)
]
BYTE_BASE = 17  # byte b has id b + 17
BOI, IMAGE, EOI = 273, 274, 275  # <|image> [255999], <|image|> [258880], <image|> [258882]
PAD, EOS, BOS, UNK = 0, 1, 2, 3
TOOL_RESPONSE, TURN_OPEN, TURN_CLOSE = 9, 15, 16
EOS_IDS = [EOS, TURN_CLOSE, TOOL_RESPONSE]  # as the real [1, 106, 50]


def check_versions():
    import transformers

    if transformers.__version__ != TRANSFORMERS_VERSION:
        raise SystemExit(f"transformers {transformers.__version__} found; the kit is made with {TRANSFORMERS_VERSION}")
    return transformers.__version__, torch.__version__


def published():
    """The published classes (imported from the installed transformers 5.23.0)."""
    check_versions()
    from transformers.models.diffusion_gemma import configuration_diffusion_gemma as configuration
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as generation
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as modeling

    return configuration, modeling, generation


def load_model(ckpt=CKPT_F32, dtype=torch.float32, attn=None, experts=None):
    """The published model, defaults as published: sdpa attention, grouped_mm experts (torch._grouped_mm)."""
    _, modeling, _ = published()
    kw = {}
    if attn:
        kw["attn_implementation"] = attn
    if experts:
        kw["experts_implementation"] = experts
    model = modeling.DiffusionGemmaForBlockDiffusion.from_pretrained(ckpt, dtype=dtype, **kw).eval()
    assert model.config._attn_implementation == (attn or "sdpa"), model.config._attn_implementation
    assert model.config._experts_implementation == (experts or "grouped_mm"), model.config._experts_implementation
    return model
