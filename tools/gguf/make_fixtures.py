#!/usr/bin/env python3
"""Makes tests/data/gguf/*: the tiny checkpoints converted by llama.cpp's own converter.

Run by a developer, not by CI (it needs torch, transformers, sentencepiece and llama.cpp's
converter). Usage:

    LLAMA_CPP=/path/to/llama.cpp python3 tools/gguf/make_fixtures.py

where LLAMA_CPP holds `convert_hf_to_gguf.py`, `conversion/` and `gguf-py/` (the
`vendor/llama.cpp` folder of the `llama-cpp-python` 0.3.36 source distribution on PyPI has
them: `pip download --no-deps --no-binary=llama-cpp-python llama-cpp-python==0.3.36`).

One change is made to the converter, in this process only: the tiny kits' tokenizers are
trained ones whose pre-tokenizer hash llama.cpp does not list, so `get_vocab_base_pre` is
made to answer "gpt-2" (their pre-tokenizer is GPT-2's byte-level split, which is what that
name means to llama.cpp). Nothing else differs from `convert_hf_to_gguf.py --outtype f32`.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gguf"

# (source checkpoint folder, output file name)
F32_FIXTURES = [
    (ROOT.parent / "shared" / "conformance" / "tiny-llada-A", "tiny-llada-A.f32.gguf"),
    (ROOT.parent / "shared" / "conformance" / "tiny-llada-B", "tiny-llada-B.f32.gguf"),
    (ROOT / "tests" / "data" / "dream-conformance" / "tiny-dream-A", "tiny-dream-A.f32.gguf"),
    (ROOT / "models" / "dream-tiny-tasks", "dream-tiny-tasks.f32.gguf"),
    (ROOT / "models" / "llada-tiny-tasks", "llada-tiny-tasks.f32.gguf"),
]

RUNNER = r"""
import sys
sys.argv = sys.argv[1:]
sys.path.insert(0, LLAMA_CPP)
sys.path.insert(0, LLAMA_CPP + "/gguf-py")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import runpy
runpy.run_path(LLAMA_CPP + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert(src: Path, out: Path, llama_cpp: str, extra=()) -> None:
    code = f"LLAMA_CPP = {llama_cpp!r}\n" + RUNNER
    cmd = [sys.executable, "-c", code, "convert_hf_to_gguf.py", str(src), "--outtype", "f32", "--outfile", str(out), *extra]
    subprocess.run(cmd, check=True)


def main() -> None:
    llama_cpp = os.environ.get("LLAMA_CPP")
    if not llama_cpp or not Path(llama_cpp, "convert_hf_to_gguf.py").is_file():
        sys.exit("set LLAMA_CPP to a llama.cpp folder holding convert_hf_to_gguf.py")
    OUT.mkdir(parents=True, exist_ok=True)
    only = sys.argv[1:]
    for src, name in F32_FIXTURES:
        if only and name not in only:
            continue
        convert(src, OUT / name, llama_cpp)
    # LLaDA-MoE: no kit exists; a random-weight checkpoint the e2e test writes again the same
    # way (tests/tests/gguf.rs `pairs`).
    if not only or "tiny-llada-moe.f32.gguf" in only:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            moe = Path(tmp) / "tiny-llada-moe"
            gen = ROOT / "target" / "release" / "gen-checkpoint"
            subprocess.run([str(gen), "--preset", "tiny-moe", "--dtype", "f32", "--init-std", "0.08", "--seed", "11", "-o", str(moe)], check=True)
            convert(moe, OUT / "tiny-llada-moe.f32.gguf", llama_cpp)
    # A split file: kit A in three parts of at most 14 tensors (split/NAME-0000i-of-00003.gguf).
    if not only or "split" in only:
        (OUT / "split").mkdir(exist_ok=True)
        convert(F32_FIXTURES[0][0], OUT / "split" / "tiny-llada-A.gguf", llama_cpp, ["--split-max-tensors", "14"])


if __name__ == "__main__":
    main()
