"""Choosing the clipping thresholds (and optionally the budget split) on synthetic data.

Nieminen (2017), section 3.4 (3.4.1 split, 3.4.2 thresholds); Honkela et al. (2018), section
4.3; method.md section 4. The thresholds are parameterised as B_x = omega_x sigma_x and
B_y = omega_y sigma_y (thesis eq. (3.12)) with omega in {0.1, ..., 2.0} (eq. (3.13)). The pair
(omega_x, omega_y) is chosen on *auxiliary synthetic data* of the same n and d drawn from the
model (3.11):

    x_i ~ N(0, I_d), then the site's pre-processing (centre columns, rows to unit L2 norm),
    beta ~ N(0, I_d),   y_i ~ N(x_i^T beta, 1),   y centred,

by simulating the release (clip, statistics, Laplace noise with the scales of
``site_node.sensitivity``), fitting the fixed-precision closed form (lambda = lambda0 = 1,
thesis eq. (3.2)/(3.5)) and scoring the Spearman rank correlation between predictions and
targets on held-out synthetic test points, averaged over ``n_datasets`` auxiliary data sets x
``n_noise`` noise draws. The best pair is kept.

Privacy: only n, d, epsilon and the budget split enter the search, all public (n is released
exactly under bounded DP anyway, method.md section 2 step 5). No private value is read, so
the search costs no privacy budget. The *scale* of the thresholds, sigma_x and sigma_y, must
also be obtained without reading private data (method.md section 4, "privacy leaks the
reference code does NOT account for"):

- sigma_x: after row normalisation every row has unit norm, so the pooled root mean square of
  the features is exactly 1/sqrt(d) and the pooled standard deviation is at most that and,
  after centring, very close to it. ``row_normalised_sigma_x(d)`` returns 1/sqrt(d): public by
  construction. Alternatively take it from public (non-private) rows with ``public_sigmas``.
- sigma_y: the target is not normalised, so its scale is data dependent. Take it from public
  data (e.g. the non-private cell lines; ``public_sigmas``), or estimate it with a DP mechanism
  and charge that epsilon to the site's budget. Never compute it from the private rows.

Randomness: the auxiliary data *and the simulated noise* come from a seeded numpy Generator.
That is deliberate and safe here: the data are synthetic and nothing private is protected by
this noise; it only has to be reproducible. DP noise on real data is drawn by OpenDP in
``site_node.laplace``, never by numpy, and this module must never be used to release anything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpfed.preprocess import Preprocessing
from site_node.sensitivity import (DEFAULT_BUDGET_SPLIT, validate_privacy_parameters,
                                   xtx_sensitivity, xty_sensitivity)

__all__ = ["BoundsChoice", "choose_bounds", "public_sigmas", "row_normalised_sigma_x",
           "split_grid", "DEFAULT_OMEGAS"]

DEFAULT_OMEGAS = tuple(np.round(np.arange(0.1, 2.01, 0.1), 10))
_CACHE_VERSION = 1
_DEFAULT_N_TEST = 200


@dataclass(frozen=True)
class BoundsChoice:
    """The chosen threshold multipliers and the evidence for them.

    ``scores[i][j]`` is the mean Spearman correlation of (omegas[i], omegas[j]) for
    (omega_x, omega_y) with ``budget_split``; ``split_scores`` (only with the split search) maps
    each candidate split to its best mean score. ``aux_sigma_x``/``aux_sigma_y`` are the mean
    standard deviations of the synthetic data (the scale the multipliers were tuned against).
    """

    omega_x: float
    omega_y: float
    best_score: float
    budget_split: tuple[float, float, float]
    omegas: tuple[float, ...]
    scores: tuple[tuple[float, ...], ...]
    n: int
    d: int
    epsilon: float
    seed: int
    n_datasets: int
    n_noise: int
    n_test: int
    aux_sigma_x: float
    aux_sigma_y: float
    split_scores: tuple[tuple[tuple[float, float, float], float], ...] = field(default=())

    def bounds(self, sigma_x: float, sigma_y: float) -> tuple[float, float]:
        """(B_x, B_y) = (omega_x sigma_x, omega_y sigma_y), thesis eq. (3.12). ``sigma_x`` and
        ``sigma_y`` must be public (see the module docstring), never from private rows."""
        for name, v in (("sigma_x", sigma_x), ("sigma_y", sigma_y)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        return self.omega_x * float(sigma_x), self.omega_y * float(sigma_y)

    def scores_array(self) -> np.ndarray:
        return np.array(self.scores)

    def to_json(self) -> str:
        obj = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BoundsChoice":
        obj = json.loads(text)
        obj["budget_split"] = tuple(obj["budget_split"])
        obj["omegas"] = tuple(obj["omegas"])
        obj["scores"] = tuple(tuple(r) for r in obj["scores"])
        obj["split_scores"] = tuple((tuple(s), float(v)) for s, v in obj["split_scores"])
        return cls(**obj)


def row_normalised_sigma_x(d: int) -> float:
    """sigma_x of row-normalised features: 1/sqrt(d), public by construction (each row has
    unit L2 norm, so the pooled mean square of the d features is exactly 1/d)."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    return 1.0 / math.sqrt(d)


def public_sigmas(x_public, y_public, preprocessing: Preprocessing) -> tuple[float, float]:
    """(sigma_x, sigma_y) of *public* data after the site's pre-processing: the pooled standard
    deviation of all features and the standard deviation of the target (thesis 3.4.2). Never
    pass private rows: the result scales the thresholds and is not protected."""
    x_public = np.asarray(x_public, dtype=np.float64)
    y_public = np.asarray(y_public, dtype=np.float64)
    if x_public.ndim != 2 or y_public.shape != (x_public.shape[0],) or x_public.shape[0] < 2:
        raise ValueError("public data must be n x d features and n targets with n >= 2")
    if not (np.all(np.isfinite(x_public)) and np.all(np.isfinite(y_public))):
        raise ValueError("public data contain NaN or infinite values")
    z, t = preprocessing.apply(x_public, y_public)
    sx, sy = float(np.std(z)), float(np.std(t))
    if not (sx > 0 and sy > 0):
        raise ValueError("public data have zero spread; cannot scale the thresholds")
    return sx, sy


def split_grid(step: float = 0.05) -> list[tuple[float, float, float]]:
    """All (p1, p2, p3) on a grid of ``step`` with every p >= step and p1 + p2 + p3 = 1
    (thesis 3.4.1: {0.05, ..., 0.90}^3; 171 splits for the default step)."""
    m = round(1 / step)
    return [(i / m, j / m, (m - i - j) / m) for i in range(1, m - 1) for j in range(1, m - i)]


# ------------------------------------------------------------------------------ simulation

def _symmetric(upper: np.ndarray, d: int) -> np.ndarray:
    """(..., d(d+1)/2) upper-triangle vectors -> (..., d, d) symmetric matrices."""
    out = np.zeros(upper.shape[:-1] + (d, d))
    iu = np.triu_indices(d)
    out[..., iu[0], iu[1]] = upper
    out[..., iu[1], iu[0]] = upper
    return out


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 0..m-1 along the last axis (ties have probability zero for continuous data)."""
    order = np.argsort(a, axis=-1)
    r = np.empty_like(order)
    np.put_along_axis(r, order, np.arange(a.shape[-1]), axis=-1)
    return r


def _auxiliary_dataset(rng: np.random.Generator, n: int, d: int, n_test: int):
    """Model (3.11) with lambda = lambda0 = 1, pre-processed like the real data (thesis 3.5)."""
    x_raw = rng.standard_normal((n + n_test, d))
    pre = Preprocessing(tuple(x_raw[:n].mean(axis=0)), 0.0, True, source="synthetic")
    x_all = pre.transform_x(x_raw)
    beta = rng.standard_normal(d)
    y_all = x_all @ beta + rng.standard_normal(n + n_test)
    x, x_test = x_all[:n], x_all[n:]
    y = y_all[:n] - y_all[:n].mean()
    return x, y, x_test, y_all[n:]


def _dataset_scores(x, y, x_test, y_test, omegas, splits, epsilon, n_noise, rng):
    """Mean Spearman over ``n_noise`` draws for every split and (omega_x, omega_y) pair.

    Vectorised: the clipped statistics depend on omega_x (Sxx) and on the pair (Sxy); the noise
    is drawn once in standard form and scaled per pair and split (common random numbers, which
    also lowers the variance of the comparison between pairs). One batched solve per split.
    Returns (len(splits), m, m) and the data's (sigma_x, sigma_y).
    """
    n, d = x.shape
    om = np.asarray(omegas)
    m = om.size
    sigma_x, sigma_y = float(np.std(x)), float(np.std(y))
    bx, by = om * sigma_x, om * sigma_y
    xc = np.clip(x[None], -bx[:, None, None], bx[:, None, None])          # (m, n, d)
    yc = np.clip(y[None], -by[:, None], by[:, None])                      # (m, n)
    sxx = np.matmul(xc.transpose(0, 2, 1), xc)                            # (mx, d, d)
    sxy = np.matmul(xc.transpose(0, 2, 1), yc.T).transpose(0, 2, 1)       # (mx, my, d)
    # Standard Laplace draws shared by all pairs and splits (synthetic data: numpy is fine).
    e_xx = _symmetric(rng.laplace(size=(n_noise, d * (d + 1) // 2)), d)   # (K, d, d)
    e_xy = rng.laplace(size=(n_noise, d))                                 # (K, d)
    sens_xx = xtx_sensitivity(d, bx)                                      # (mx,)
    sens_xy = xty_sensitivity(d, bx[:, None], by[None, :])                # (mx, my)
    ry = _ranks(y_test).astype(float)
    ry -= ry.mean()
    out = np.empty((len(splits), m, m))
    eye = np.eye(d)
    for s, (p1, p2, _p3) in enumerate(splits):
        b_xx = sens_xx / (p1 * epsilon)
        b_xy = sens_xy / (p2 * epsilon)
        # Posterior precision lambda0 I + lambda Sxx with lambda = lambda0 = 1 (eq. (3.2)).
        prec = eye + sxx[None] + b_xx[None, :, None, None] * e_xx[:, None]            # (K, mx, d, d)
        rhs = sxy[None] + b_xy[None, :, :, None] * e_xy[:, None, None, :]           # (K, mx, my, d)
        try:
            mu = np.linalg.solve(prec, rhs.transpose(0, 1, 3, 2))                      # (K, mx, d, my)
        except np.linalg.LinAlgError:  # an exactly singular noisy matrix: measure zero
            mu = np.matmul(np.linalg.pinv(prec), rhs.transpose(0, 1, 3, 2))
        pred = np.einsum("td,kadb->kabt", x_test, mu)                                # (K, mx, my, T)
        rp = _ranks(pred).astype(float)
        rp -= rp.mean(axis=-1, keepdims=True)
        rho = (rp @ ry) / np.sqrt((rp * rp).sum(axis=-1) * (ry @ ry))
        out[s] = rho.mean(axis=0)
    return out, sigma_x, sigma_y


def _simulate(n, d, epsilon, splits, omegas, n_datasets, n_noise, n_test, seed):
    """Scores (len(splits), m, m) averaged over auxiliary data sets and noise draws."""
    children = np.random.SeedSequence(seed).spawn(n_datasets)
    total = np.zeros((len(splits), len(omegas), len(omegas)))
    sx_sum = sy_sum = 0.0
    for child in children:
        rng = np.random.default_rng(child)
        x, y, x_test, y_test = _auxiliary_dataset(rng, n, d, n_test)
        scores, sx, sy = _dataset_scores(x, y, x_test, y_test, omegas, splits, epsilon, n_noise, rng)
        total += scores
        sx_sum += sx
        sy_sum += sy
    return total / n_datasets, sx_sum / n_datasets, sy_sum / n_datasets


@functools.lru_cache(maxsize=128)
def _choose_cached(n, d, epsilon, budget_split, omegas, n_datasets, n_noise, n_test, seed,
                   search_split) -> BoundsChoice:
    splits = split_grid() if search_split else [budget_split]
    scores, sx, sy = _simulate(n, d, epsilon, splits, omegas, n_datasets, n_noise, n_test, seed)
    best = [float(np.max(s)) for s in scores]
    s_best = int(np.argmax(best))
    i, j = np.unravel_index(int(np.argmax(scores[s_best])), scores[s_best].shape)
    return BoundsChoice(
        omega_x=float(omegas[i]), omega_y=float(omegas[j]), best_score=best[s_best],
        budget_split=tuple(float(p) for p in splits[s_best]), omegas=omegas,
        scores=tuple(tuple(float(v) for v in row) for row in scores[s_best]),
        n=n, d=d, epsilon=epsilon, seed=seed, n_datasets=n_datasets, n_noise=n_noise,
        n_test=n_test, aux_sigma_x=sx, aux_sigma_y=sy,
        split_scores=tuple((tuple(float(p) for p in sp), b) for sp, b in zip(splits, best))
        if search_split else ())


def _cache_key(**params) -> tuple[str, str]:
    text = json.dumps({"version": _CACHE_VERSION, **params}, sort_keys=True)
    return text, hashlib.sha256(text.encode()).hexdigest()[:32]


def choose_bounds(n: int, d: int, epsilon: float, *, budget_split=DEFAULT_BUDGET_SPLIT,
                  omegas=np.arange(0.1, 2.01, 0.1), n_datasets: int = 20, n_noise: int = 20,
                  seed: int = 0, search_split: bool = False, cache_dir=None,
                  n_test: int = _DEFAULT_N_TEST) -> BoundsChoice:
    """Choose (omega_x, omega_y) for a site with n rows, d features and budget epsilon.

    Nieminen (2017) section 3.4.2 (and 3.4.1 with ``search_split=True``: every split on the 5%
    grid {0.05..0.90}^3 summing to 1 is tried and the best (split, pair) kept; ~171x the cost).
    Deterministic for a given ``seed``; cached in memory and, with ``cache_dir``, on disk as
    JSON keyed by every parameter. Costs no privacy: only n, d, epsilon and the split enter.
    Use ``result.bounds(sigma_x, sigma_y)`` with *public* sigmas (module docstring).
    """
    for name, v in (("n", n), ("d", d), ("n_datasets", n_datasets), ("n_noise", n_noise),
                    ("n_test", n_test)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if n < 2 or n_test < 2:
        raise ValueError("n and n_test must be at least 2")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    epsilon, _, _, split = validate_privacy_parameters(epsilon, 1.0, 1.0, budget_split)
    om = np.round(np.asarray(omegas, dtype=np.float64).ravel(), 10)
    if om.size == 0 or not np.all(np.isfinite(om)) or np.any(om <= 0):
        raise ValueError("omegas must be a non-empty list of positive finite numbers")
    params = dict(n=int(n), d=int(d), epsilon=epsilon, budget_split=split,
                  omegas=tuple(float(v) for v in om), n_datasets=int(n_datasets),
                  n_noise=int(n_noise), n_test=int(n_test), seed=int(seed),
                  search_split=bool(search_split))
    path = None
    if cache_dir is not None:
        key_text, digest = _cache_key(**params)
        path = Path(cache_dir) / f"bounds-{digest}.json"
        if path.exists():
            try:
                stored = json.loads(path.read_text())
                if stored.get("key") == key_text:
                    return BoundsChoice.from_json(stored["result"])
            except (ValueError, KeyError, TypeError):
                pass  # corrupt or foreign file: recompute and overwrite
    result = _choose_cached(**params)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"key": key_text, "result": result.to_json()})
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bounds-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    return result


choose_bounds.cache_clear = _choose_cached.cache_clear  # type: ignore[attr-defined]
choose_bounds.cache_info = _choose_cached.cache_info  # type: ignore[attr-defined]
