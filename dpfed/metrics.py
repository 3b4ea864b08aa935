"""Accuracy measures of drug-response predictions (paper section 4.5).

``spearman`` is the paper's main metric: rank correlation between predicted and measured
ln IC50 on held-out lines. ``wpc_index`` is the weighted probabilistic c-index of the DREAM 7
drug-sensitivity challenge (Costello et al. 2014), the paper's second metric, in its
deterministic form (the fraction of correctly ordered pairs, weighted by measurement gap).
"""

from __future__ import annotations

import numpy as np


def _paired(predicted, measured) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predicted, dtype=np.float64).ravel()
    m = np.asarray(measured, dtype=np.float64).ravel()
    if p.shape != m.shape:
        raise ValueError(f"{p.size} predictions for {m.size} measurements")
    return p, m


def spearman(predicted, measured) -> float:
    """Spearman rank correlation; NaN when either side is constant or has < 2 values.

    NaN rather than 0 for a constant prediction, so an average over repeats can tell "no
    ranking" from "no correlation"; callers report it as such.
    """
    from scipy.stats import spearmanr

    p, m = _paired(predicted, measured)
    if p.size < 2 or np.all(p == p[0]) or np.all(m == m[0]):
        return float("nan")
    return float(spearmanr(p, m).statistic)


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
