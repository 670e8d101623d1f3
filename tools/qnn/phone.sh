#!/usr/bin/env bash
# Measures llada on a Snapdragon phone's NPU, for a user with a phone: pushes the runtime, an
# artifact and Qualcomm's QNN libraries over adb, runs one fixed benchmark there (passes of
# --rows rows, then a --gen-len generation), pulls its output and prints, as JSON: the passes'
# times, the generation's passes and seconds, the contexts created at session open and during
# the generation with their time, and the peak resident memory (tools/qnn/phone_report.py).
#
#   tools/qnn/phone.sh --runtime PATH --artifact FILE.lad --qairt DIR [--arch v73|v75|v79|v81]
#       [--serial SERIAL] [--dir /data/local/tmp/llada] [--rows 32,64,128] [--gen-len 128]
#       [--policy mbsd|exact|prefix|dual|spec|model] [--out REPORT.json] [--dry-run]
#   (--policy model: the model's own sampler, no --policy flag: DiffusionGemma has no policies)
#
# --runtime: llada-rt built for aarch64-linux-android (QNN's phone libraries are bionic's: a
#   static musl build cannot load them; docs/phone.md).
# --artifact: compiled for the phone's SoC with its NPU executables (lladac compile --target
#   sm8750 ..., without --host-only).
# --qairt: Qualcomm's QAIRT SDK, whose lib/aarch64-android/ (libQnnHtp.so, libQnnSystem.so,
#   libQnnHtp<ARCH>Stub.so) and lib/hexagon-<arch>/unsigned/libQnnHtp<ARCH>Skel.so are pushed.
# --arch: the SoC's HTP architecture [default: read from the artifact with `lladac inspect`].
# --dry-run: print the commands instead of running them (no phone needed).
# ADB names the adb to use [default: adb].
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "phone.sh: $*" >&2; exit 1; }

runtime="" artifact="" qairt="" arch="" serial="" dir="/data/local/tmp/llada" rows="32,64,128" gen_len="128" policy="mbsd" out="" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime|--artifact|--qairt|--arch|--serial|--dir|--rows|--gen-len|--policy|--out)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --runtime) runtime="$2" ;; --artifact) artifact="$2" ;; --qairt) qairt="$2" ;; --arch) arch="$2" ;;
        --serial) serial="$2" ;; --dir) dir="$2" ;; --rows) rows="$2" ;; --gen-len) gen_len="$2" ;;
        --policy) policy="$2" ;; --out) out="$2" ;;
      esac
      shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) echo "phone.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$runtime" ] && [ -n "$artifact" ] && [ -n "$qairt" ] || { echo "phone.sh: --runtime, --artifact and --qairt are required" >&2; usage; }
[ -f "$runtime" ] || die "--runtime $runtime: no such file"
[ -f "$artifact" ] || die "--artifact $artifact: no such file"
[ -d "$qairt" ] || die "--qairt $qairt: no such directory"
[[ "$rows" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--rows $rows: expected numbers separated by commas (32,64,128)"
[[ "$gen_len" =~ ^[0-9]+$ ]] && [ "$gen_len" -gt 0 ] || die "--gen-len $gen_len: expected a number above 0"
case "$policy" in exact|prefix|dual|mbsd|spec|model) ;; *) die "--policy $policy: one of exact, prefix, dual, mbsd, spec, model" ;; esac
policy_flag="--policy $policy"
[ "$policy" = model ] && policy_flag=
[[ "$dir" == /* ]] || die "--dir $dir: expected an absolute path on the phone"

if [ -z "$arch" ]; then
  command -v lladac >/dev/null || die "--arch is needed (or lladac on PATH, to read it from the artifact)"
  arch="$(lladac inspect "$artifact" --json | python3 -c 'import json,sys; n=json.load(sys.stdin).get("npu") or {}; print(n.get("htp_arch", ""))')"
  [ -n "$arch" ] || die "--artifact $artifact: it has no NPU executables (compile it for a Snapdragon target without --host-only)"
fi
case "$arch" in v73|v75|v79|v81) ;; *) die "--arch $arch: one of v73, v75, v79, v81" ;; esac
ARCH="V${arch#v}"
libs=("$qairt/lib/aarch64-android/libQnnHtp.so" "$qairt/lib/aarch64-android/libQnnSystem.so" "$qairt/lib/aarch64-android/libQnnHtp${ARCH}Stub.so" "$qairt/lib/hexagon-$arch/unsigned/libQnnHtp${ARCH}Skel.so")
for l in "${libs[@]}"; do [ -f "$l" ] || die "--qairt $qairt: $l is missing (a QAIRT SDK for Android holds it)"; done

adb=("${ADB:-adb}")
[ -n "$serial" ] && adb+=(-s "$serial")
run() {
  if [ "$dry" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}
name="$(basename "$artifact")"
run "${adb[@]}" shell mkdir -p "$dir"
run "${adb[@]}" push "$runtime" "$dir/llada-rt"
run "${adb[@]}" push "$artifact" "$dir/$name"
for l in "${libs[@]}"; do run "${adb[@]}" push "$l" "$dir/$(basename "$l")"; done
# The benchmark: one session, the passes timed (median of 3), then one generation from a
# fixed synthetic prompt; the NPU's libraries found beside the binary (the skel through
# ADSP_LIBRARY_PATH, as Qualcomm's docs say).
remote="cd $dir && chmod +x llada-rt && LD_LIBRARY_PATH=$dir ADSP_LIBRARY_PATH=$dir LLADA_QNN_LIB=$dir ./llada-rt bench $name --backend qnn --rows $rows --repeat 3 --generate --gen-len $gen_len $policy_flag --json > bench.json 2> bench.err; echo \$? > bench.rc"
run "${adb[@]}" shell "$remote"
local_dir="$(mktemp -d)"
trap 'rm -rf "$local_dir"' EXIT
run "${adb[@]}" pull "$dir/bench.rc" "$local_dir/bench.rc"
run "${adb[@]}" pull "$dir/bench.json" "$local_dir/bench.json"
run "${adb[@]}" pull "$dir/bench.err" "$local_dir/bench.err"
[ "$dry" = 1 ] && exit 0
rc="$(tr -d '[:space:]' < "$local_dir/bench.rc")"
if [ "$rc" != 0 ]; then
  echo "phone.sh: llada-rt bench failed on the phone (exit $rc):" >&2
  cat "$local_dir/bench.err" >&2
  exit 1
fi
device="$("${adb[@]}" shell getprop ro.soc.model 2>/dev/null | tr -d '\r' || true)"
report="$(python3 "$(dirname "$0")/phone_report.py" "$local_dir/bench.json" --device "$device" --arch "$arch" --gen-len "$gen_len")"
if [ -n "$out" ]; then printf '%s\n' "$report" > "$out"; fi
printf '%s\n' "$report"
