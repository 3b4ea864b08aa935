"""The published results of Honkela et al. (2018) (method.md section 5) as data.

Mean Spearman correlation on GDSC (d = 10 RMA expression genes, 10 non-private lines, averaged
over 265 drugs x 50 Monte Carlo repeats) by private training-set size n. The paper's features
were gene expression; ours are binary mutation / tissue features of GDSC v17 (data README), so
absolute values differ and the comparison that carries over is relative (private vs
non-private at the same n, growth with n).
"""

from __future__ import annotations

SIZES = (0, 100, 200, 300, 400, 500, 600, 700, 800)

#: (method, epsilon or None) -> means at SIZES.
PUBLISHED = {
    ("robust_private", 2.0): (0.091, 0.089, 0.136, 0.166, 0.182, 0.195, 0.203, 0.211, 0.215),
    ("robust_private", 1.0): (0.091, 0.051, 0.089, 0.119, 0.139, 0.156, 0.166, 0.178, 0.183),
    ("nonprivate", None): (0.091, 0.197, 0.219, 0.233, 0.240, 0.244, 0.247, 0.250, 0.251),
    ("nonprivate_robust", None): (0.091, 0.184, 0.202, 0.217, 0.222, 0.227, 0.230, 0.233, 0.235),
}

#: Earlier private methods at eps = 2, n = 800 (approximate, read from the paper's text).
PUBLISHED_EPS2_N800 = {"private_unclipped": 0.00, "functional_mechanism": 0.01,
                       "output_perturbation": 0.076}

#: Ratio private / non-private at n = 800 as stated in the paper.
PUBLISHED_RATIO_N800 = {2.0: 0.86, 1.0: 0.73}


def published_value(method: str, epsilon: float | None, n: int) -> float | None:
    """The published mean for a cell, or None if the paper does not report it."""
    values = PUBLISHED.get((method, None if method.startswith("nonprivate") else epsilon))
    if values is None or n not in SIZES:
        return None
    return values[SIZES.index(n)]
