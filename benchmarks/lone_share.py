"""What one site's masked input is worth if it is ever unmasked alone (issue 19).

In a secure round each site adds a 1/T share of one discrete Laplace draw,
Z = NB(1/T, p) - NB(1/T, p) with p = exp(-1/b) and b = Delta / eps on the fixed-point grid
(docs/secure_aggregation.md, "The sampler's law"). T honest shares sum to DL(p), which is
eps-DP for a statistic of L1 sensitivity Delta. A lone share is not: for T >= 2 its law has a
spike at 0 (in the continuous limit the density of Gamma(1/T) - Gamma(1/T) is unbounded at 0
for T >= 2), so its pure epsilon grows with the grid resolution and its hockey-stick delta at
the nominal eps is large. The protocol's checks (one signed survivor set, the quorum, the
holder floor, attestations) are what keep a share from being unmasked alone; this script
states the cost when a site accepts T > 1 and those assumptions fail (more than c colluders,
a broken signature scheme).

For each T and nominal eps it computes, exactly on the grid (pmf of the difference of two
negative binomials by FFT convolution, b = Delta / eps with Delta = ``--delta-grid`` grid
units): the pure epsilon max_k |log P(Z = k) / P(Z = k + Delta)| over the support where the
pmf exceeds 1e-12, and the hockey-stick delta at the nominal eps,
sum_k max(0, P(Z = k) - e^eps P(Z = k + Delta)). T = 1 (a full draw) is the control: pure
epsilon = eps, delta = 0.

    python benchmarks/lone_share.py [--delta-grid 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from dpfed.secagg.dlaplace import nb_logpmf


def share_pmf(T: int, b: float, width: int) -> tuple[np.ndarray, int]:
    """pmf of NB(1/T, p) - NB(1/T, p) on [-width, width] (index k + width)."""
    p = math.exp(-1.0 / b)
    k = np.arange(width + 1, dtype=np.float64)
    g = np.exp(nb_logpmf(k, 1.0 / T, p))
    n = 1 << int(math.ceil(math.log2(2 * width + 2)))
    # D = G1 - G2: convolve g with g reversed.
    f1 = np.fft.rfft(g, 2 * n)
    f2 = np.fft.rfft(g[::-1], 2 * n)
    conv = np.fft.irfft(f1 * f2, 2 * n)[:2 * width + 1]
    conv = np.clip(conv, 0.0, None)
    return conv / conv.sum(), width


def lone_share_loss(T: int, epsilon: float, delta_grid: int) -> dict:
    b = delta_grid / epsilon
    width = int(60 * b) + 4 * delta_grid
    pmf, w = share_pmf(T, b, width)
    a, shifted = pmf[:-delta_grid], pmf[delta_grid:]
    mask = (a > 1e-12) & (shifted > 1e-12)
    ratio = np.log(a[mask]) - np.log(shifted[mask])
    pure = float(np.max(np.abs(ratio)))
    hockey = float(np.sum(np.maximum(0.0, a - math.exp(epsilon) * shifted)))
    return {"T": T, "epsilon": epsilon, "delta_grid": delta_grid, "b_grid": b,
            "pure_epsilon": round(pure, 3), "hockey_stick_delta": round(hockey, 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delta-grid", type=int, default=64,
                    help="sensitivity in grid units (real rounds: 2^10 and more; the pure "
                         "epsilon grows slowly with it, the delta barely moves)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [lone_share_loss(T, eps, args.delta_grid)
            for T in (1, 2, 3, 5, 10) for eps in (0.5, 1.0, 2.0)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'T':>3} {'eps':>5} {'pure eps of one share':>22} {'delta at eps':>13}")
    for r in rows:
        print(f"{r['T']:>3} {r['epsilon']:>5} {r['pure_epsilon']:>22} "
              f"{r['hockey_stick_delta']:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
