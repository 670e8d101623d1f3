"""Loads the published Dream code (modeling_dream.py & co.) from a directory given on the command line.

The files import each other relatively, so they are copied into a throw-away package in a temporary
directory and imported from there. Nothing of theirs is kept in this repository. Also here: the arguments the golden
scripts call that code's diffusion_generate with and record with each case, and what a golden file was made with.
"""

import importlib
import os
import shutil
import sys
import tempfile

PUBLIC_FILES = ("modeling_dream.py", "configuration_dream.py", "generation_utils.py")
# NVlabs/Fast-dLLM's block sampler (prefix / dual KV cache), dream/model/generation_utils_block.py there.
BLOCK_FILE = "generation_utils_block.py"

_loaded = {}


def _make_package(modeling_dir, files):
    """Copies `files` into a fresh temporary package `dream_published` and puts it first on sys.path (once)."""
    if "pkg" in _loaded:
        pkg = _loaded["pkg"]
    else:
        pkg = tempfile.mkdtemp(prefix="dream_public_")
        os.makedirs(os.path.join(pkg, "dream_published"))
        open(os.path.join(pkg, "dream_published", "__init__.py"), "w").close()
        sys.path.insert(0, pkg)
        _loaded["pkg"] = pkg
    for f in files:
        src = os.path.join(modeling_dir, f)
        if not os.path.isfile(src):
            raise SystemExit(f"{src} not found: --modeling must hold the published {', '.join(files)}")
        shutil.copy(src, os.path.join(pkg, "dream_published", f))


def load_public_code(modeling_dir):
    """Returns (modeling, configuration, generation_utils) modules of the published Dream code."""
    _make_package(modeling_dir, PUBLIC_FILES)
    modeling = importlib.import_module("dream_published.modeling_dream")
    configuration = importlib.import_module("dream_published.configuration_dream")
    generation = importlib.import_module("dream_published.generation_utils")
    return modeling, configuration, generation


def load_block_code(modeling_dir):
    """Returns (modeling, configuration, generation_utils_block) modules: the published files plus Fast-dLLM's
    generation_utils_block.py (its DreamGenerationMixin has the block `diffusion_generate` / `_sample`)."""
    _make_package(modeling_dir, PUBLIC_FILES + (BLOCK_FILE,))
    modeling = importlib.import_module("dream_published.modeling_dream")
    configuration = importlib.import_module("dream_published.configuration_dream")
    block = importlib.import_module("dream_published.generation_utils_block")
    return modeling, configuration, block


def decoding_knobs(temperature=0.0, top_p=None):
    """The published diffusion_generate's sampling knobs as the goldens set them (top_k and alg_temp always off):
    passed to the call and recorded with each case, so a case says exactly how it was sampled."""
    return dict(temperature=temperature, top_p=top_p, top_k=None, alg_temp=None)


def generate_args(gen, steps, alg, eps, temperature=0.0, top_p=None):
    """The keyword arguments of a golden case's diffusion_generate call: `gen` new tokens in `steps` steps under
    `alg`, the decoding_knobs, `eps`, and the result as a dict without history."""
    return dict(
        max_new_tokens=gen,
        steps=steps,
        alg=alg,
        **decoding_knobs(temperature, top_p),
        eps=eps,
        output_history=False,
        return_dict_in_generate=True,
    )


def golden_provenance(checkpoint, threads):
    """A golden file's first fields, what it was made with: the checkpoint directory's name, the torch and
    transformers versions, float32 and torch's thread count."""
    import torch
    from transformers import __version__ as transformers_version

    return dict(
        checkpoint=os.path.basename(os.path.normpath(checkpoint)),
        torch_version=torch.__version__,
        transformers_version=transformers_version,
        dtype="float32",
        threads=threads,
    )
