#!/usr/bin/env bash
# The Python module end to end: builds the abi3 wheel with maturin (in a throwaway venv),
# installs it with pytest in a fresh venv, and runs python/tests (the README's answer, the
# step iterator, errors, threads, and conformance kit A through Python). The kit is expected
# at ${LLADA_SHARED:-../shared} beside the checkout, as .ci/run expects it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
shared="${LLADA_SHARED:-../shared}"
[ -d "$shared" ] && LLADA_SHARED="$(cd "$shared" && pwd)" || LLADA_SHARED="$repo/$shared"
export LLADA_SHARED
python="${PYTHON:-python3}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

echo "== build venv, maturin"
"$python" -m venv "$tmp/build"
"$tmp/build/bin/pip" install -q "maturin>=1.16,<2"

echo "== wheel (at $((SECONDS - start)) s)"
# The workspace's target dir (maturin asks cargo for it): what `cargo test --release
# --workspace` built is reused.
"$tmp/build/bin/maturin" build --release -m python/Cargo.toml -i "$tmp/build/bin/python" -o "$tmp/wheels"
wheel="$(ls "$tmp"/wheels/*.whl)"
ls -l "$wheel"
# Kept where the caller asks (CI keeps it as an artifact).
if [ -n "${LLADA_WHEEL_OUT:-}" ]; then
  mkdir -p "$LLADA_WHEEL_OUT"
  cp "$wheel" "$LLADA_WHEEL_OUT/"
fi

echo "== fresh venv, pytest (at $((SECONDS - start)) s)"
"$python" -m venv "$tmp/test"
"$tmp/test/bin/pip" install -q "$wheel" pytest
# -s: the conformance test prints its count.
"$tmp/test/bin/python" -m pytest python/tests -q -s -p no:cacheprovider
echo "== done (at $((SECONDS - start)) s)"
