"""Convergence and efficiency of several MCMC chains (pure functions): the multi-chain
effective sample size and split-chain r-hat, as Stan computes them (Vehtari, Gelman,
Simpson, Carpenter & Buerkner, *Rank-normalization, folding, and localization: an improved
R-hat for assessing convergence of MCMC*, Bayesian Analysis 16, 2021; Geyer 1992 for the
initial monotone sequence). Written in numpy so that the default fit imports no ArviZ.
"""

from __future__ import annotations

import numpy as np

__all__ = ["effective_sample_size", "split_rhat"]


def _autocovariance(x: np.ndarray) -> np.ndarray:
    """Autocovariance along axis 0 of x (n, chains, k), per chain, by FFT."""
    n = x.shape[0]
    size = 1 << int(np.ceil(np.log2(2 * n)))
    xc = x - x.mean(axis=0)
    f = np.fft.rfft(xc, n=size, axis=0)
    acov = np.fft.irfft(f * np.conj(f), n=size, axis=0)[:n]
    return acov / n


def effective_sample_size(samples: np.ndarray) -> np.ndarray:
    """Multi-chain effective sample size per coordinate of ``samples`` (n, chains, k): the
    autocorrelations combined over chains with the between-chain variance, summed with
    Geyer's initial positive and monotone sequence (Stan's estimator; Vehtari et al. 2021)."""
    n, m, k = samples.shape
    if n < 4:
        return np.full(k, float(n * m))
    acov = _autocovariance(samples)                      # (n, m, k)
    chain_mean = samples.mean(axis=0)                    # (m, k)
    chain_var = acov[0] * n / (n - 1.0)
    w = chain_var.mean(axis=0)
    b_over_n = chain_mean.var(axis=0, ddof=1) if m > 1 else np.zeros(k)
    var_plus = w * (n - 1.0) / n + b_over_n
    var_plus = np.where(var_plus > 0, var_plus, np.inf)
    rho = 1.0 - (w - acov.mean(axis=1)) / var_plus       # (n, k)
    rho[0] = 1.0
    ess = np.empty(k)
    for j in range(k):
        r = rho[:, j]
        # Geyer: sums of adjacent pairs, truncated at the first negative pair, made monotone.
        pairs = r[:-1:2] + r[1::2]
        stop = np.argmax(pairs < 0) if np.any(pairs < 0) else pairs.size
        p = np.minimum.accumulate(pairs[:stop]) if stop > 0 else np.zeros(0)
        tau = -1.0 + 2.0 * float(np.sum(p))
        tau = max(tau, 1.0 / np.log10(max(n * m, 10)))
        ess[j] = n * m / tau
    return ess


def split_rhat(samples: np.ndarray) -> np.ndarray:
    """Split-chain potential scale reduction per coordinate (Gelman et al., BDA3 11.4)."""
    n = samples.shape[0] // 2
    if n < 2:
        return np.full(samples.shape[2], np.nan)
    halves = np.concatenate([samples[:n], samples[-n:]], axis=1)   # (n, 2m, k)
    means = halves.mean(axis=0)
    w = halves.var(axis=0, ddof=1).mean(axis=0)
    b = n * means.var(axis=0, ddof=1)
    var_plus = (n - 1.0) / n * w + b / n
    return np.sqrt(np.where(w > 0, var_plus / w, 1.0))
