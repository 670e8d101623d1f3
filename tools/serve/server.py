"""Starts `llada-rt serve` on a free loopback port for the checks beside this file."""

import json
import os
import re
import signal
import subprocess


class Server:
    """`llada-rt serve ARTIFACT --port 0 ARGS...`; the port is read from its ready line."""

    def __init__(self, binary, artifact, *args):
        self.proc = subprocess.Popen([binary, "serve", artifact, "--port", "0", *args], stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"llada-rt serve did not start: {line!r}{self.proc.stderr.read()}")
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])

    def stop(self):
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_text(binary, artifact, prompt, *args):
    """`llada-rt run --chat --json`'s answer text and passes for the same settings."""
    out = subprocess.run([binary, "run", artifact, "--chat", "-p", prompt, "--json", *args], check=True, capture_output=True, text=True, env={**os.environ})
    j = json.loads(out.stdout)
    return j["text"], j["forward_passes"]
