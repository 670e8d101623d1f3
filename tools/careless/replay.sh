#!/usr/bin/env bash
# Issue 40's list, replayed as a careless user types it: every command under a memory limit
# (address space, `ulimit -v`) and a timeout, against the release binaries. A case passes when
# the command neither panics (101), nor hangs (timeout), nor dies (a signal, the memory limit),
# ends as it should (one line of error naming the thing at fault and a non-zero status, or
# success), and leaves every file it must not touch as it was.
#
#   tools/careless/replay.sh            # after `cargo build --release --workspace`
#
# Environment: CARELESS_MEM_KB (default 4 GiB of address space per command), CARELESS_SECS
# (default 60 s per command), CARELESS_BIN (the folder of the binaries to replay against,
# default target/release: another build's, to see what it gets wrong).
set -u
cd "$(dirname "$0")/../.."
root=$PWD
bin="${CARELESS_BIN:-$root/target/release}"
mem_kb="${CARELESS_MEM_KB:-4194304}"
secs="${CARELESS_SECS:-60}"
for b in lladac llada-rt gen-checkpoint; do
  [ -x "$bin/$b" ] || { echo "careless: $bin/$b is missing: run cargo build --release --workspace first"; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# Runs "$@" limited; leaves its status in $rc, its stdout and stderr in $work/out, $work/err.
limited() {
  ( ulimit -v "$mem_kb"; exec timeout -s KILL "$secs" "$@" ) >"$work/out" 2>"$work/err" </dev/null
  rc=$?
}

verdict() { # NAME PROBLEM (empty: passed)
  if [ -z "$2" ]; then
    passed=$((passed + 1)); echo "ok    $1"
  else
    failed=$((failed + 1)); echo "FAIL  $1: $2"; sed 's/^/      stderr: /' "$work/err" | head -5
  fi
}

# What went wrong with the last command in any case: a panic, a hang, a death.
broken() {
  if [ "$rc" = 101 ] || grep -q "panicked" "$work/err"; then echo "panicked"
  elif [ "$rc" = 137 ] || [ "$rc" = 124 ]; then echo "hung or was killed (status $rc) within ${secs}s / ${mem_kb} KiB"
  elif [ "$rc" -gt 128 ]; then echo "died of signal $((rc - 128))"
  fi
}

# refused NAME NEEDLE... -- COMMAND...: one line of error mentioning every needle, non-zero status.
refused() {
  local name="$1"; shift
  local needles=()
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  limited "$@"
  local problem; problem="$(broken)"
  if [ -z "$problem" ] && [ "$rc" = 0 ]; then problem="succeeded (status 0)"; fi
  if [ -z "$problem" ] && [ "$(grep -c . "$work/err")" != 1 ]; then problem="$(grep -c . "$work/err") lines on stderr, expected one"; fi
  for n in "${needles[@]}"; do
    if [ -z "$problem" ] && ! grep -qF -- "$n" "$work/err"; then problem="the error does not mention '$n'"; fi
  done
  verdict "$name" "$problem"
}

# works NAME -- COMMAND...: status 0, no panic.
works() {
  local name="$1"; shift 2
  limited "$@"
  local problem; problem="$(broken)"
  if [ -z "$problem" ] && [ "$rc" != 0 ]; then problem="status $rc"; fi
  verdict "$name" "$problem"
}

# intact NAME FILE SUM: FILE still has checksum SUM (and is what it was).
intact() {
  local now; now="$(cksum <"$2" 2>/dev/null)"
  if [ "$now" = "$3" ]; then verdict "$1" ""; else verdict "$1" "$2 changed"; fi
}
sum() { cksum <"$1"; }

lladac="$bin/lladac"; rt="$bin/llada-rt"; gen="$bin/gen-checkpoint"

# Fixtures: a tiny f32 checkpoint, its artifact, the embedded model's artifact and golden file.
"$gen" --preset tiny --dtype f32 -o "$work/ckpt" >/dev/null 2>&1 || { echo "careless: gen-checkpoint failed"; exit 1; }
"$lladac" compile --model "$work/ckpt" -o "$work/tiny.lad" 2>/dev/null || { echo "careless: compiling the tiny checkpoint failed"; exit 1; }
"$lladac" compile --model models/llada-tiny-tasks --max-seq 256 -o "$work/embedded.lad" 2>/dev/null || { echo "careless: compiling the embedded model failed"; exit 1; }
cp tests/golden/embedded.json "$work/golden.json"
fresh() { # a copy of the tiny checkpoint in $work/$1
  rm -rf "${work:?}/$1"; cp -r "$work/ckpt" "$work/$1"; echo "$work/$1"
}
ids=(--prompt-ids 1,2,3,4 --gen-len 16 --block-len 8 --steps 16)

echo "== files destroyed"
mkfifo "$work/fifo.lad"
refused "compile -o a FIFO" "fifo.lad" "FIFO" -- "$lladac" compile --model "$work/ckpt" -o "$work/fifo.lad"
if [ -p "$work/fifo.lad" ]; then verdict "the FIFO stays a FIFO" ""; else verdict "the FIFO stays a FIFO" "replaced"; fi
if [ "$(id -u)" = 0 ] && mknod "$work/null" c 1 3 2>/dev/null; then dev="$work/null"; else dev=/dev/null; fi
refused "compile -o a device" "$dev" "character device" -- "$lladac" compile --model "$work/ckpt" -o "$dev"
if [ -c "$dev" ]; then verdict "the device stays a device" ""; else verdict "the device stays a device" "replaced"; fi
w="$(sum "$work/ckpt/model.safetensors")"
refused "compile -o the model's own weights" "model.safetensors" "read by this command" -- "$lladac" compile --model "$work/ckpt" -o "$work/ckpt/model.safetensors"
intact "the weights are intact" "$work/ckpt/model.safetensors" "$w"
a="$(sum "$work/embedded.lad")"; g="$(sum "$work/golden.json")"
refused "run --trace onto the artifact" "embedded.lad" "read by this command" -- "$rt" run "$work/embedded.lad" "${ids[@]}" --trace "$work/embedded.lad"
intact "the artifact is intact after --trace" "$work/embedded.lad" "$a"
refused "golden --write onto the artifact" "embedded.lad" "read by this command" -- "$rt" golden "$work/golden.json" --model "$work/embedded.lad" --write "$work/embedded.lad"
refused "golden --write onto its own golden file" "golden.json" "read by this command" -- "$rt" golden "$work/golden.json" --model "$work/embedded.lad" --write "$work/golden.json" --every 50
intact "the artifact is intact after golden --write" "$work/embedded.lad" "$a"
intact "the golden file is intact" "$work/golden.json" "$g"

echo "== crashes"
# stdout closed early: the command ends quietly (its own status, not the pipe's reader's).
limited bash -c "set -o pipefail; '$rt' run '$work/embedded.lad' --prompt-ids 1,2,3 --gen-len 32 --steps 32 | head -c 1 >/dev/null"
p="$(broken)"; [ -z "$p" ] && [ "$rc" != 0 ] && p="status $rc"; verdict "run | head -c 1" "$p"
limited bash -c "set -o pipefail; '$rt' run '$work/embedded.lad' --prompt-ids 1,2,3 --gen-len 32 --steps 32 --show-denoising | head -n 1 >/dev/null"
p="$(broken)"; [ -z "$p" ] && [ "$rc" != 0 ] && p="status $rc"; verdict "run --show-denoising | head" "$p"
refused "run > /dev/full" "stdout" -- bash -c "exec '$rt' run '$work/embedded.lad' --prompt-ids 1,2,3 --gen-len 32 --steps 32 >/dev/full"
refused "run --json > /dev/full" "stdout" -- bash -c "exec '$rt' run '$work/embedded.lad' --prompt-ids 1,2,3 --gen-len 32 --steps 32 --json >/dev/full"
refused "inspect > /dev/full" "stdout" -- bash -c "exec '$lladac' inspect '$work/tiny.lad' >/dev/full"
refused "gen-checkpoint --init-std nan" "--init-std" -- "$gen" --init-std nan -o "$work/nan-ckpt"
if [ -e "$work/nan-ckpt" ]; then verdict "gen-checkpoint --init-std nan creates nothing" "left $work/nan-ckpt"; else verdict "gen-checkpoint --init-std nan creates nothing" ""; fi

echo "== unbounded reads and work"
for pair in config.json:/dev/zero tokenizer.json:/dev/urandom tokenizer_config.json:/dev/zero model.safetensors:/dev/zero; do
  name="${pair%%:*}"; target="${pair#*:}"
  c="$(fresh "link-$name")"; rm "$c/$name"; ln -s "$target" "$c/$name"
  refused "$name linked to $target" "$name" "character device" -- "$lladac" compile --model "$c" -o "$work/out.lad"
done
c="$(fresh fifo-config)"; rm "$c/config.json"; mkfifo "$c/config.json"
refused "config.json a FIFO" "config.json" "FIFO" -- "$lladac" compile --model "$c" -o "$work/out.lad"
refused "the artifact a FIFO" "fifo.lad" "FIFO" -- "$rt" run "$work/fifo.lad" "${ids[@]}"
refused "the artifact /dev/null" "/dev/null" "character device" -- "$rt" run /dev/null "${ids[@]}"
refused "the artifact a directory" "directory" -- "$rt" run "$work" "${ids[@]}"
c="$(fresh big-config)"; truncate -s 1G "$c/config.json"
refused "config.json of 1 GiB" "config.json" "larger than" -- "$lladac" compile --model "$c" -o "$work/out.lad"
[ -e "$work/out.lad" ] && verdict "no artifact from a refused compile" "$work/out.lad exists" || verdict "no artifact from a refused compile" ""


c="$(fresh loop-template)"
set_json_key() { # FILE KEY JSON-VALUE: sets a key of a JSON object file (no jq, no Python): a
  # duplicate key at the end, which JSON readers (serde_json included) take over the first.
  sed -i -e '$ s/}[[:space:]]*$/, "'"$2"'": '"$(printf '%s' "$3" | sed 's/[&|\/]/\\&/g')"'}/' "$1"
}
set_json_key "$c/tokenizer_config.json" chat_template '"{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"'
refused "a chat template with nested loops" "tokenizer_config.json" "chat_template" -- "$lladac" compile --model "$c" -o "$work/out.lad"
c="$(fresh broken-template)"
set_json_key "$c/tokenizer_config.json" chat_template '"{% for m in messages %}{{ m.content }"'
refused "a chat template with a syntax error" "tokenizer_config.json" "chat_template" -- "$lladac" compile --model "$c" -o "$work/out.lad"

echo "== wrong answers without a word"
# One NaN: the first 4 bytes of the first tensor's data (f32 checkpoint).
c="$(fresh nan-weight)"
n="$(od -An -tu8 -N8 "$c/model.safetensors" | tr -d ' ')"
printf '\x00\x00\xc0\x7f' | dd of="$c/model.safetensors" bs=1 seek=$((8 + n)) conv=notrunc status=none
for q in f32 q4; do
  refused "a NaN weight, --quant $q" "NaN" "flat index 0" -- "$lladac" compile --model "$c" -o "$work/out.lad" --quant "$q"
done
for kv in rope_theta:0 rope_theta:-1 rms_norm_eps:-1e-5 max_sequence_length:4294967396 mask_token_id:4294967571 max_sequence_length:4611686018427387904; do
  key="${kv%%:*}"; value="${kv#*:}"
  c="$(fresh "cfg-$key")"; set_json_key "$c/config.json" "$key" "$value"
  refused "config.json $key $value" "config.json" "$key" -- "$lladac" compile --model "$c" -o "$work/out.lad"
done
c="$(fresh cfg-2-62)"; set_json_key "$c/config.json" max_sequence_length 4611686018427387904
limited "$lladac" compile --model "$c" -o "$work/out.lad"
if grep -q -- "--max-seq 0" "$work/err"; then verdict "2^62 positions do not speak of --max-seq 0" "it does"; else verdict "2^62 positions do not speak of --max-seq 0" ""; fi
refused "gen-checkpoint into a non-empty folder" "not empty" "--replace" -- "$gen" --preset tiny -o "$work/ckpt"
mkdir -p "$work/regen"; "$gen" --preset tiny --shard-mb 1 --n-layers 4 --d-model 256 -o "$work/regen" >/dev/null 2>&1
works "gen-checkpoint --replace over its own checkpoint" -- "$gen" --preset tiny --replace -o "$work/regen"
ls "$work/regen"/model-*.safetensors >/dev/null 2>&1 && verdict "--replace leaves no stale shards" "stale shards left" || verdict "--replace leaves no stale shards" ""
c="$(fresh both)"; cp "$c/model.safetensors" "$c/model-00001-of-00001.safetensors"
echo '{"metadata": {}, "weight_map": {}}' >"$c/model.safetensors.index.json"
refused "a folder with a single file and a shard index" "model.safetensors" "model.safetensors.index.json" -- "$lladac" compile --model "$c" -o "$work/out.lad"

echo "== messages that mislead, flags that do nothing"
ln -s "$work/loop-b" "$work/loop-a"; ln -s "$work/loop-a" "$work/loop-b"
refused "a link loop as the artifact" "symbolic links" -- "$rt" run "$work/loop-a" "${ids[@]}"
refused "a link loop as the model" "symbolic links" -- "$lladac" compile --model "$work/loop-a" -o "$work/out.lad"
refused "run without a prompt names it" "--prompt" -- "$rt" run "$work/tiny.lad"
refused "--cpu-threads 0 names itself" "--cpu-threads" -- "$rt" run "$work/tiny.lad" "${ids[@]}" --cpu-threads 0
"$gen" --preset tiny-dream -o "$work/dream" >/dev/null 2>&1 && "$lladac" compile --model "$work/dream" --max-seq 64 -o "$work/dream.lad" 2>/dev/null
refused "--logits-eos-inf on Dream names itself" "--logits-eos-inf" "Dream" -- "$rt" run "$work/dream.lad" --prompt-ids 1,2 --gen-len 16 --block-len 16 --steps 16 --logits-eos-inf
refused "--threshold -inf is a value" "--threshold -inf" -- "$rt" run "$work/tiny.lad" "${ids[@]}" --threshold -inf
long="$(printf '5%.0s,' $(seq 1 600))"; long="${long%,}"
refused "too long: the model's own limit" "max_sequence_length" -- "$rt" run "$work/tiny.lad" --prompt-ids "$long" --gen-len 16 --block-len 8 --steps 16
refused "compile --spec-blocks 4294967295" "--spec-blocks 4294967295" -- "$lladac" compile --model "$work/ckpt" -o "$work/out.lad" --spec-blocks 4294967295
refused "bench --rows 0" "--rows" -- "$rt" bench "$work/tiny.lad" --rows 0 --repeat 1
refused "--chat with --prompt-ids" "--chat" "--prompt-ids" -- "$rt" run "$work/tiny.lad" "${ids[@]}" --chat
for flag in "--rows 8" "--spec-blocks 1" "--spec-threshold 0.5" "--refresh-every 2" "--revision off"; do
  # shellcheck disable=SC2086
  refused "$flag under --policy exact" "${flag%% *} does nothing under --policy exact" -- "$rt" run "$work/tiny.lad" "${ids[@]}" $flag
done
refused "--side-rows under dual" "--side-rows does nothing under --policy dual" -- "$rt" run "$work/tiny.lad" "${ids[@]}" --policy dual --side-rows 4
refused "--group with q8" "--group 64 does nothing" -- "$lladac" compile --model "$work/ckpt" -o "$work/out.lad" --quant q8 --group 64
for value in abc 0 -1 99999; do
  refused "LLADA_THREADS=$value" "LLADA_THREADS" -- env LLADA_THREADS="$value" "$rt" run "$work/tiny.lad" "${ids[@]}"
done

echo "== the C API (100 truncated models, 500 load-generate-free cycles)"
capi_test="$(ls -t "$root"/target/release/deps/careless_capi-* 2>/dev/null | grep -v '\.d$' | head -n 1)"
if [ -n "$capi_test" ]; then
  secs_c="$secs"; secs=600
  limited "$capi_test" --test-threads 1
  secs="$secs_c"
  p="$(broken)"; [ -z "$p" ] && [ "$rc" != 0 ] && p="status $rc"; verdict "careless_capi under the limits" "$p"
else
  verdict "careless_capi under the limits" "its test binary is not built: run cargo test --release --workspace first"
fi

echo "careless: $passed passed, $failed failed"
[ "$failed" = 0 ]
