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

from dpfed.metrics import LinearTestRanks
from dpfed.preprocess import Preprocessing, public_sigmas  # noqa: F401 - public_sigmas re-exported
# From dpfed.sensitivity, not site_node.sensitivity (the same names): importing site_node pulls
# in OpenDP, which a coordinator's core install (`pip install dpfed`) does not have.
from dpfed.sensitivity import (DEFAULT_BUDGET_SPLIT, validate_privacy_parameters,
                               xtx_sensitivity, xty_sensitivity)

__all__ = ["BoundsChoice", "choose_bounds", "choose_bounds_table", "public_sigmas",
           "row_normalised_sigma_x", "split_grid", "DEFAULT_OMEGAS", "TABLE_OMEGAS_Y",
           "TABLE_SXX_SHARES", "TABLE_RIDGE_CS"]

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
    split_scores: tuple[tuple[tuple[float, ...], float], ...] = field(default=())
    # Added with the public-shaped auxiliary search (defaults: the paper's search above).
    auxiliary: str = "gaussian"          # "gaussian" or "public:<digest of the public rows>"
    neighbouring: str = "replace_one"
    xtx_sensitivity: str = "paper"
    ridge: str = "fixed"                 # "fixed" (lambda = lambda0 = 1) or "noise_matched"
    ridge_c: float = 0.0                 # c of the noise-matched ridge r = 1 + c sd(Sxx noise)
    ridge_scores: tuple[tuple[float, float], ...] = field(default=())
    # Added with the per-round table search (``choose_bounds_table``).
    sites: int = 1                       # K: independent site releases summed (noise draws)
    x_norm_bound: float | None = None    # row-norm bound R of the mechanism (None: box only)

    def ridge_for(self, xtx_noise_sd: float) -> float:
        """The ridge r added to the noisy Sxx by the closed form this choice was tuned with:
        1 (lambda0 / lambda) + ridge_c x the sd of one entry's total Sxx noise."""
        return 1.0 + (self.ridge_c * float(xtx_noise_sd) if self.ridge == "noise_matched" else 0.0)

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
        obj["ridge_scores"] = tuple((float(c), float(v)) for c, v in obj.get("ridge_scores", ()))
        return cls(**obj)


def row_normalised_sigma_x(d: int) -> float:
    """sigma_x of row-normalised features: 1/sqrt(d), public by construction (each row has
    unit L2 norm, so the pooled mean square of the d features is exactly 1/d)."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    return 1.0 / math.sqrt(d)


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


def choose_bounds(n: int, d: int, epsilon: float, *, budget_split=None,
                  omegas=None, n_datasets: int = 20, n_noise: int = 20,
                  seed: int = 0, search_split: bool = False, cache_dir=None,
                  n_test: int = _DEFAULT_N_TEST, auxiliary=None,
                  neighbouring: str = "replace_one", xtx_sensitivity: str = "paper",
                  ridge: str = "fixed", ridge_cs=None,
                  search_sxx_share: bool = False) -> BoundsChoice:
    """Choose (omega_x, omega_y) for a site with n rows, d features and budget epsilon.

    Nieminen (2017) section 3.4.2 (and 3.4.1 with ``search_split=True``: every split on the 5%
    grid {0.05..0.90}^3 summing to 1 is tried and the best (split, pair) kept; ~171x the cost).
    Deterministic for a given ``seed``; cached in memory and, with ``cache_dir``, on disk as
    JSON keyed by every parameter. Costs no privacy: only n, d, epsilon and the split enter.
    Use ``result.bounds(sigma_x, sigma_y)`` with *public* sigmas (module docstring).

    With the defaults this is the paper's search, unchanged. The public-shaped search (see the
    comment above ``_search_auxiliary``) runs when any of these is given:

    - ``auxiliary``: a ``dpfed.auxiliary.AuxiliarySource`` (public rows + public
      pre-processing): auxiliary data shaped like the public rows, omegas relative to the
      public sigmas (``auxiliary.scales()``, what the round uses), public rows in the fit;
    - ``neighbouring`` ("replace_one" | "add_remove"), ``xtx_sensitivity`` ("paper" | "exact"),
      ``budget_split`` with 3 (replace-one) or 4 (add/remove: Sxx, Sxy, Syy, n) parts
      (default: (0.35, 0.60, 0.05) or (0.35, 0.60, 0.03, 0.02));
    - ``ridge="noise_matched"``: the closed form with r = 1 + c sd(Sxx noise), c in ``ridge_cs``
      chosen too (``result.ridge_c``);
    - ``search_sxx_share=True``: also the splits of ``sxx_share_splits`` (Sxx share 0.3..0.8).

    ``omegas`` defaults to 0.1..2.0 (the paper's grid) and, for the public-shaped search, to
    ``AUX_OMEGAS`` (up to 3.2).
    """
    new_path = (auxiliary is not None or neighbouring != "replace_one"
                or xtx_sensitivity != "paper" or ridge != "fixed" or search_sxx_share)
    if budget_split is None:
        budget_split = default_split(neighbouring)
    if omegas is None:
        omegas = AUX_OMEGAS if new_path else np.arange(0.1, 2.01, 0.1)
    if new_path:
        return _choose_auxiliary(n, d, epsilon, budget_split=budget_split, omegas=omegas,
                                 n_datasets=n_datasets, n_noise=n_noise, seed=seed,
                                 cache_dir=cache_dir, n_test=n_test, auxiliary=auxiliary,
                                 neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                                 ridge=ridge, ridge_cs=RIDGE_CS if ridge_cs is None else ridge_cs,
                                 search_split=search_split,
                                 search_sxx_share=search_sxx_share)
    om = _validate_common(n, d, epsilon, n_datasets, n_noise, n_test, seed, omegas)
    epsilon, _, _, split = validate_privacy_parameters(epsilon, 1.0, 1.0, budget_split)
    params = dict(n=int(n), d=int(d), epsilon=epsilon, budget_split=split,
                  omegas=tuple(float(v) for v in om), n_datasets=int(n_datasets),
                  n_noise=int(n_noise), n_test=int(n_test), seed=int(seed),
                  search_split=bool(search_split))
    path = None
    if cache_dir is not None:
        key_text, digest = _cache_key(**params)
        path = Path(cache_dir) / f"bounds-{digest}.json"
        stored = _stored_choice(path, key_text)
        if stored is not None:
            return stored
    result = _choose_cached(**params)
    if path is not None:
        _store_choice(path, key_text, result)
    return result


def _stored_choice(path: Path, key_text: str) -> BoundsChoice | None:
    """The choice stored in the cache file ``path`` for ``key_text`` (``_cache_key``); None
    when there is no file, or it is corrupt or holds another key (the caller then searches
    and overwrites it)."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key_text:
            return BoundsChoice.from_json(stored["result"])
    except (ValueError, KeyError, TypeError):
        pass  # corrupt or foreign file: recompute and overwrite
    return None


def _store_choice(path: Path, key_text: str, result: BoundsChoice) -> None:
    """Write ``result`` for ``key_text`` to the cache file ``path``: to a temporary file
    first, then renamed over it, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"key": key_text, "result": result.to_json()})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bounds-", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(payload)
    os.replace(tmp, path)


def _clear_caches():
    _choose_cached.cache_clear()
    _AUX_CACHE.clear()


choose_bounds.cache_clear = _clear_caches  # type: ignore[attr-defined]
choose_bounds.cache_info = _choose_cached.cache_info  # type: ignore[attr-defined]


# ------------------------------------------------- public-shaped auxiliary data (issue 9 part 4)
#
# The search below differs from the paper's (``_simulate``) in four ways, each optional:
# - the auxiliary data: ``dpfed.auxiliary.AuxiliarySource`` draws populations shaped like the
#   public rows (binary columns with the public frequencies, the public pre-processing), and
#   the thresholds are scaled by the *public* sigmas the real round will use;
# - the mechanism: either neighbouring relation, the exact or the paper's Sxx sensitivity, a
#   3-part (replace-one) or 4-part (add/remove: Sxx, Sxy, Syy, n) budget split;
# - the split: optionally searched over the Sxx share (``SXX_SHARES``), Syy and n keeping their
#   default shares (the closed form does not use them; the noise-aware posterior does);
# - the fit: the closed form with a *noise-matched ridge*,
#       beta = (PSD(Sxx_noisy + Sxx_public) + r I)^-1 (Sxy_noisy + Sxy_public),
#       r = lambda0 / lambda + c sd(one Sxx entry's noise) = 1 + c sqrt(2 K) b_xx,
#   PSD the projection onto the PSD cone (negative eigenvalues set to 0); c is chosen on the
#   auxiliary data too, from ``RIDGE_CS`` (never on test data). c = 0 is the paper's closed
#   form (lambda = lambda0 = 1) after the PSD projection.
# Scores are Spearman correlations with average ranks for ties (binary features give many
# tied predictions; the paper's search assumed continuous ones).

NEIGHBOURING = ("replace_one", "add_remove")
XTX_SENSITIVITIES = ("exact", "paper")
DEFAULT_SPLIT_ADD_REMOVE = (0.35, 0.60, 0.03, 0.02)   # = dpfed.sensitivity's, at merge
SXX_SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
RIDGE_CS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
#: omegas of the public-shaped search: the paper's 0.1..2.0 plus larger ones (a binary row
#: after row normalisation has entries up to ~0.7 = 2.2 sigma_x at d = 10: clipping them can
#: cost more than the noise it saves).
AUX_OMEGAS = DEFAULT_OMEGAS + (2.4, 2.8, 3.2)


def _scales(d: int, epsilon: float, x_bound: float, y_bound: float, budget_split,
            neighbouring: str = "add_remove", xtx_sensitivity: str = "exact"):
    """Laplace scales (b_xx, b_xy, b_yy, b_n) of a release; b_n None under replace-one.

    TO BE REPLACED by ``dpfed.sensitivity.noise_calibration`` at merge (``unit_scales`` uses
    it when it exists). Same formulas (method.md section 9):
    add/remove: Sxx upper triangle d(d+1)/2 Bx^2, Sxy d Bx By, Syy By^2, n 1 (4-part split);
    replace-one: Sxx d(d+1)/2 Bx^2, Sxy 2 d Bx By, Syy By^2, n public (3-part split).
    ``xtx_sensitivity="paper"``: Sxx d(d+1) Bx^2 (Honkela et al. 2018, twice the exact value).
    """
    split = _validate_split(budget_split, neighbouring)
    if xtx_sensitivity not in XTX_SENSITIVITIES:
        raise ValueError(f"xtx_sensitivity must be one of {XTX_SENSITIVITIES}")
    s_xx = (d * (d + 1) if xtx_sensitivity == "paper" else d * (d + 1) / 2) * x_bound ** 2
    if neighbouring == "add_remove":
        s_xy, s_yy = d * x_bound * y_bound, y_bound ** 2
        return (s_xx / (split[0] * epsilon), s_xy / (split[1] * epsilon),
                s_yy / (split[2] * epsilon), 1.0 / (split[3] * epsilon))
    s_xy, s_yy = 2 * d * x_bound * y_bound, y_bound ** 2
    return (s_xx / (split[0] * epsilon), s_xy / (split[1] * epsilon),
            s_yy / (split[2] * epsilon), None)


def _validate_split(budget_split, neighbouring) -> tuple[float, ...]:
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}")
    try:
        split = tuple(float(p) for p in budget_split)
    except (TypeError, ValueError):
        raise ValueError(f"budget_split must be numbers, got {budget_split!r}") from None
    parts = 4 if neighbouring == "add_remove" else 3
    if len(split) != parts:
        raise ValueError(f"a {neighbouring} budget split has {parts} parts "
                         f"({'Sxx, Sxy, Syy, n' if parts == 4 else 'Sxx, Sxy, Syy'}), got {split}")
    if not all(math.isfinite(p) and p > 0 for p in split) or abs(sum(split) - 1) > 1e-9:
        raise ValueError(f"budget_split parts must be > 0 and sum to 1, got {split}")
    return split


def default_split(neighbouring: str) -> tuple[float, ...]:
    return DEFAULT_SPLIT_ADD_REMOVE if neighbouring == "add_remove" else tuple(DEFAULT_BUDGET_SPLIT)


def unit_scales(d: int, epsilon: float, budget_split, neighbouring: str = "add_remove",
                xtx_sensitivity: str = "exact"):
    """Scales at Bx = By = 1: b_xx = u_xx Bx^2, b_xy = u_xy Bx By, b_yy = u_yy By^2, b_n = u_n.
    From ``dpfed.sensitivity.noise_calibration`` when it exists, else ``_scales``."""
    try:
        from dpfed.sensitivity import noise_calibration  # type: ignore[import-not-found]
    except ImportError:
        return _scales(d, epsilon, 1.0, 1.0, budget_split, neighbouring, xtx_sensitivity)
    cal = noise_calibration(d, epsilon, 1.0, 1.0, tuple(budget_split), neighbouring=neighbouring,
                            xtx_sensitivity=xtx_sensitivity)
    return cal.xtx_scale, cal.xty_scale, cal.yty_scale, cal.n_scale


def sxx_share_splits(base: tuple[float, ...], shares=SXX_SHARES) -> list[tuple[float, ...]]:
    """``base`` plus the splits with Sxx share in ``shares``, the Syy (and n) shares of
    ``base`` kept and Sxy taking the rest."""
    rest = sum(base[2:])
    out = [tuple(float(p) for p in base)]
    for p in shares:
        q = round(1.0 - p - rest, 10)
        cand = (float(p), q) + tuple(float(v) for v in base[2:])
        if q > 0 and all(max(abs(a - b) for a, b in zip(cand, o)) > 1e-9 for o in out):
            out.append(cand)
    return out


def psd_ridge_solve(a: np.ndarray, rhs: np.ndarray, ridges) -> list[np.ndarray]:
    """For each ridge r (broadcast over a's leading dims): (PSD(a) + r I)^-1 rhs.
    a (..., d, d) symmetric, rhs (..., k, d) (k right-hand sides per matrix)."""
    w, v = np.linalg.eigh(a)
    w = np.maximum(w, 0.0)
    t = np.matmul(rhs, v)                                           # (..., k, d) coordinates
    vt = np.swapaxes(v, -1, -2)
    return [np.matmul(t / (w[..., None, :] + r), vt) for r in ridges]


def _aux_dataset_scores(data, sigma_x, sigma_y, omx, omy, splits, unit, ridge_cs, n_noise, rng,
                        ridge_kind):
    """Mean Spearman over ``n_noise`` noise draws: (len(splits), len(ridge_cs), mx, my)."""
    x, y = data.x, data.y
    n, d = x.shape
    bx, by = np.asarray(omx) * sigma_x, np.asarray(omy) * sigma_y
    xc = np.clip(x[None], -bx[:, None, None], bx[:, None, None])             # (mx, n, d)
    yc = np.clip(y[None], -by[:, None], by[:, None])                         # (my, n)
    sxx = np.matmul(xc.transpose(0, 2, 1), xc)                               # (mx, d, d)
    sxy = np.matmul(xc.transpose(0, 2, 1), yc.T).transpose(0, 2, 1)          # (mx, my, d)
    sxx_pub = data.x_public.T @ data.x_public
    sxy_pub = data.x_public.T @ data.y_public
    e_xx = _symmetric(rng.laplace(size=(n_noise, d * (d + 1) // 2)), d)      # (N, d, d)
    e_xy = rng.laplace(size=(n_noise, d))                                    # (N, d)
    scorer = LinearTestRanks(data.x_test, data.y_test)
    out = np.empty((len(splits), len(ridge_cs), bx.size, by.size))
    for s, split in enumerate(splits):
        u_xx, u_xy = unit[s][0], unit[s][1]
        b_xx = u_xx * bx ** 2                                                 # (mx,)
        b_xy = u_xy * bx[:, None] * by[None, :]                               # (mx, my)
        a = sxx[None] + b_xx[None, :, None, None] * e_xx[:, None] + sxx_pub   # (N, mx, d, d)
        rhs = sxy[None] + b_xy[None, :, :, None] * e_xy[:, None, None, :] + sxy_pub
        sd_xx = math.sqrt(2.0) * b_xx
        ridges = [(1.0 + (c * sd_xx if ridge_kind == "noise_matched" else 0.0 * sd_xx))[:, None, None]
                  for c in ridge_cs]
        for c, beta in enumerate(psd_ridge_solve(a, rhs, ridges)):          # (N, mx, my, d)
            out[s, c] = scorer.spearman_many(beta, constant=0.0).mean(axis=0)
    return out


_AUX_CACHE: dict[str, BoundsChoice] = {}


def _search_auxiliary(*, n, d, epsilon, omegas, splits, neighbouring, xtx_sensitivity,
                      ridge, ridge_cs, n_datasets, n_noise, n_test, seed, source):
    """The public-shaped (or Gaussian) search; returns a BoundsChoice."""
    unit = [unit_scales(d, epsilon, sp, neighbouring, xtx_sensitivity) for sp in splits]
    om = np.asarray(omegas)
    total = np.zeros((len(splits), len(ridge_cs), om.size, om.size))
    sx_sum = sy_sum = 0.0
    for child in np.random.SeedSequence(seed).spawn(n_datasets):
        rng = np.random.default_rng(child)
        if source is None:
            from dpfed.auxiliary import gaussian_auxiliary

            data = gaussian_auxiliary(rng, n, d, n_test)
            sx, sy = float(np.std(data.x)), float(np.std(data.y))
        else:
            data = source.sample(rng, n, n_test)
            sx, sy = source.scales()
        total += _aux_dataset_scores(data, sx, sy, om, om, splits, unit, ridge_cs, n_noise, rng,
                                     ridge)
        sx_sum += sx
        sy_sum += sy
    scores = total / n_datasets
    flat = int(np.argmax(scores))
    s_best, c_best, i, j = np.unravel_index(flat, scores.shape)
    best_by_split = [float(np.max(scores[k])) for k in range(len(splits))]
    best_by_c = [float(np.max(scores[s_best, k])) for k in range(len(ridge_cs))]
    return BoundsChoice(
        omega_x=float(om[i]), omega_y=float(om[j]), best_score=float(scores[s_best, c_best, i, j]),
        budget_split=tuple(float(p) for p in splits[s_best]), omegas=tuple(float(v) for v in om),
        scores=tuple(tuple(float(v) for v in row) for row in scores[s_best, c_best]),
        n=n, d=d, epsilon=epsilon, seed=seed, n_datasets=n_datasets, n_noise=n_noise,
        n_test=n_test, aux_sigma_x=sx_sum / n_datasets, aux_sigma_y=sy_sum / n_datasets,
        split_scores=tuple((tuple(float(p) for p in sp), b) for sp, b in zip(splits, best_by_split))
        if len(splits) > 1 else (),
        auxiliary="gaussian" if source is None else f"public:{source.digest()}",
        neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity, ridge=ridge,
        ridge_c=float(ridge_cs[c_best]),
        ridge_scores=tuple((float(c), b) for c, b in zip(ridge_cs, best_by_c)))


def _validate_common(n, d, epsilon, n_datasets, n_noise, n_test, seed, omegas):
    for name, v in (("n", n), ("d", d), ("n_datasets", n_datasets), ("n_noise", n_noise),
                    ("n_test", n_test)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if n < 2 or n_test < 2:
        raise ValueError("n and n_test must be at least 2")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)) \
            or not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    om = np.round(np.asarray(omegas, dtype=np.float64).ravel(), 10)
    if om.size == 0 or not np.all(np.isfinite(om)) or np.any(om <= 0):
        raise ValueError("omegas must be a non-empty list of positive finite numbers")
    return om


def _choose_auxiliary(n, d, epsilon, *, budget_split, omegas, n_datasets, n_noise, seed,
                      cache_dir, n_test, auxiliary, neighbouring, xtx_sensitivity, ridge,
                      ridge_cs, search_split, search_sxx_share) -> BoundsChoice:
    om = _validate_common(n, d, epsilon, n_datasets, n_noise, n_test, seed, omegas)
    split = _validate_split(budget_split, neighbouring)
    if xtx_sensitivity not in XTX_SENSITIVITIES:
        raise ValueError(f"xtx_sensitivity must be one of {XTX_SENSITIVITIES}")
    if ridge not in ("fixed", "noise_matched"):
        raise ValueError("ridge must be 'fixed' or 'noise_matched'")
    if search_split:
        raise ValueError("search_split (the paper's 171-split grid) is only for the paper's "
                         "search; use search_sxx_share")
    if auxiliary is not None and auxiliary.d != d:
        raise ValueError(f"auxiliary source has {auxiliary.d} features, d = {d}")
    cs = tuple(float(c) for c in (ridge_cs if ridge == "noise_matched" else (0.0,)))
    if not cs or any(not (math.isfinite(c) and c >= 0) for c in cs):
        raise ValueError("ridge_cs must be non-negative numbers")
    splits = sxx_share_splits(split) if search_sxx_share else [split]
    params = dict(n=int(n), d=int(d), epsilon=float(epsilon), budget_split=list(split),
                  omegas=[float(v) for v in om], n_datasets=int(n_datasets),
                  n_noise=int(n_noise), n_test=int(n_test), seed=int(seed),
                  auxiliary="gaussian" if auxiliary is None else auxiliary.digest(),
                  neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity, ridge=ridge,
                  ridge_cs=list(cs), search_sxx_share=bool(search_sxx_share))
    key_text, digest = _cache_key(**params)
    if key_text in _AUX_CACHE:
        return _AUX_CACHE[key_text]
    path = Path(cache_dir) / f"bounds-{digest}.json" if cache_dir is not None else None
    stored = _stored_choice(path, key_text) if path is not None else None
    if stored is not None:
        _AUX_CACHE[key_text] = stored
        return stored
    result = _search_auxiliary(n=int(n), d=int(d), epsilon=float(epsilon), omegas=om,
                               splits=splits, neighbouring=neighbouring,
                               xtx_sensitivity=xtx_sensitivity, ridge=ridge, ridge_cs=cs,
                               n_datasets=int(n_datasets), n_noise=int(n_noise),
                               n_test=int(n_test), seed=int(seed), source=auxiliary)
    _AUX_CACHE[key_text] = result
    if path is not None:
        _store_choice(path, key_text, result)
    return result


# ------------------------------------------------ one search for every cell of a round or protocol
#
# ``choose_bounds`` searches one (n, eps) at a time on freshly drawn auxiliary data; the
# evaluation protocol needs a choice for every (n, K, eps) of every repeat (each repeat has its
# own public lines, so its own auxiliary source), and the search per cell made that too slow
# to run by default. ``choose_bounds_table`` draws the auxiliary populations once, at the
# largest n, and scores every cell on nested prefixes of them (as the protocol nests its
# private sets), with the noise drawn once in standard form and scaled per cell, split and
# bound (common random numbers: the comparison between candidates is paired). The closed form
# with the noise-matched ridge is the scorer (as in ``choose_bounds``); the fit a round uses
# may differ (the noise-aware posterior), the bounds are a utility heuristic either way.
#
# With a row-norm bound R (``x_norm_bound``, rows normalised to unit norm: R = 1) the Sxx and
# Sxy noise stop growing at Bx = R / sqrt(d) (``dpfed.sensitivity``), so the feature bound is
# Bx = R (no coordinate clipping of a unit row) unless ``omegas_x`` says otherwise, and the
# search is over omega_y, the Sxx share and the ridge c only.

#: omega_y (B_y = omega_y sigma_y) candidates of ``choose_bounds_table``. Not below 0.7: on
#: auxiliary data shaped like GDSC public lines (no test rows; docs/evaluation.md) the closed
#: form scores about the same for omega_y 0.2-2, but the noise-aware posterior loses 0.03-0.1
#: Spearman at 0.2-0.3 (a target clipped that hard is nearly two-valued, which its normal
#: linear model misdescribes) and is flat from 0.7 up.
TABLE_OMEGAS_Y = (0.7, 1.0, 1.4, 2.0)
#: Sxx shares tried by ``choose_bounds_table`` (Syy and n keep their default shares, Sxy the
#: rest): on GDSC-shaped auxiliary data noisy cells prefer a small one (the ridge then relies
#: on Sxy), cells with little noise a larger one.
TABLE_SXX_SHARES = (0.1, 0.2, 0.35)
#: ridge c candidates of ``choose_bounds_table``.
TABLE_RIDGE_CS = (2.0, 4.0, 16.0)
_TABLE_VERSION = 1


def _unit_noise(d, epsilon, splits, neighbouring, xtx_sensitivity, x_norm_bound, bx, by):
    """Per-coordinate Laplace scales (b_xx (S, X), b_xy (S, X, Y)) of one release for every
    split and bound pair (``dpfed.sensitivity`` formulas, vectorised over the bounds)."""
    from dpfed.sensitivity import xtx_sensitivity as sxx_fn, xty_sensitivity as sxy_fn

    sxx = np.asarray(sxx_fn(d, bx, rule=xtx_sensitivity, x_norm_bound=x_norm_bound,
                            neighbouring=neighbouring), dtype=np.float64)          # (X,)
    sxy = np.asarray(sxy_fn(d, bx[:, None], by[None, :], neighbouring=neighbouring,
                            x_norm_bound=x_norm_bound), dtype=np.float64)          # (X, Y)
    shares = np.array([sp[0] for sp in splits]), np.array([sp[1] for sp in splits])
    b_xx = sxx[None, :] / (shares[0][:, None] * epsilon)
    b_xy = sxy[None] / (shares[1][:, None, None] * epsilon)
    return b_xx, b_xy


def choose_bounds_table(source, cells, epsilons, *, neighbouring: str = "add_remove",
                        xtx_sensitivity: str = "exact", x_norm_bound: float | None = None,
                        budget_split=None, omegas_x=None, omegas_y=TABLE_OMEGAS_Y,
                        sxx_shares=TABLE_SXX_SHARES, ridge_cs=TABLE_RIDGE_CS,
                        n_datasets: int = 6, n_noise: int = 3, n_test: int = 100,
                        seed: int = 0, cache_dir=None) -> dict:
    """Bounds, Sxx share and ridge c for every cell (n, K) x eps at once, tuned on auxiliary
    data shaped like the public rows (comment above). Public inputs only: ``source`` (a
    ``dpfed.auxiliary.AuxiliarySource`` of the public rows), the cells' n (total private rows)
    and K (sites, each releasing n // K or so rows with its own noise), eps, the mechanism.

    Returns {(n, K, eps): BoundsChoice} (``omega_x``, ``omega_y`` relative to
    ``source.scales()``, ``budget_split``, ``ridge_c``, ``sites`` = K). Deterministic for a
    ``seed``; with ``cache_dir`` stored as one JSON file keyed by every input.
    """
    from dpfed.sensitivity import check_neighbouring, check_norm_bound, default_budget_split

    check_neighbouring(neighbouring)
    if xtx_sensitivity not in XTX_SENSITIVITIES:
        raise ValueError(f"xtx_sensitivity must be one of {XTX_SENSITIVITIES}")
    x_norm_bound = check_norm_bound(x_norm_bound)
    cells = sorted({(int(n), int(k)) for n, k in cells})
    if not cells or any(n < 2 or k < 1 or n // k < 1 for n, k in cells):
        raise ValueError(f"cells must be (n >= 2, K >= 1) pairs with n // K >= 1, got {cells}")
    eps_list = sorted({float(e) for e in epsilons})
    if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
        raise ValueError("epsilons must be finite and > 0")
    base = _validate_split(budget_split if budget_split is not None
                           else default_budget_split(neighbouring), neighbouring)
    splits = [base] + [sp for sp in sxx_share_splits(base, tuple(sxx_shares))[1:]]
    d = source.d
    sigma_x, sigma_y = source.scales()
    if omegas_x is None:
        omegas_x = (x_norm_bound / sigma_x,) if x_norm_bound is not None else (0.3, 1.0, 2.0, 3.2)
    omx = np.round(np.asarray(omegas_x, dtype=np.float64), 10)
    omy = np.round(np.asarray(omegas_y, dtype=np.float64), 10)
    cs = np.asarray(ridge_cs, dtype=np.float64)
    params = dict(version=_TABLE_VERSION, source=source.digest(), cells=cells, eps=eps_list,
                  neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                  x_norm_bound=x_norm_bound, splits=[list(sp) for sp in splits],
                  omegas_x=omx.tolist(), omegas_y=omy.tolist(), ridge_cs=cs.tolist(),
                  n_datasets=int(n_datasets), n_noise=int(n_noise), n_test=int(n_test),
                  seed=int(seed))
    key_text, digest = _cache_key(**params)
    path = Path(cache_dir) / f"table-{digest}.json" if cache_dir is not None else None
    common = dict(d=d, seed=int(seed), n_datasets=int(n_datasets), n_noise=int(n_noise),
                  n_test=int(n_test), aux_sigma_x=sigma_x, aux_sigma_y=sigma_y,
                  omegas=tuple(float(v) for v in omy), scores=(),
                  auxiliary=f"public:{source.digest()}", neighbouring=neighbouring,
                  xtx_sensitivity=xtx_sensitivity, ridge="noise_matched",
                  x_norm_bound=x_norm_bound)

    def build(rows):
        return {(int(n), int(k), float(e)): BoundsChoice(
            omega_x=float(ox), omega_y=float(oy), best_score=float(score),
            budget_split=tuple(float(p) for p in sp), n=int(n), epsilon=float(e),
            ridge_c=float(c), sites=int(k), **common)
            for n, k, e, ox, oy, sp, c, score in rows}

    if path is not None and path.exists():
        try:
            stored = json.loads(path.read_text())
            if stored.get("key") == key_text:
                return build(stored["rows"])
        except (ValueError, KeyError, TypeError):
            pass
    scores = _table_scores(source, cells, eps_list, splits, omx, omy, cs, neighbouring,
                           xtx_sensitivity, x_norm_bound, sigma_x, sigma_y, int(n_datasets),
                           int(n_noise), int(n_test), int(seed))
    rows = []
    for ci, (n, k) in enumerate(cells):
        for ei, eps in enumerate(eps_list):
            sc = scores[ci, ei]                                    # (S, X, Y, C)
            s_b, x_b, y_b, c_b = np.unravel_index(int(np.argmax(sc)), sc.shape)
            rows.append([n, k, eps, float(omx[x_b]), float(omy[y_b]),
                         [float(p) for p in splits[s_b]], float(cs[c_b]),
                         float(sc[s_b, x_b, y_b, c_b])])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"key": key_text, "rows": rows})
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".table-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    return build(rows)


def _project_ball(x: np.ndarray, r: float) -> np.ndarray:
    norms = np.sqrt(np.einsum("...ij,...ij->...i", x, x))
    return x * np.minimum(1.0, r / np.where(norms > 0, norms, 1.0))[..., None]


def _table_scores(source, cells, eps_list, splits, omx, omy, cs, neighbouring, xtx_rule,
                  x_norm_bound, sigma_x, sigma_y, n_datasets, n_noise, n_test, seed):
    """Mean Spearman (cells, eps, splits, omega_x, omega_y, c) over populations x noise; every
    candidate of every cell in one batched eigendecomposition and one ranking per population."""
    d = source.d
    n_max = max(n for n, _ in cells)
    ks = sorted({k for _, k in cells})
    bx, by = omx * sigma_x, omy * sigma_y
    iu = np.triu_indices(d)
    sizes = sorted({n for n, _ in cells})
    size_idx = np.array([sizes.index(n) for n, _ in cells])               # (C,)
    k_idx = np.array([ks.index(k) for _, k in cells])                     # (C,)
    k_arr = np.array([k for _, k in cells], dtype=np.float64)
    # Per-coordinate scales of one release: (E, S, X) and (E, S, X, Y).
    units = [_unit_noise(d, e, splits, neighbouring, xtx_rule, x_norm_bound, bx, by)
             for e in eps_list]
    b_xx = np.stack([u[0] for u in units])
    b_xy = np.stack([u[1] for u in units])
    sd = np.sqrt(2.0 * k_arr)[:, None, None, None] * b_xx[None]          # (C, E, S, X)
    shape = (len(cells), len(eps_list), len(splits), omx.size, omy.size, cs.size)
    total = np.zeros(shape)
    for child in np.random.SeedSequence(seed).spawn(n_datasets):
        rng = np.random.default_rng(child)
        data = source.sample(rng, n_max, n_test)
        scorer = LinearTestRanks(data.x_test, data.y_test)
        xc = np.clip(data.x[None], -bx[:, None, None], bx[:, None, None])          # (X, N, d)
        yc = np.clip(data.y[None], -by[:, None], by[:, None])                      # (Y, N)
        pxc = np.clip(data.x_public[None], -bx[:, None, None], bx[:, None, None])  # (X, m, d)
        pyc = np.clip(data.y_public[None], -by[:, None], by[:, None])              # (Y, m)
        if x_norm_bound is not None:
            xc, pxc = _project_ball(xc, x_norm_bound), _project_ball(pxc, x_norm_bound)
        rows = np.array(sizes) - 1
        sxx_n = np.cumsum(xc[:, :, :, None] * xc[:, :, None, :], axis=1)[:, rows]   # (X,Nn,d,d)
        sxy_n = np.cumsum(xc[:, None] * yc[None, :, :, None], axis=2)[:, :, rows]   # (X,Y,Nn,d)
        sxx = (sxx_n + np.einsum("xmi,xmj->xij", pxc, pxc)[:, None])[:, size_idx]   # (X,C,d,d)
        sxy = (sxy_n + np.einsum("xmi,ym->xyi", pxc, pyc)[:, :, None])[:, :, size_idx]
        # Standard noise per K (summed K draws), shared by every cell with that K.
        e_xx = np.zeros((len(ks), n_noise, d, d))
        e_xy = np.empty((len(ks), n_noise, d))
        for i, k in enumerate(ks):
            up = rng.laplace(size=(k, n_noise, iu[0].size)).sum(axis=0)
            e_xx[i][:, iu[0], iu[1]] = up
            e_xx[i][:, iu[1], iu[0]] = up
            e_xy[i] = rng.laplace(size=(k, n_noise, d)).sum(axis=0)
        e_xx, e_xy = e_xx[k_idx], e_xy[k_idx]                             # (C, N, d, d), (C, N, d)
        # a: (C, E, S, X, N, d, d); rhs: (C, E, S, X, Y, N, d)
        a = (sxx.transpose(1, 0, 2, 3)[:, None, None, :, None]
             + b_xx[None, :, :, :, None, None, None] * e_xx[:, None, None, None])
        rhs = (sxy.transpose(2, 0, 1, 3)[:, None, None, :, :, None]
               + b_xy[None, :, :, :, :, None, None] * e_xy[:, None, None, None, None])
        w, v = np.linalg.eigh(a)
        w = np.maximum(w, 0.0)[:, :, :, :, None]                          # (C,E,S,X,1,N,d)
        t = np.einsum("cesxnji,cesxynj->cesxyni", v, rhs)
        betas = []
        for c in cs:
            r = (1.0 + c * sd)[:, :, :, :, None, None, None]
            betas.append(np.einsum("cesxnij,cesxynj->cesxyni", v, t / (w + r)))
        beta = np.stack(betas, axis=5)                                    # (C,E,S,X,Y,R,N,d)
        total += scorer.spearman_many(beta, constant=0.0).mean(axis=-1)
    return total / n_datasets
