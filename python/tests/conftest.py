import os
from pathlib import Path

import pytest

import llada

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """The conformance kit's folder: LLADA_SHARED, else ../shared beside the checkout (as .ci/run)."""
    return Path(os.environ.get("LLADA_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    """The embedded model models/llada-tiny-tasks, compiled through llada.compile."""
    out = tmp_path_factory.mktemp("tiny") / "llada-tiny.lad"
    summary = llada.compile(REPO / "models" / "llada-tiny-tasks", out)
    assert summary["output"] == str(out)
    assert out.stat().st_size == summary["bytes"]
    return out


@pytest.fixture(scope="session")
def tiny(tiny_path) -> llada.Model:
    return llada.Model(tiny_path)
