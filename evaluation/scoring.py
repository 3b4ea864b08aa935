"""Spearman correlation of many predictions against one repeat's test responses (paper
section 4.5's metric; method.md section 5).

Same value as ``dpfed.metrics.spearman`` (Pearson correlation of average ranks, ties averaged,
NaN for a constant side), but the test responses are ranked once per repeat instead of once
per cell, and the predictions are ranked with one argsort. A repeat scores ~140 cells;
scipy's ``spearmanr`` (input checks, two ``rankdata`` calls, a p-value) costs ~0.45 ms each,
this ~20 us. ``tests/evaluation/test_scoring.py`` checks equality with ``dpfed.metrics``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["average_ranks", "TestRanks"]


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``values`` (1-D), tied values getting the mean of their ranks
    (``scipy.stats.rankdata(method="average")``)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    n = a.size
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    first = np.empty(n, dtype=bool)
    first[:1] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    group = np.cumsum(first) - 1                        # tie group of each sorted position
    bounds = np.flatnonzero(np.append(first, True))     # group starts, then n
    mean_rank = (bounds[:-1] + bounds[1:] + 1) / 2.0    # mean of ranks start+1 .. end
    ranks = np.empty(n)
    ranks[order] = mean_rank[group]
    return ranks


class TestRanks:
    """The centred ranks of one repeat's measured test responses, to score predictions."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, measured):
        m = np.asarray(measured, dtype=np.float64).ravel()
        self.size = m.size
        r = average_ranks(m)
        self._centred = r - r.mean()
        self._norm = float(np.sqrt(self._centred @ self._centred))
        self._constant = m.size < 2 or bool(np.all(m == m[0]))

    def spearman(self, predicted) -> float:
        """Spearman correlation of ``predicted`` with the measured responses; NaN when either
        side is constant (as ``dpfed.metrics.spearman``)."""
        p = np.asarray(predicted, dtype=np.float64).ravel()
        if p.size != self.size:
            raise ValueError(f"{p.size} predictions for {self.size} measurements")
        if self._constant or np.all(p == p[0]):
            return float("nan")
        r = average_ranks(p)
        r -= r.mean()
        return float((r @ self._centred) / (np.sqrt(r @ r) * self._norm))
