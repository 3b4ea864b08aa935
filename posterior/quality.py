"""How much the private statistics told us beyond the public rows (pure functions).

Issue 9: every result says how much the private releases moved the posterior away from the
public-only one, and warns in plain words when they carried little information.

Coefficients are not comparable between the two fits: the private statistics are of
*clipped* rows, the public ones are not, so the round's coefficients live on another scale.
The comparison is therefore made on predictions for rows like the public ones, through their
second-moment matrix M (public Sxx / n_public; the identity without public rows), with scale
free quantities:

- ``snr``: signal-to-noise of the linear predictor, sqrt(mu^T M mu / tr(Sigma M)) (mu, Sigma
  the posterior mean and covariance of beta): how far the predictions stand out from their
  own posterior uncertainty. 1 means as much uncertainty as signal.
- ``agreement``: correlation of the two fits' mean predictions over such rows,
  mu_r^T M mu_p / sqrt(mu_r^T M mu_r mu_p^T M mu_p); 1 means the private data did not move
  the ranking of the predictions, near 0 that they changed it completely.

Verdict: ``little`` when the round's snr is below 1 or less than 1.25 times the public-only
snr; ``substantial`` when it is at least 2 and at least twice the public-only one; ``some``
otherwise.
"""

from __future__ import annotations

import numpy as np

__all__ = ["information_statement", "prediction_snr"]


def prediction_snr(draws: np.ndarray, m: np.ndarray) -> float:
    """sqrt(mu^T M mu / tr(Sigma M)) of beta draws (module docstring)."""
    mu = draws.mean(axis=0)
    cov = np.atleast_2d(np.cov(draws, rowvar=False))
    noise = float(np.sum(cov * m))
    return float(np.sqrt(max(float(mu @ m @ mu), 0.0) / noise)) if noise > 0 else float("inf")


def information_statement(round_draws: np.ndarray, public_draws: np.ndarray,
                          m: np.ndarray | None = None, *,
                          reference: str = "the public rows alone") -> dict:
    """The comparison of the module docstring; ``reference`` names the baseline in the text."""
    a = np.asarray(round_draws, dtype=np.float64)
    b = np.asarray(public_draws, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 3:
        raise ValueError("need two sets of at least 3 draws of the same dimension")
    d = a.shape[1]
    m = np.eye(d) if m is None else np.asarray(m, dtype=np.float64)
    snr_r, snr_p = prediction_snr(a, m), prediction_snr(b, m)
    mu_r, mu_p = a.mean(axis=0), b.mean(axis=0)
    denom = float(np.sqrt(max(mu_r @ m @ mu_r, 0.0) * max(mu_p @ m @ mu_p, 0.0)))
    agreement = float(mu_r @ m @ mu_p / denom) if denom > 0 else float("nan")
    ratio = snr_r / snr_p if snr_p > 0 else float("inf")
    numbers = (f"signal-to-noise of predictions {snr_r:.2f} against {snr_p:.2f} from "
               f"{reference}; agreement with that model {agreement:.2f}")
    if snr_r < 1.0 or ratio < 1.25:
        verdict = "little"
        text = (f"The private statistics carried little information: {numbers}. Do not read "
                f"more into the result than into {reference}.")
    elif snr_r >= 2.0 and ratio >= 2.0:
        verdict = "substantial"
        text = f"The private statistics added substantial information: {numbers}."
    else:
        verdict = "some"
        text = f"The private statistics added some information: {numbers}."
    return {"verdict": verdict, "snr": snr_r, "snr_reference": snr_p, "agreement": agreement,
            "reference": reference, "text": text}
