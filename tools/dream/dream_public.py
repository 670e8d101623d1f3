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


def load_public_code(modeling_dir):
    """Returns (modeling, configuration, generation_utils) modules of the published Dream code."""
    pkg = tempfile.mkdtemp(prefix="dream_public_")
    os.makedirs(os.path.join(pkg, "dream_published"))
    open(os.path.join(pkg, "dream_published", "__init__.py"), "w").close()
    for f in PUBLIC_FILES:
        src = os.path.join(modeling_dir, f)
        if not os.path.isfile(src):
            raise SystemExit(f"{src} not found: --modeling must hold the published {', '.join(PUBLIC_FILES)}")
        shutil.copy(src, os.path.join(pkg, "dream_published", f))
    sys.path.insert(0, pkg)
    modeling = importlib.import_module("dream_published.modeling_dream")
    configuration = importlib.import_module("dream_published.configuration_dream")
    generation = importlib.import_module("dream_published.generation_utils")
    return modeling, configuration, generation
