#!/usr/bin/env python3
"""The report tools/qnn/phone.sh prints: `llada-rt bench --json` output from a phone, cut
down to what a phone run measures, as one JSON object.

    tools/qnn/phone_report.py BENCH.json [--device SOC] [--arch v79] [--gen-len 128]

Output fields: device, arch, backend (what the runtime says it ran on), passes (rows, graph,
seconds each: the median of the repeats), generation (forward_passes, seconds,
seconds_per_pass, tokens_per_second), contexts (session_open_seconds: opening the session,
which creates the resident contexts; created_during_generation, their bytes and seconds:
contexts that rotate), peak_rss_bytes. A field the input lacks is one error naming it.
Plain Python, no packages.
"""
import argparse
import json
import sys


def need(obj, path, where):
    cur = obj
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            sys.exit(f"phone_report.py: {where}: field '{path}' is missing (expected `llada-rt bench --generate --json` output)")
        cur = cur[key]
    return cur


def report(bench, where, device, arch, gen_len):
    passes = need(bench, "passes", where)
    if not isinstance(passes, list) or not passes:
        sys.exit(f"phone_report.py: {where}: field 'passes' holds no pass")
    generation = need(bench, "generation", where)
    if generation is None:
        sys.exit(f"phone_report.py: {where}: field 'generation' is null (run bench with --generate)")
    seconds = need(bench, "generation.seconds", where)
    forward = need(bench, "generation.forward_passes", where)
    loads = need(bench, "window.npu_context_loads", where)
    return {
        "device": device,
        "arch": arch,
        "backend": need(bench, "backend.device", where),
        "passes": [{"rows": need(p, "rows", where), "graph": need(p, "graph", where), "seconds": need(p, "seconds", where)} for p in passes],
        "generation": {
            "forward_passes": forward,
            "seconds": seconds,
            "seconds_per_pass": seconds / forward if forward else None,
            "tokens_per_second": gen_len / seconds if gen_len and seconds > 0 else None,
        },
        "contexts": {
            "session_open_seconds": need(bench, "window.load_seconds", where),
            "created_during_generation": need(loads, "contexts", where),
            "created_bytes": need(loads, "bytes", where),
            "created_seconds": need(loads, "seconds", where),
        },
        "peak_rss_bytes": need(bench, "peak_rss_bytes", where),
    }


def main():
    ap = argparse.ArgumentParser(description="Cut `llada-rt bench --json` output from a phone down to a phone run's report.")
    ap.add_argument("bench")
    ap.add_argument("--device", default="")
    ap.add_argument("--arch", default="")
    ap.add_argument("--gen-len", type=int, default=0)
    a = ap.parse_args()
    try:
        with open(a.bench) as f:
            bench = json.load(f)
    except OSError as e:
        sys.exit(f"phone_report.py: {a.bench}: {e.strerror}")
    except json.JSONDecodeError as e:
        sys.exit(f"phone_report.py: {a.bench}: not JSON ({e})")
    print(json.dumps(report(bench, a.bench, a.device, a.arch, a.gen_len), indent=1))


if __name__ == "__main__":
    main()
