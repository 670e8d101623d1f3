#!/usr/bin/env python3
"""Torch's CPU RNG, as DiffusionGemma's sampler uses it, reimplemented in numpy and checked bit for bit.

    python tools/diffusion_gemma/check_torch_rng.py [--golden KIT/tiny-dg-A/golden.json] [--case NAME] [--out KIT/torch_rng.json]

What is reimplemented (torch 2.15.0, CPU generator, checked here against torch on random inputs):
- torch.manual_seed(s): MT19937 initialised with init_genrand(s mod 2^32) (only the low 32 bits of the seed count,
  so 2**32 + 5 gives the stream of 5 and 2**63 + 1 the stream of 1).
- random() = one tempered MT19937 output (u32); random64() = (first u32 << 32) | second u32.
- torch.randint(low, high, size) (int64): element by element in row-major order, low + random() % (high - low)
  while high - low < 2^28, else low + random64() % (high - low) (the threshold is 2^28, not 2^32).
- torch.multinomial(p, 1) for a float32 [rows, n] p (the published code's only use): q = empty_like(p).exponential_(1)
  row-major, each q = float32(-log1p(-u)) with u = (random64() & (2^53 - 1)) * 2^-53 computed in double, then
  r = p / q in float32 and the pick is argmax(r) per row (the first index on ties). 2 u32 per element of p, all
  rows and all columns, whatever p holds.
Then one golden case is replayed through the published generate with the numpy reimplementation run beside
every torch.randint / torch.multinomial call (same inputs, results compared), and its output_ids compared with
the golden. Test vectors for other implementations are written to torch_rng.json.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dg_common as C  # noqa: E402

MASK32 = 0xFFFFFFFF


class MT19937:
    """Standard MT19937 (as std::mt19937 and at::mt19937), vectorised twist."""

    def __init__(self, seed):
        s = seed & MASK32
        mt = [s]
        for i in range(1, 624):
            mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & MASK32)
        self.mt = np.array(mt, dtype=np.uint32)
        self.buf = np.empty(0, dtype=np.uint32)

    def _twist(self):
        mt = self.mt.astype(np.uint64)
        new = mt.copy()

        def step(lo, hi):
            i = np.arange(lo, hi)
            nxt = np.where(i + 1 < 624, new[(i + 1) % 624], new[0]) if hi == 624 else mt[i + 1]
            y = (new[i] & 0x80000000) | (nxt & 0x7FFFFFFF)
            new[i] = new[(i + 397) % 624] ^ (y >> 1) ^ np.where(y & 1, 0x9908B0DF, 0).astype(np.uint64)

        step(0, 227)  # uses the old mt[i + 397]
        step(227, 454)  # mt[i - 227]: the new values of the first block
        step(454, 623)
        step(623, 624)  # its "next" is the new mt[0]
        self.mt = new.astype(np.uint32)
        y = self.mt.astype(np.uint64)
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return (y & MASK32).astype(np.uint32)

    def u32(self, n):
        while self.buf.size < n:
            self.buf = np.concatenate([self.buf, self._twist()])
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def u64(self, n):
        a = self.u32(2 * n).astype(np.uint64)
        return (a[0::2] << np.uint64(32)) | a[1::2]

    def randint(self, low, high, n):
        r = high - low
        if r < 2**28:
            return (self.u32(n).astype(np.int64) % r) + low
        return ((self.u64(n) % np.uint64(r)).astype(np.int64)) + low

    def exponential_f32(self, n):
        u = (self.u64(n) & np.uint64(2**53 - 1)).astype(np.float64) * 2.0**-53
        return (-np.log1p(-u)).astype(np.float32)

    def multinomial1(self, p):
        p = np.asarray(p, dtype=np.float32)
        q = self.exponential_f32(p.size).reshape(p.shape)
        r = p / q  # float32 division
        return np.argmax(r, axis=-1), q


def f32_hex(x):
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


def check_random(seeds, rng):
    """Random checks against torch: raw outputs, randint ranges, exponential_, multinomial."""
    for seed in seeds:
        torch.manual_seed(seed)
        mt = MT19937(seed)
        for _ in range(3):
            n = int(rng.integers(1, 3000))
            t = torch.randint(0, 2**28 - 1, (n,)).numpy()
            ours = mt.u32(n).astype(np.int64) % (2**28 - 1)
            assert np.array_equal(t, ours), ("raw", seed)
        for V in (2, 320, 262144, 2**27 + 5, 2**28 - 1, 2**28, 2**28 + 1, 2**30, 2**31 + 11, 2**32 - 1, 2**32, 2**33 + 3):
            low = int(rng.integers(-5, 5))
            n = int(rng.integers(1, 700))
            t = torch.randint(low, low + V, (n,)).numpy()
            assert np.array_equal(t, mt.randint(low, low + V, n)), ("randint", seed, V)
            t2 = torch.randint(low, low + V, (2, 3)).numpy().ravel()
            assert np.array_equal(t2, mt.randint(low, low + V, 6)), ("randint 2d", seed, V)
        n = int(rng.integers(1, 5000))
        t = torch.empty(n, dtype=torch.float32).exponential_(1).numpy()
        assert np.array_equal(t.view(np.uint32), mt.exponential_f32(n).view(np.uint32)), ("exponential", seed)
        for _ in range(20):
            rows, cols = int(rng.integers(1, 20)), int(rng.integers(1, 400))
            kind = rng.integers(0, 4)
            if kind == 0:
                p = rng.random((rows, cols))
            elif kind == 1:
                p = np.exp(rng.normal(0, 4, (rows, cols)))
            elif kind == 2:
                p = np.ones((rows, cols))  # all ties in p
            else:
                p = (rng.random((rows, cols)) < 0.3) * rng.random((rows, cols))  # zeros
                p[:, 0] += 1e-3
            pt = torch.softmax(torch.log(torch.tensor(p, dtype=torch.float32)), dim=-1) if kind != 3 else torch.tensor(p, dtype=torch.float32)
            t = torch.multinomial(pt, 1).numpy()[:, 0]
            ours, _ = mt.multinomial1(pt.numpy())
            assert np.array_equal(t, ours), ("multinomial", seed, kind)
        # the stream position agrees after all of that
        assert torch.randint(0, 1000, (1,)).item() == int(mt.u32(1)[0]) % 1000
    return True


def replay_case(golden_path, name):
    """Replays one golden case through the published generate with the numpy RNG beside torch's."""
    import make_golden as G

    golden = json.load(open(golden_path))
    case = next(c for c in golden["cases"] if c["name"] == name)
    _, _, generation = C.published()
    model = C.load_model(os.path.join(C.REPO, golden["checkpoint"]))
    mt = MT19937(case["seed"])
    real_randint, real_mn = torch.randint, torch.multinomial
    counts = {"randint": 0, "multinomial": 0, "rows": 0}

    def randint(*a, **k):
        out = real_randint(*a, **k)
        ours = mt.randint(k["low"], k["high"], out.numel()).reshape(tuple(out.shape))
        assert np.array_equal(out.numpy(), ours), "randint differs"
        counts["randint"] += 1
        return out

    def multinomial(p, num_samples, *a, **k):
        out = real_mn(p, num_samples, *a, **k)
        ours, _ = mt.multinomial1(p.numpy())
        assert np.array_equal(out.numpy()[:, 0], ours), "multinomial differs"
        counts["multinomial"] += 1
        counts["rows"] += p.shape[0]
        return out

    torch.randint, torch.multinomial = randint, multinomial
    try:
        out, _, _, _ = G.run_case(model, generation, case["prompt_ids"], case["seed"], case["settings"], instrument=False)
    finally:
        torch.randint, torch.multinomial = real_randint, real_mn
    assert out == case["output_ids"], "replayed output differs from the golden"
    expected = case["random_calls"]
    assert counts["randint"] == expected.count("R") and counts["multinomial"] == expected.count("M")
    return dict(case=name, randint_calls=counts["randint"], multinomial_calls=counts["multinomial"],
                multinomial_rows=counts["rows"], u32=case["mt_u32_consumed"])


def temperature_f32(t_min, t_max, cur, n):
    """The published LinearTemperatureScheduleLogitsProcessor with cur_step a 0-dim int32 tensor: cur / n is a
    float32 tensor; t_max - t_min is a Python (double) difference, rounded to float32 when it multiplies the tensor;
    every operation rounds to float32."""
    f = np.float32
    return f(f(t_min) + f(f(t_max - t_min) * f(f(cur) / f(n))))


def check_temperature(rng):
    _, _, gen = C.published()
    for t_min, t_max in ((0.4, 0.8), (0.2, 1.0), (0.1, 0.7), (0.33, 0.97)):
        for n in (1, 3, 4, 7, 8, 16, 48, 100):
            proc = gen.LinearTemperatureScheduleLogitsProcessor(t_min, t_max, n)
            for cur in range(1, n + 1):
                scores = torch.from_numpy(rng.normal(0, 5, (1, 4, 50)).astype(np.float32))
                out = proc(None, scores, torch.tensor(cur, dtype=torch.int32)).numpy()
                t = temperature_f32(t_min, t_max, cur, n)
                assert np.array_equal(out, scores.numpy() / t), (t_min, t_max, n, cur)  # true float32 division
    return True


PROB_VECTORS = [
    [0.1, 0.2, 0.3, 0.4],
    [0.25, 0.25, 0.25, 0.25],
    [0.5, 0.0, 0.5],
    [0.9, 0.05, 0.03, 0.02],
    [1e-6, 0.999999, 0.0, 1e-7, 3e-8],
]


def vectors(seeds):
    out = []
    for seed in seeds:
        mt = MT19937(seed)
        torch.manual_seed(seed)
        first = mt.u32(16)
        t = torch.randint(0, 2**28 - 1, (16,)).numpy()  # raw outputs are not observable directly; u32 % (2^28 - 1)
        assert np.array_equal(t, first.astype(np.int64) % (2**28 - 1))
        entry = dict(seed=str(seed), seed_mod_2_32=seed & MASK32, first_u32=[int(v) for v in first], randint=[], multinomial=[])
        for V in (320, 262144, 2**28 - 1, 2**28, 2**30, 2**33):
            mt = MT19937(seed)
            torch.manual_seed(seed)
            t = torch.randint(0, V, (16,)).numpy()
            ours = mt.randint(0, V, 16)
            assert np.array_equal(t, ours)
            entry["randint"].append(dict(call=f"torch.randint(0, {V}, (16,)) right after torch.manual_seed(seed)", high=V,
                                         values=[int(v) for v in ours], u32_per_value=1 if V < 2**28 else 2))
        mt = MT19937(seed)
        torch.manual_seed(seed)
        for p in PROB_VECTORS:
            p32 = np.array([p, p[::-1]], dtype=np.float32)  # two rows: the vector and its reverse
            t = torch.multinomial(torch.from_numpy(p32), 1).numpy()[:, 0]
            ours, q = mt.multinomial1(p32)
            assert np.array_equal(t, ours)
            entry["multinomial"].append(dict(
                probs_f32_hex=[[f32_hex(v) for v in row] for row in p32],
                probs_decimal=[[repr(float(v)) for v in row] for row in p32],
                q_f32_hex=[[f32_hex(v) for v in row] for row in q],
                picks=[int(v) for v in ours],
            ))
        out.append(entry)
    return out


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--golden", default=os.path.join(C.CKPT_F32, "golden.json"))
    a.add_argument("--case", default="steps48_new48_p3")
    a.add_argument("--out", default=os.path.join(C.KIT, "torch_rng.json"))
    args = a.parse_args()
    torch.set_num_threads(1)
    tv, pv = C.check_versions()
    mt = MT19937(5489)
    assert int(mt.u32(1)[0]) == 3499211612  # std::mt19937 default seed, first output
    seeds = [0, 1, 5, 42, 2**32 + 5, 2**63 + 1, 123456789]
    check_random(seeds, np.random.default_rng(0))
    print("numpy MT19937 / randint / exponential_ / multinomial reproduce torch on random inputs")
    check_temperature(np.random.default_rng(1))
    print("temperature = f32(t_min) + f32(f32(t_max - t_min) * f32(f32(cur) / f32(N))); logits / temperature in float32")
    temps = {}
    for t_min, t_max, n in ((0.4, 0.8, 1), (0.4, 0.8, 4), (0.4, 0.8, 8), (0.4, 0.8, 16), (0.4, 0.8, 48), (0.2, 1.0, 48)):
        temps[f"{t_min},{t_max},{n}"] = [f32_hex(temperature_f32(t_min, t_max, cur, n)) for cur in range(n, 0, -1)]
    replay = replay_case(args.golden, args.case)
    print(f"replayed golden case {replay}: every call and the output identical")
    vec_seeds = [0, 42, 2**32 + 5, 2**63 + 1]
    data = dict(
        torch_version=pv,
        transformers_version=tv,
        notes=[
            "CPU generator of torch 2.15.0. torch.manual_seed(seed) = MT19937 init_genrand(seed mod 2^32) "
            "(seed is a decimal string: 2**63+1 does not fit every JSON reader).",
            "first_u32: the first 16 tempered MT19937 outputs (random()). random64() = (first << 32) | second.",
            "randint: torch.randint(0, high, (16,)) (int64) right after torch.manual_seed(seed): values[i] = "
            "random() % high for high < 2^28 (1 u32 each), random64() % high for high >= 2^28 (2 u32 each; "
            "the threshold is 2^28, not 2^32).",
            "multinomial: right after torch.manual_seed(seed), torch.multinomial(P, 1) is called once per entry in order "
            "(the stream continues from one call to the next); P is float32 [2, n] (a vector and its reverse) given "
            "as IEEE-754 bit patterns (probs_f32_hex) and as the decimal of the float32 value. q (float32, row-major) "
            "= float32(-log1p(-u)), u = (random64() & (2^53-1)) * 2^-53 in double; picks[row] = first argmax of "
            "float32(P / q). Every element costs 2 u32 (zeros included). q_f32_hex is given for debugging.",
            "temperatures_f32_hex['t_min,t_max,N']: the temperature of denoising steps 1..N in the order they run "
            "(cur_step = N, N-1, ..., 1), float32 bit patterns: f32(t_min) + f32(f32(t_max - t_min) * f32(f32(cur_step) "
            "/ f32(N))), t_max - t_min taken in double first; the processed logits are logits / temperature (float32 "
            "division, not a multiplication by the reciprocal).",
        ],
        golden_replay=replay,
        temperatures_f32_hex=temps,
        seeds=vectors(vec_seeds),
    )
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
