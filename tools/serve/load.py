"""A bounded loopback load test of `llada-rt serve`: CLIENTS concurrent streaming clients send
REQUESTS requests in all, every EVERY-th client disconnecting after its first chunk. Every
request must be answered (a whole stream ending in [DONE]), refused with 429, or be one the
client abandoned; none lost. Prints latency p50/p99 of answered requests, throughput, and the
server's RSS after a fifth of the requests, halfway and at the end (flat: the end within
10% of the fifth). A refused client waits the server's Retry-After (1 s) before its next request.

usage: python load.py LLADA_RT ARTIFACT --sessions N [--clients 64] [--requests 500] [--json OUT]
"""

import argparse
import http.client
import json
import threading
import time

from server import Server

FILL = "FILL:3000705000000920000040015000608000070060300000004000000800900010="


def one_request(port, body, leave_early):
    """One streamed request: 'answered' with its latency, 'refused' (429), 'left', or 'lost'."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status == 429:
            err = json.loads(r.read())
            return ("refused", None) if err["error"]["code"] == "rate_limit_exceeded" else ("lost", None)
        if r.status != 200:
            return ("lost", f"status {r.status}: {r.read()[:200]!r}")
        if leave_early:
            r.fp.readline()
            return ("left", None)
        data = r.read().decode()
        if not data.rstrip().endswith("data: [DONE]"):
            return ("lost", f"stream ended without [DONE]: {data[-200:]!r}")
        return ("answered", time.monotonic() - start)
    except OSError as e:
        return ("lost", repr(e))
    finally:
        conn.close()


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("artifact")
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--every", type=int, default=8, help="every EVERY-th client leaves early")
    ap.add_argument("--queue", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    body = json.dumps({"model": a.artifact.rsplit("/", 1)[-1].removesuffix(".lad"), "messages": [{"role": "user", "content": FILL}], "max_tokens": 32, "steps": 32, "stream": True})
    outcomes, lock = [], threading.Lock()
    issued = [0]
    rss = {}
    with Server(a.binary, a.artifact, "--sessions", str(a.sessions), "--queue", str(a.queue)) as server:
        def client(i):
            while True:
                with lock:
                    if issued[0] >= a.requests:
                        return
                    issued[0] += 1
                    n = issued[0]
                    # Samples after the warm-up (threads started, buffers sized) and halfway.
                    if n in (a.requests // 5, a.requests // 2):
                        rss[n] = server.rss_kib()
                leave = a.every > 0 and i % a.every == 0
                kind, detail = one_request(server.port, body, leave)
                with lock:
                    outcomes.append((kind, detail))
                if kind == "refused":
                    time.sleep(1.0)  # the server's Retry-After

        start = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        # Abandoned generations are cancelled: wait until the server is idle, then read its RSS.
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("GET", "/health")
            h = json.loads(conn.getresponse().read())
            conn.close()
            if h["running"] == 0 and h["queued"] == 0:
                break
            time.sleep(0.05)
        rss["end"] = server.rss_kib()
        health = h
        status = server.stop()
    counts = {k: sum(1 for o in outcomes if o[0] == k) for k in ("answered", "refused", "left", "lost")}
    lat = [d for k, d in outcomes if k == "answered"]
    report = {
        "sessions": a.sessions, "clients": a.clients, "requests": len(outcomes), **counts,
        "latency_p50_s": round(percentile(lat, 50), 3), "latency_p99_s": round(percentile(lat, 99), 3),
        "throughput_per_s": round(counts["answered"] / wall, 2), "wall_s": round(wall, 1),
        "rss_kib_after_fifth": rss.get(a.requests // 5), "rss_kib_after_half": rss.get(a.requests // 2), "rss_kib_end": rss["end"], "server_cancelled": health.get("cancelled"), "exit": status,
    }
    print(json.dumps(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f)
    for k, d in outcomes:
        if k == "lost":
            print("lost:", d)
    assert counts["lost"] == 0, "requests were lost"
    assert len(outcomes) == a.requests
    assert status == 0
    early = rss[a.requests // 5]
    assert rss["end"] <= early * 1.10 + 1024, f"RSS grew over the requests: {rss}"


if __name__ == "__main__":
    main()
