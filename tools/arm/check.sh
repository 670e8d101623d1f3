#!/usr/bin/env bash
# The aarch64 build of llada-rt, checked under qemu user-mode emulation:
#   1. installs what it needs (the Rust target, the GNU cross linker, qemu-user) if missing;
#   2. builds the static runtime (`--profile phone`) and its library tests for
#      aarch64-unknown-linux-musl, and says how large the binary is and how it is linked;
#   3. runs the kernel tests at three CPU feature levels: -cpu max (ARMv8.6+: dotprod,
#      i8mm, bf16), cortex-a76 (dotprod), cortex-a53 (NEON only);
#   4. under -cpu max, replays the conformance kits (tiny-llada-A and -B at f32, and the
#      project's Dream kit: the published sampler's and Fast-dLLM's blocked cases) and the
#      embedded model's golden outputs at f32, and at q8 and q4 against what the x86 build
#      produces for the same settings;
#   5. builds libllada (the C API) for the same target, links the C example against it
#      with musl's C library (which the Rust target ships) and checks it prints what the x86
#      llada-rt prints for the README's prompt.
#
# Emulated floating point costs ~20 ns a lane here, so a forward pass of the tiny models
# takes about a second: by default the replays take a spread sample of the cases (as
# .ci/run does); `--full` replays every case (hours: see docs/benchmarks-history.md, issue 10, for a record).
#
# Usage: tools/arm/check.sh [--full]   (from the repository root; the conformance kit at
# $LLADA_SHARED or ../shared). Needs the x86 release binaries: cargo build --release.
set -euo pipefail
cd "$(dirname "$0")/../.."

full=0
[ "${1:-}" = "--full" ] && full=1
shared="${LLADA_SHARED:-../shared}"
target=aarch64-unknown-linux-musl
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

echo "== aarch64 toolchain"
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  $sudo apt-get install -y gcc-aarch64-linux-gnu qemu-user file >/dev/null || {
    $sudo apt-get update >/dev/null && $sudo apt-get install -y gcc-aarch64-linux-gnu qemu-user file >/dev/null
  }
fi
qemu-aarch64 --version | head -1

echo "== aarch64 build"
# The phone's command: everything but the HTTP server (apps embed the runtime through C).
cargo build --profile phone -p llada-rt-tools --target "$target" --no-default-features --features vulkan,qnn
# The library's test binary, by the path Cargo names: the `llada-rt` command (package
# llada-rt-tools) is also built into deps/ as llada_rt-*, so the newest such file may be it.
built="$(cargo test --profile phone -p llada-rt --lib --target "$target" --no-run 2>&1)"
echo "$built" | tail -1
tests="$(echo "$built" | sed -n 's/^ *Executable unittests src\/lib\.rs (\(.*\))$/\1/p')"
[ -x "$tests" ] || { echo "no library test binary in: $built"; exit 1; }
bin="target/$target/phone/llada-rt"
file "$bin"
echo "llada-rt for $target: $(stat -c %s "$bin") bytes"
file "$bin" | grep -q "statically linked" || { echo "the musl build is not statically linked"; exit 1; }
cargo build --profile phone -p llada-capi --lib --target "$target"
echo "libllada.a for $target: $(stat -c %s "target/$target/phone/libllada.a") bytes"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The emulator runs one guest thread at a time per process: two checks at once use both
# cores. `job NAME CMD...` starts one (output to a log); `jobs_done` waits for all, prints
# their logs in order and fails if any failed.
names=()
pids=()
job() {
  local name="$1"
  shift
  names+=("$name")
  "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  # At most two at a time (polled, so every job's status is left for `jobs_done`).
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 1; done
}
jobs_done() {
  local failed=0 i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { failed=1; echo "FAILED: ${names[$i]}"; }
    echo "-- ${names[$i]}"
    grep -v -E "^test .* ok$|^running|^$" "$work/${names[$i]}.log" || true
  done
  names=()
  pids=()
  [ "$failed" = 0 ] || exit 1
}
arm() { qemu-aarch64 -cpu max "$bin" "$@"; }

echo "== ARM kernel tests at three feature levels"
for cpu in max cortex-a76 cortex-a53; do
  job "kernels-$cpu" qemu-aarch64 -cpu "$cpu" "$tests" kernels --nocapture
done
jobs_done

echo "== replays under qemu-aarch64 -cpu max: conformance (f32), embedded golden (f32, q8, q4)"
conformance_sample=(--every 70)
# The 20-step setting of the first prompt: the cheapest whole case.
golden_sample=(--every 20 --offset 1)
if [ "$full" = 1 ]; then
  conformance_sample=()
  golden_sample=()
fi
for ck in tiny-llada-A tiny-llada-B; do
  ./target/release/lladac compile --model "$shared/conformance/$ck" --dtype f32 -o "$work/$ck.lad" >/dev/null
done
./target/release/lladac compile --model models/llada-tiny-tasks -o "$work/embedded-f32.lad" >/dev/null
for quant in q8 q4; do
  ./target/release/lladac compile --model models/llada-tiny-tasks --quant "$quant" -o "$work/embedded-$quant.lad" >/dev/null
  # The x86 build pins what this artifact generates for the golden settings; the ARM build
  # must generate the same.
  ./target/release/llada-rt golden tests/golden/embedded.json --model "$work/embedded-$quant.lad" "${golden_sample[@]}" --write "$work/embedded-$quant.json" >/dev/null
done
for ck in tiny-llada-A tiny-llada-B; do
  job "conformance-$ck" arm conformance "$shared/conformance/$ck/golden.json" --model "$work/$ck.lad" "${conformance_sample[@]}"
done
# Dream's kit: the published sampler's cases and Fast-dLLM's blocked ones (a sample of each).
dream=tests/data/dream-conformance/tiny-dream-A
./target/release/lladac compile --model "$dream" -o "$work/tiny-dream-A.lad" >/dev/null
dream_sample=(--every 72)
block_sample=(--every 64)
if [ "$full" = 1 ]; then
  dream_sample=()
  block_sample=()
fi
# Its first-pass logits differ from the reference by up to 7.8e-5 on x86; NEON's GEMM sums in
# another order, which adds a few 1e-5 (1.14e-4 seen), hence the wider logit bound (tokens and
# reveals are exact), as on Vulkan in .ci/run.
dream_replays() {
  arm conformance "$dream/golden.json" --model "$work/tiny-dream-A.lad" "${dream_sample[@]}" --logit-tolerance 2e-4 &&
    arm conformance "$dream/block_golden.json" --model "$work/tiny-dream-A.lad" "${block_sample[@]}"
}
job "conformance-dream" dream_replays
# The C example, statically linked against libllada.a and musl (crt objects and libc.a from
# the Rust target's self-contained directory), on the q4 artifact docs/phone.md pushes.
sc="$(rustc --print sysroot)/lib/rustlib/$target/lib/self-contained"
aarch64-linux-gnu-gcc -O2 -Wall -Werror -Icapi/include -c capi/examples/generate.c -o "$work/generate.o"
aarch64-linux-gnu-gcc -static -nostdlib -nostartfiles "$sc/crt1.o" "$sc/crti.o" "$sc/crtbegin.o" "$work/generate.o" \
  "target/$target/phone/libllada.a" "$sc/libunwind.a" "$sc/libc.a" -lgcc "$sc/crtend.o" "$sc/crtn.o" -o "$work/generate"
./target/release/lladac compile --model models/llada-tiny-tasks --target sm8650 --host-only --quant q4 -o "$work/tiny-sm8650.lad" >/dev/null
readme_prompt="FILL:3000705000000920000040015000608000070060300000004000000800900010="
./target/release/llada-rt run "$work/tiny-sm8650.lad" --chat -p "$readme_prompt" --gen-len 64 --steps 64 >"$work/x86-answer.txt" 2>/dev/null
c_example() {
  qemu-aarch64 -cpu max "$work/generate" "$work/tiny-sm8650.lad" "$readme_prompt" 64 64 2>/dev/null >"$work/arm-answer.txt"
  cmp "$work/x86-answer.txt" "$work/arm-answer.txt" && echo "C example on aarch64: $(cat "$work/arm-answer.txt"), as llada-rt on x86"
}
job "c-example" c_example
job "golden-f32" arm golden tests/golden/embedded.json --model "$work/embedded-f32.lad" "${golden_sample[@]}"
for quant in q8 q4; do
  # Tokens pinned; reveal orders counted (near-tied confidences order by summation order on
  # quantised models: x86's own portable and AVX2 paths differ there too).
  job "golden-$quant" arm golden "$work/embedded-$quant.json" --model "$work/embedded-$quant.lad" --tokens-only
done
jobs_done
