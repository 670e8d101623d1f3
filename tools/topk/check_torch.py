"""Checks the top-k fixture (runtime/tests/data/topk_libstdcxx.txt) against torch.topk itself.

Generates the same 1000 cases as tools/topk/reference.cpp and the Rust test (SplitMix64,
seed 2026) and compares the indices torch.topk(values, k) returns on the CPU, in order, in
float32 and float64. Needs PyTorch:  python tools/topk/check_torch.py
"""

import math
import os
import sys

import torch

MASK = (1 << 64) - 1


class SplitMix:
    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


POOL = [1.0, 1.0 - 2.0**-40, 0.5, 0.25, 0.0, -0.0, -math.inf, math.nan]


def main():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    path = os.path.join(root, "runtime", "tests", "data", "topk_libstdcxx.txt")
    lines = [l for l in open(path).read().splitlines() if not l.startswith("#")]
    rng = SplitMix(2026)
    torch.set_num_threads(1)
    mismatches = 0
    for case in range(len(lines) // 2):
        n = 1 + rng.below(300)
        if rng.below(2) == 0 and n >= 64:
            k = 1 + rng.below(n // 64)
        else:
            k = 1 + rng.below(n)
        distinct = 2 + rng.below(6)
        values = []
        for _ in range(n):
            r = rng.below(1000)
            values.append(POOL[7] if r == 0 else POOL[r % distinct])
        for tag, dtype, line in (("f32", torch.float32, lines[2 * case]), ("f64", torch.float64, lines[2 * case + 1])):
            want = [int(t) for t in line.split(":")[1].split()]
            got = torch.topk(torch.tensor(values, dtype=dtype), k).indices.tolist()
            if got != want:
                mismatches += 1
                if mismatches <= 5:
                    print(f"case {case} {tag} (n {n}, k {k}): torch {got[:12]}..., fixture {want[:12]}...")
    print(f"torch {torch.__version__}: {len(lines)} fixture rows, {mismatches} differ from torch.topk")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
