"""`llada-rt serve` through a common HTTP client and Prometheus' own parser (issue 58):
100 requests over one kept-alive connection (httpx, which `openai` uses and installs), a chunked request
body, `/metrics` parsed by `prometheus_client` with its counters equal to what was sent, and
three slow readers of `llada_steps` streams that keep the server within 200 MB of its idle
memory while another client is served.

usage: python http_checks.py LLADA_RT ARTIFACT   (exit status 0: all held)
"""

import json
import socket
import sys
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from server import Server

try:
    import httpx
except ImportError:  # openai 3 ships httpx under the name httpx2
    import httpx2 as httpx

FILL = "FILL:3000705000000920000040015000608000070060300000004000000800900010="


def samples(text):
    """Every sample of the exposition: (name, labels as a sorted tuple) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def requests_total(metrics, endpoint, status):
    return metrics.get(("llada_requests_total", (("endpoint", endpoint), ("status", str(status)))), 0.0)


def keep_alive_chunked_and_metrics(binary, artifact):
    with Server(binary, artifact) as server:
        body = {"model": "llada-tiny", "messages": [{"role": "user", "content": FILL}], "max_tokens": 32, "steps": 32}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            before = samples(client.get("/metrics").text)
            for i in range(100):
                r = client.get("/v1/models")
                assert r.status_code == 200, f"request {i}: {r.status_code}"
            answers = []
            for i in range(3):
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                answers.append(r.json())
            # A chunked body: httpx sends a generator's pieces with Transfer-Encoding: chunked.
            raw = json.dumps(body).encode()
            pieces = (raw[i : i + 7] for i in range(0, len(raw), 7))
            r = client.post("/v1/chat/completions", content=pieces, headers={"Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            assert r.request.headers.get("transfer-encoding") == "chunked", r.request.headers
            answers.append(r.json())
            assert all(a["choices"] == answers[0]["choices"] for a in answers), "the chunked body is the same request"
            bad = client.post("/v1/chat/completions", json={**body, "steps": "many"})
            assert bad.status_code == 400, bad.text
            after = samples(client.get("/metrics").text)
        connections = after[("llada_connections_total", ())] - before[("llada_connections_total", ())]
        assert connections == 0, f"{connections} new connections: the client's one connection was not kept alive"
        sent = {("/v1/models", 200): 100, ("/v1/chat/completions", 200): 4, ("/v1/chat/completions", 400): 1}
        for (endpoint, status), n in sent.items():
            got = requests_total(after, endpoint, status) - requests_total(before, endpoint, status)
            assert got == n, f"llada_requests_total{{{endpoint},{status}}} rose by {got}, {n} were sent"
        tokens = after[("llada_tokens_generated_total", ())] - before[("llada_tokens_generated_total", ())]
        assert tokens == sum(a["usage"]["completion_tokens"] for a in answers), tokens
        assert after[("process_resident_memory_bytes", ())] > 0
        print(f"100 requests and 5 more on one connection; a chunked body; /metrics parsed: requests by endpoint and status, {tokens:.0f} tokens as the answers' usage")


def slow_readers(binary, artifact):
    """Three clients stream every step's canvas of a long generation and read 64 KiB every
    5 s (the reproduction of issue 58): the server's memory stays within 200 MB of idle and
    another client is answered meanwhile."""
    with Server(binary, artifact, "--sessions", "4") as server:
        time.sleep(0.5)
        idle = server.rss_kib()
        body = json.dumps({"model": "llada-tiny", "messages": [{"role": "user", "content": FILL}], "max_tokens": 128, "steps": 65536, "stream": True, "llada_steps": True}).encode()
        stop = threading.Event()

        def slow():
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            while not stop.wait(5):
                try:
                    s.recv(65536)
                except OSError:
                    break
            s.close()

        readers = [threading.Thread(target=slow) for _ in range(3)]
        for t in readers:
            t.start()
        peak = idle
        answered = None
        for second in range(15):
            time.sleep(1)
            peak = max(peak, server.rss_kib())
            if second == 5:
                r = httpx.post(server.url + "/v1/chat/completions", json={"model": "llada-tiny", "messages": [{"role": "user", "content": "REVERSE:AB="}], "max_tokens": 8, "steps": 8}, timeout=30)
                answered = r.status_code
        stop.set()
        for t in readers:
            t.join()
        grown_mb = (peak - idle) / 1024
        assert answered == 200, f"another client got {answered} while the slow readers streamed"
        assert grown_mb < 200, f"the server grew {grown_mb:.0f} MB over idle with three slow readers"
        print(f"three slow readers for 15 s: the server grew {grown_mb:.1f} MB over its idle {idle / 1024:.0f} MB; another client was answered")


def main():
    binary, artifact = sys.argv[1:3]
    keep_alive_chunked_and_metrics(binary, artifact)
    slow_readers(binary, artifact)


if __name__ == "__main__":
    main()
