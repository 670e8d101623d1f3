"""Loads the published Dream code (modeling_dream.py & co.) from a directory given on the command line.

The files import each other relatively, so they are copied into a throw-away package in a temporary
directory and imported from there. Nothing of theirs is kept in this repository.
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
