"""How much the private statistics moved the posterior away from the public-only one.

Issue 9: every result says how much the private releases told us, and warns in plain words
when they told us little. The comparison is between the posterior of the round (public rows
plus the private releases) and the posterior of the public rows alone (or the prior when
there are none), both of beta, from their draws (pure function):

- ``sd_ratio``: geometric mean over coefficients of sd(round) / sd(public only); 1 means the
  private data narrowed nothing, 0.5 that they halved the uncertainty;
- ``shift_sd``: root mean square over coefficients of the move of the posterior mean, in
  public-only posterior sds;
- ``information_bits``: half the log2 ratio of the determinants of the two posterior
  covariances (the volume by which the private data shrank the posterior, in bits).

Verdict: ``little`` when sd_ratio > 1 (the round is *less* certain than the public rows
alone: noisy or conflicting private statistics) or when sd_ratio > 0.8 and shift_sd < 0.5
(the private statistics narrowed the intervals by less than a fifth and moved them by less
than half a public-only sd);
``some`` when sd_ratio > 0.5; otherwise ``substantial``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["information_statement", "LITTLE_SD_RATIO", "LITTLE_SHIFT"]

LITTLE_SD_RATIO = 0.8
LITTLE_SHIFT = 0.5
SOME_SD_RATIO = 0.5


def _logdet_cov(draws: np.ndarray) -> float:
    cov = np.atleast_2d(np.cov(draws, rowvar=False))
    sign, val = np.linalg.slogdet(cov)
    return float(val) if sign > 0 else float("nan")


def information_statement(round_draws: np.ndarray, public_draws: np.ndarray, *,
                          reference: str = "the public rows alone") -> dict:
    """The comparison of the module docstring; ``reference`` names the baseline in the text."""
    a = np.asarray(round_draws, dtype=np.float64)
    b = np.asarray(public_draws, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 3:
        raise ValueError("need two sets of at least 3 draws of the same dimension")
    sd_a, sd_b = a.std(axis=0), b.std(axis=0)
    ok = (sd_a > 0) & (sd_b > 0)
    sd_ratio = float(np.exp(np.mean(np.log(sd_a[ok] / sd_b[ok])))) if ok.any() else float("nan")
    shift = float(np.sqrt(np.mean(((a.mean(axis=0) - b.mean(axis=0))[ok] / sd_b[ok]) ** 2))) \
        if ok.any() else float("nan")
    bits = 0.5 * (_logdet_cov(b) - _logdet_cov(a)) / np.log(2.0)
    change = (f"intervals {100 * (1 - sd_ratio):.0f} % narrower" if sd_ratio <= 1 else
              f"intervals {100 * (sd_ratio - 1):.0f} % WIDER (the private statistics are noisy "
              f"or disagree with {reference})")
    if sd_ratio > 1:
        verdict = "little"
        text = (f"The private statistics did not make the result more certain than "
                f"{reference}: {change}; means moved {shift:.2f} sd. Treat it with caution.")
    elif sd_ratio > LITTLE_SD_RATIO and shift < LITTLE_SHIFT:
        verdict = "little"
        text = (f"The private statistics carried little information: the result is close to "
                f"what {reference} give ({change}, means moved {shift:.2f} sd). Do not read "
                f"more into it than into "
                f"{reference}.")
    elif sd_ratio > SOME_SD_RATIO:
        verdict = "some"
        text = (f"The private statistics added some information beyond {reference}: "
                f"{change}, means moved {shift:.2f} sd.")
    else:
        verdict = "substantial"
        text = (f"The private statistics added substantial information beyond {reference}: "
                f"{change}, means moved {shift:.2f} sd.")
    return {"verdict": verdict, "sd_ratio": sd_ratio, "shift_sd": shift,
            "information_bits": float(bits), "reference": reference, "text": text}
