#!/usr/bin/env python3
"""Fits a Snapdragon target's `npu_timing` to QNN's own performance model.

QNN's estimate of an executable (`lladac compile --npu-estimate-soc ID`, recorded in the
artifact) is modelled as the cost model's roofline times `roofline_scale` plus `op_seconds`
per planned op: a least-squares fit of the relative errors over every graph given.

    tools/qnn/fit_timing.py POINTS.json
    # POINTS.json: [{"qnn_seconds": ..., "roofline_seconds": ..., "ops": ...}, ...]
    # (`lladac inspect FILE --estimate --json`: estimate.qnn_estimates' qnn_seconds,
    #  cost_model_seconds and ops for built artifacts; estimate.passes' npu_roofline_seconds
    #  and ops for the same plan built --host-only.)

Prints the fit and each point's fitted / QNN ratio. Plain Python, no packages.
"""
import json
import sys


def fit(points):
    # Minimise sum(((a*r + b*o) / q - 1)^2): linear least squares in (a, b) with rows
    # (r/q, o/q) and target 1.
    s_rr = s_ro = s_oo = s_r = s_o = 0.0
    for p in points:
        r, o = p["roofline_seconds"] / p["qnn_seconds"], p["ops"] / p["qnn_seconds"]
        s_rr, s_ro, s_oo, s_r, s_o = s_rr + r * r, s_ro + r * o, s_oo + o * o, s_r + r, s_o + o
    det = s_rr * s_oo - s_ro * s_ro
    if det == 0:
        sys.exit("fit_timing.py: the points do not determine a fit (one point, or all alike)")
    return (s_r * s_oo - s_o * s_ro) / det, (s_rr * s_o - s_ro * s_r) / det


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    points = json.load(open(sys.argv[1]))
    if not isinstance(points, list) or any(not all(k in p for k in ("qnn_seconds", "roofline_seconds", "ops")) for p in points):
        sys.exit(f"{sys.argv[1]}: expected a list of objects with qnn_seconds, roofline_seconds and ops")
    a, b = fit(points)
    print(json.dumps({"roofline_scale": round(a, 3), "op_seconds": float(f"{b:.3g}")}))
    for p in points:
        fitted = a * p["roofline_seconds"] + b * p["ops"]
        print(f"  {p.get('name', '?'):>24}: QNN {p['qnn_seconds'] * 1e6:10.0f} us, roofline {p['roofline_seconds'] * 1e6:10.0f} us, fitted / QNN {fitted / p['qnn_seconds']:.2f}")


if __name__ == "__main__":
    main()
