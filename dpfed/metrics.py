"""Accuracy measures of drug-response predictions (paper section 4.5), in numpy alone.

``spearman`` is the paper's main metric: rank correlation between predicted and measured
ln IC50 on held-out lines, the Pearson correlation of average ranks (ties get the mean of the
ranks they span, as ``scipy.stats.spearmanr``), NaN when either side is constant. It is the one
definition of Spearman in dpfed; the two scorers below compute the same value faster when one
set of test responses is scored against many predictions:

- ``TestRanks(measured).spearman(predicted)``: the responses ranked once (the evaluation
  protocol scores ~140 cells per repeat: ~20 us each instead of scipy's ~0.45 ms);
- ``LinearTestRanks(x_test, measured).spearman(betas)``: predictions ``x_test @ beta`` for a
  whole batch of coefficient vectors, identical test rows predicted once and their tied
  predictions given the mean of their ranks (``dpfed.bounds``' search, ``dpfed plan``).

``wpc_index`` is the weighted probabilistic c-index of the DREAM 7 drug-sensitivity challenge
(Costello et al. 2014), the paper's second metric, in its deterministic form (the fraction of
correctly ordered pairs, weighted by measurement gap).
"""

from __future__ import annotations

import numpy as np

__all__ = ["average_ranks", "group_ranks", "spearman", "TestRanks", "LinearTestRanks",
           "concordance_index", "wpc_index"]


def _paired(predicted, measured) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predicted, dtype=np.float64).ravel()
    m = np.asarray(measured, dtype=np.float64).ravel()
    if p.shape != m.shape:
        raise ValueError(f"{p.size} predictions for {m.size} measurements")
    return p, m


def average_ranks(values) -> np.ndarray:
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


def group_ranks(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Average ranks (1-based) of groups of test points along the last axis: ``values[..., u]``
    is the prediction shared by the ``counts[u]`` test points of group u, so each group's points
    get the mean of the ranks they span; groups with equal values share the mean of the ranks
    they span together (e.g. beta = 0 predicts every group alike)."""
    order = np.argsort(values, axis=-1)
    v_sorted = np.take_along_axis(values, order, axis=-1)
    c_sorted = counts[order]
    end = np.cumsum(c_sorted, axis=-1)                     # rank of a group's last point
    first = np.ones(v_sorted.shape, dtype=bool)            # first group of a run of equal values
    first[..., 1:] = v_sorted[..., 1:] != v_sorted[..., :-1]
    last = np.ones(v_sorted.shape, dtype=bool)
    last[..., :-1] = first[..., 1:]
    # Ranks before the run and the run's last rank, carried to every group of the run.
    before = np.maximum.accumulate(np.where(first, end - c_sorted, 0), axis=-1)
    run_end = np.flip(np.minimum.accumulate(np.flip(np.where(last, end, end[..., -1:]), -1),
                                            axis=-1), -1)
    avg_sorted = (before + run_end + 1) / 2.0
    out = np.empty_like(avg_sorted)
    np.put_along_axis(out, order, avg_sorted, axis=-1)
    return out


def spearman(predicted, measured) -> float:
    """Spearman rank correlation; NaN when either side is constant, has < 2 values or a NaN.

    NaN rather than 0 for a constant prediction, so an average over repeats can tell "no
    ranking" from "no correlation"; callers report it as such.
    """
    p, m = _paired(predicted, measured)
    if np.isnan(p).any() or np.isnan(m).any():
        return float("nan")
    return TestRanks(m).spearman(p)


class TestRanks:
    """The centred ranks of one set of measured test responses, to score many predictions."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, measured):
        m = np.asarray(measured, dtype=np.float64).ravel()
        self.size = m.size
        r = average_ranks(m)
        self._centred = r - r.mean() if m.size else r
        self._norm = float(np.sqrt(self._centred @ self._centred))
        self._constant = m.size < 2 or bool(np.all(m == m[0]))

    def spearman(self, predicted) -> float:
        """Spearman correlation of ``predicted`` with the measured responses; NaN when either
        side is constant."""
        p = np.asarray(predicted, dtype=np.float64).ravel()
        if p.size != self.size:
            raise ValueError(f"{p.size} predictions for {self.size} measurements")
        if self._constant or np.all(p == p[0]):
            return float("nan")
        r = average_ranks(p)
        r -= r.mean()
        return float((r @ self._centred) / (np.sqrt(r @ r) * self._norm))


class LinearTestRanks(TestRanks):
    """Spearman of many linear predictions ``x_test @ beta`` against the measured responses,
    ties handled exactly: the distinct test rows are predicted once, and the test points of one
    row share the mean of the ranks they span."""

    def __init__(self, x_test, measured):
        super().__init__(measured)
        self.rows, inverse, self.counts = np.unique(np.asarray(x_test), axis=0,
                                                    return_inverse=True, return_counts=True)
        inverse = np.asarray(inverse).ravel()
        if inverse.size != self.size:
            raise ValueError(f"{inverse.size} test rows for {self.size} measurements")
        self._centred_group = np.bincount(inverse, weights=self._centred,
                                          minlength=self.counts.size)
        self._mean_rank = (self.size + 1) / 2.0

    def spearman_many(self, beta: np.ndarray, *, constant: float = float("nan")) -> np.ndarray:
        """beta (..., d) -> Spearman (...). ``constant``: the value where a prediction is
        constant (every test row predicted alike, e.g. beta = 0): NaN by default, as
        ``spearman``; a search that averages scores over noise draws passes 0.0 ("no
        ranking" scores as no correlation instead of dropping out of the mean)."""
        pred = np.asarray(beta) @ self.rows.T                                  # (..., U)
        g = group_ranks(pred, self.counts) - self._mean_rank
        num = g @ self._centred_group
        den = np.sqrt((g * g) @ self.counts) * self._norm
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, constant)


def concordance_index(predicted, measured, weights=None) -> float:
    """Fraction of pairs (i, j) with measured_i != measured_j that the prediction orders the
    same way (a tie in the prediction counts one half), optionally weighted per pair by
    ``weights(|measured_i - measured_j|)``. 0.5 is chance, 1 perfect."""
    p, m = _paired(predicted, measured)
    i, j = np.triu_indices(p.size, k=1)
    dm = m[i] - m[j]
    dp = p[i] - p[j]
    valid = dm != 0
    if not np.any(valid):
        return float("nan")
    dm, dp = dm[valid], dp[valid]
    score = np.where(dp == 0, 0.5, (np.sign(dp) == np.sign(dm)).astype(np.float64))
    w = np.ones_like(dm) if weights is None else np.asarray(weights(np.abs(dm)), dtype=np.float64)
    return float(np.sum(w * score) / np.sum(w))


def wpc_index(predicted, measured) -> float:
    """Concordance index weighting each pair by its measured gap, so that getting the order of
    very different responses right counts more than of near-equal ones (the idea of the
    DREAM wpc-index, without its probabilistic noise model)."""
    return concordance_index(predicted, measured, weights=lambda gap: gap)
