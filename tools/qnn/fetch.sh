#!/usr/bin/env bash
# Fetches Qualcomm's QNN HTP libraries for x86-64 Linux (graph preparation for any Snapdragon,
# and the HTP simulator) from PyPI's onnxruntime-qnn 2.7.0 wheel (QAIRT 2.51), pinned by its
# SHA-256. Only the two QNN libraries a direct client opens and the C++ runtime they link are
# taken from it; nothing of ONNX Runtime is used. A phone's libraries come with Qualcomm's
# QAIRT SDK instead (docs/phone.md, "On the phone's NPU").
#
#   tools/qnn/fetch.sh [DIR]      # default target/qnn; prints DIR, for LLADA_QNN_LIB=DIR
set -euo pipefail
wheel=onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_35_x86_64.whl
sha256=c56c01562b8534fe8980cfea4601408d950c065f8251fb862ce82101c52c9849
dir="${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/qnn}"
if [ "$(cat "$dir/.fetched" 2>/dev/null)" = "$sha256" ]; then echo "$dir"; exit 0; fi
[ "$(uname -m)" = x86_64 ] || { echo "fetch.sh: the wheel's libraries are for x86-64 Linux; on a phone use the QAIRT SDK's" >&2; exit 1; }
python=$(command -v python3 || command -v python) || { echo "fetch.sh: needs python3 with pip (to download the wheel from PyPI)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_35_x86_64 onnxruntime-qnn==2.7.0 -d "$tmp" >&2
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet >&2 || { echo "fetch.sh: $wheel does not have the pinned SHA-256" >&2; exit 1; }
mkdir -p "$dir"
# Flat in DIR: the libraries' RPATH ($ORIGIN) finds the C++ runtime beside them.
"$python" - "$tmp/$wheel" "$dir" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
wanted = {"onnxruntime_qnn/libQnnHtp.so", "onnxruntime_qnn/libQnnSystem.so"}
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n in wanted or n.startswith("onnxruntime_qnn.libs/lib")]
    missing = wanted - set(names)
    if missing:
        sys.exit(f"fetch.sh: the wheel lacks {sorted(missing)}")
    for n in names:
        target = os.path.join(out, os.path.basename(n))
        with z.open(n) as src, open(target + ".partial", "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.chmod(target + ".partial", 0o755)
        os.replace(target + ".partial", target)
PY
echo "$sha256" >"$dir/.fetched"
echo "$dir"
