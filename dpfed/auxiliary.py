"""Auxiliary (synthetic) data shaped like the public rows (issue 9 part 3; method.md 4, 11).

The clipping bounds, the budget split and the ridge of the closed-form fit are tuned by
simulating the release on *auxiliary* data, and ``dpfed plan`` forecasts what a round buys the
same way. The paper draws that data from x ~ N(0, I) (``dpfed.bounds``, Gaussian); on the
bundled GDSC features (binary mutation and tissue indicators) that is a poor stand-in: after
centring and row normalisation a binary row has a few large, equal entries, not a Gaussian
cloud, and the thresholds tuned on Gaussian rows flatten them. ``AuxiliarySource`` draws
auxiliary populations whose features look like the public rows instead.

**What it reads.** Only what it is given: the *public* rows (raw features ``x_public``, raw
target ``y_public``), the round's public pre-processing (``dpfed.preprocess.Preprocessing``,
itself computed from the public rows) and, optionally, the feature names (public: they are
in round.toml). Never pass private rows: nothing here is protected, the result is reproducible
from its inputs and a seed. The random numbers come from a seeded numpy Generator: the data are
synthetic, this noise protects nothing, and this module must never be used for a release.

**Generative assumptions** (one auxiliary *population* per call of ``sample``; each population
gets its own parameters, drawn from their posterior given the public rows, so that averaging
over populations carries the uncertainty of 10 public rows into the forecast):

- Binary columns (every public value 0 or 1): x_j ~ Bernoulli(p_j), independently across
  columns, p_j ~ Beta(k_j + 1/2, m - k_j + 1/2) (Jeffreys-smoothed public frequency k_j / m;
  a column never seen set in the public rows still gets p_j > 0).
- Exclusive groups (one-hot factors such as ``tissue=...``; by default the columns whose names
  share a prefix before ``=`` and that are never set together in the public rows): at most
  one column of a group is 1; the category (or "none of them") is drawn from
  Dirichlet(public counts + 1/2) probabilities.
- Other columns (continuous or more than two levels): a smoothed bootstrap of the public
  values (resample, add Gaussian jitter with Silverman's bandwidth).
- Columns are independent given those parameters (10 public rows cannot estimate a
  correlation); groups are the only dependence modelled, except that ``row_bootstrap`` = w (default 0.5):
  then a share w of the rows are copies of random public rows (their co-occurrence pattern
  kept; the column frequencies are unchanged in expectation up to the smoothing).
- Then the *public* pre-processing: centre with the public means, rows to unit L2 norm.
- Target: y = y_mean + delta + c^T beta + e with c the centred raw features (the signal acts on
  the biology, not on the normalised rows, so the regression model on the pre-processed rows is
  misspecified as it is on real data), beta ~ N(0, I) rescaled so that Var(c^T beta) =
  R^2 sigma_y^2, R^2 ~ Beta(a, b) (default Beta(2, 20), mean 0.091: a modest signal, chosen
  so that non-private Spearman at n = 700 is about the published 0.25 (Honkela et al. 2018,
  public), not from any data here),
  sigma_y^2 drawn from its posterior given the public target (scaled inverse chi^2 with m - 1
  degrees of freedom), e = sqrt(1 - R^2) sigma_y z with z a smoothed bootstrap of the
  standardised public targets (keeps their skew and tails), and delta ~ N(0, sigma_y^2 / m) the
  error of the public target mean the sites centre with. y is then centred with the public
  mean, as the sites do.

``sample`` returns private training rows, held-out test rows and ``m`` public rows of the same
population (the public-only baseline of a forecast is fitted on those, not on the real public
rows, so that its truth is the population's).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dpfed.preprocess import Preprocessing, public_sigmas

__all__ = ["AuxiliarySource", "AuxiliaryData", "exclusive_groups", "DEFAULT_R2_PRIOR",
           "gaussian_auxiliary", "DEFAULT_ROW_BOOTSTRAP"]

#: Beta(a, b) prior of the population R^2 of the linear signal (mean a / (a + b) = 0.091).
DEFAULT_R2_PRIOR = (2.0, 20.0)
#: Share of auxiliary rows copied from public rows (benchmarks/bounds_gdsc.py: 0.5 chose better
#: bounds on GDSC than independent columns, whose search over-values ridge shrinkage).
DEFAULT_ROW_BOOTSTRAP = 0.5


@dataclass(frozen=True)
class AuxiliaryData:
    """One auxiliary population's rows, pre-processed with the public parameters.

    ``x``/``y``: private training rows (pre-processed, y centred with the public mean);
    ``x_public``/``y_public``: m rows of the same population standing in for the public rows
    (pre-processed the same way); ``x_test`` pre-processed, ``y_test`` raw (for ranks);
    ``r2`` and ``sigma_y``: the population's drawn parameters (for diagnostics).
    """

    x: np.ndarray
    y: np.ndarray
    x_public: np.ndarray
    y_public: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    r2: float = float("nan")
    sigma_y: float = float("nan")


def exclusive_groups(x_public: np.ndarray, feature_names: Sequence[str] | None) -> tuple[tuple[int, ...], ...]:
    """One-hot groups among binary columns: names ``prefix=value`` with the same prefix (e.g.
    ``tissue=lung_NSCLC``, ``tissue=leukemia``) that are never 1 together in the public rows.
    Groups of one column are dropped (a plain binary column). Names are public (round.toml)."""
    if not feature_names:
        return ()
    x = np.asarray(x_public, dtype=np.float64)
    by_prefix: dict[str, list[int]] = {}
    for j, name in enumerate(feature_names):
        if "=" in name and _is_binary(x[:, j]):
            by_prefix.setdefault(name.split("=", 1)[0], []).append(j)
    groups = []
    for cols in by_prefix.values():
        if len(cols) >= 2 and np.all(x[:, cols].sum(axis=1) <= 1):
            groups.append(tuple(cols))
    return tuple(groups)


def _is_binary(col: np.ndarray) -> bool:
    return bool(np.all((col == 0) | (col == 1)))


@dataclass(frozen=True, eq=False)
class AuxiliarySource:
    """Draws auxiliary populations shaped like the public rows (module docstring).

    ``x_public`` (m x d raw features) and ``y_public`` (m raw targets) must be *public* rows;
    ``preprocessing`` the round's public pre-processing. ``groups`` overrides the exclusive
    groups found from ``feature_names``; ``r2_prior`` is Beta(a, b) of the signal's R^2.

    ``r2_from_public`` (default False: the R^2 is drawn from ``r2_prior`` alone): each
    population's R^2 is drawn from its posterior given the public rows (``r2_posterior``):
    ``r2_prior`` times the marginal likelihood of the public target under the sampler's own
    model (signal c^T beta with beta ~ N(0, s^2 I) of variance R^2 sigma_y^2, noise of
    variance (1 - R^2) sigma_y^2, sigma_y integrated under a Jeffreys prior, the mean
    profiled out). ``row_jitter`` (default False): rows copied from public rows
    (``row_bootstrap``) get the continuous columns' smoothed-bootstrap jitter (Silverman's
    bandwidth), so that ``row_bootstrap = 1`` (every row a public row's copy, the columns'
    dependence kept) still gives a full-rank design when d >= m. ``condition_on_public``
    (default False; needs ``r2_from_public``): each population is drawn from its posterior
    given the public rows, not from the prior: R^2, then sigma_y^2 and beta from their
    conditional posteriors given the public target (Gaussian, conjugate), and the population's
    public rows *are* the real public rows (so a public-only model fitted on them is the
    round's own, and the signal it misses is what the public rows leave unknown).
    """

    x_public: np.ndarray
    y_public: np.ndarray
    preprocessing: Preprocessing
    feature_names: tuple[str, ...] | None = None
    groups: tuple[tuple[int, ...], ...] | None = None
    r2_prior: tuple[float, float] = DEFAULT_R2_PRIOR
    row_bootstrap: float = DEFAULT_ROW_BOOTSTRAP
    r2_from_public: bool = False
    row_jitter: bool = False
    condition_on_public: bool = False
    _kinds: tuple = field(init=False, repr=False)

    def __post_init__(self):
        x = np.array(self.x_public, dtype=np.float64)
        y = np.array(self.y_public, dtype=np.float64).ravel()
        if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] < 2:
            raise ValueError("public rows must be m x d features and m targets with m >= 2")
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise ValueError("public rows contain NaN or infinite values")
        if x.shape[1] != self.preprocessing.dim:
            raise ValueError(f"pre-processing has {self.preprocessing.dim} features, public rows {x.shape[1]}")
        if not 0.0 <= float(self.row_bootstrap) <= 1.0:
            raise ValueError("row_bootstrap must be in [0, 1]")
        object.__setattr__(self, "row_bootstrap", float(self.row_bootstrap))
        a, b = (float(v) for v in self.r2_prior)
        if not (a > 0 and b > 0):
            raise ValueError("r2_prior must be two positive numbers")
        x.setflags(write=False)
        y.setflags(write=False)
        object.__setattr__(self, "x_public", x)
        object.__setattr__(self, "y_public", y)
        object.__setattr__(self, "r2_prior", (a, b))
        names = tuple(self.feature_names) if self.feature_names else None
        if names is not None and len(names) != x.shape[1]:
            raise ValueError(f"{len(names)} feature names for {x.shape[1]} columns")
        object.__setattr__(self, "feature_names", names)
        groups = self.groups if self.groups is not None else exclusive_groups(x, names)
        groups = tuple(tuple(int(j) for j in g) for g in groups)
        seen = [j for g in groups for j in g]
        if len(seen) != len(set(seen)) or any(not 0 <= j < x.shape[1] for j in seen):
            raise ValueError("exclusive groups must be disjoint column indices")
        for g in groups:
            if not all(_is_binary(x[:, j]) for j in g):
                raise ValueError("exclusive groups must be binary columns")
        object.__setattr__(self, "groups", groups)
        grouped = set(seen)
        kinds = []
        for j in range(x.shape[1]):
            if j in grouped:
                continue
            kinds.append((j, "binary" if _is_binary(x[:, j]) else "continuous"))
        object.__setattr__(self, "_kinds", tuple(kinds))

    # -- public summaries ---------------------------------------------------------------------

    @property
    def m(self) -> int:
        return int(self.x_public.shape[0])

    @property
    def d(self) -> int:
        return int(self.x_public.shape[1])

    def scales(self) -> tuple[float, float]:
        """(sigma_x, sigma_y) of the public rows (``dpfed.preprocess.public_sigmas``): the
        bounds' scale."""
        return public_sigmas(self.x_public, self.y_public, self.preprocessing)

    def column_kinds(self) -> dict[int, str]:
        out = {j: k for j, k in self._kinds}
        for g in self.groups:
            out.update({j: "exclusive" for j in g})
        return dict(sorted(out.items()))

    def digest(self) -> str:
        """A stable key of every input (for caches)."""
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.x_public).tobytes())
        h.update(np.ascontiguousarray(self.y_public).tobytes())
        h.update(self.preprocessing.to_json().encode())
        h.update(repr((self.groups, self.r2_prior, self.x_public.shape,
                       self.row_bootstrap)).encode())
        if self.r2_from_public or self.row_jitter or self.condition_on_public:
            h.update(repr((self.r2_from_public, self.row_jitter,   # defaults' keys unchanged
                           self.condition_on_public)).encode())
        return h.hexdigest()[:32]

    # -- sampling ------------------------------------------------------------------------------

    def _features(self, rng: np.random.Generator, params: dict, rows: int) -> np.ndarray:
        x = np.empty((rows, self.d))
        for j, kind in self._kinds:
            if kind == "binary":
                x[:, j] = rng.random(rows) < params[j]
            else:
                col = self.x_public[:, j]
                sd = float(np.std(col, ddof=1))
                bw = 1.06 * sd * self.m ** (-0.2) if sd > 0 else 0.0
                x[:, j] = rng.choice(col, size=rows) + bw * rng.standard_normal(rows)
        for g in self.groups:
            probs = params[g]
            cat = rng.choice(len(g) + 1, size=rows, p=probs)   # last category: none
            for i, j in enumerate(g):
                x[:, j] = cat == i
        if self.row_bootstrap > 0:
            # Copy whole public rows for a share of the rows: keeps their co-occurrence pattern
            # (e.g. a mutation common in one tissue), which independent columns lose.
            copy = rng.random(rows) < self.row_bootstrap
            x[copy] = self.x_public[rng.integers(0, self.m, size=int(copy.sum()))]
            if self.row_jitter:
                k = int(copy.sum())
                for j, kind in self._kinds:
                    if kind == "continuous":
                        sd = float(np.std(self.x_public[:, j], ddof=1))
                        if sd > 0:
                            x[copy, j] += 1.06 * sd * self.m ** (-0.2) * rng.standard_normal(k)
        return x

    def _centred_public(self) -> np.ndarray:
        pre = self.preprocessing
        c = self.x_public - np.asarray(pre.x_mean)
        if pre.x_scale:
            c = c / np.asarray(pre.x_scale)
        return c

    def r2_posterior(self, grid_size: int = 200) -> tuple[np.ndarray, np.ndarray]:
        """(grid of R^2, posterior probabilities) given the public rows (class docstring,
        ``r2_from_public``). Public rows only. The model is ``sample``'s: public signal
        covariance R^2 sigma_y^2 K with K = C C^T / (tr(C C^T) / m), C the centred raw
        features in the round's column units; sigma_y^2 under p(s^2) ~ 1 / s^2 integrated
        out; the public mean profiled out (the m - 1 contrasts orthogonal to 1)."""
        m = self.m
        grid = (np.arange(grid_size) + 0.5) / grid_size
        a, b = self.r2_prior
        log_prior = (a - 1) * np.log(grid) + (b - 1) * np.log1p(-grid)
        c = self._centred_public()
        g = c @ c.T
        tr = float(np.trace(g))
        y = self.y_public - self.y_public.mean()
        if not (tr > 0 and m >= 3 and float(y @ y) > 0):
            w = np.exp(log_prior - log_prior.max())
            return grid, w / w.sum()
        k = g / (tr / m)
        ev, vec = np.linalg.eigh(np.eye(m) - np.full((m, m), 1.0 / m))
        h = vec[:, ev > 0.5]                          # m x (m - 1) contrasts
        kk, u = np.linalg.eigh(h.T @ k @ h)
        z2 = (u.T @ (h.T @ y)) ** 2
        lam = (1.0 - grid)[:, None] + grid[:, None] * np.maximum(kk, 0.0)[None, :]
        ll = -0.5 * np.log(lam).sum(axis=1) - 0.5 * (m - 1) * np.log((z2[None, :] / lam).sum(axis=1))
        lp = ll + log_prior
        w = np.exp(lp - lp.max())
        return grid, w / w.sum()

    def _draw_r2(self, rng: np.random.Generator) -> float:
        if not self.r2_from_public:
            return float(rng.beta(*self.r2_prior))
        cached = self.__dict__.get("_r2_cache")
        if cached is None:
            cached = self.r2_posterior()
            object.__setattr__(self, "_r2_cache", cached)
        grid, w = cached
        step = grid[1] - grid[0] if grid.size > 1 else 0.0
        r2 = float(rng.choice(grid, p=w) + step * (rng.random() - 0.5))
        return min(max(r2, 1e-6), 1 - 1e-6)

    def sample_raw_features(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        """Raw (not pre-processed) features of ``rows`` rows of one new population."""
        return self._features(rng, self._parameters(rng), int(rows))

    def _parameters(self, rng: np.random.Generator) -> dict:
        params: dict = {}
        m = self.m
        for j, kind in self._kinds:
            if kind == "binary":
                k = float(self.x_public[:, j].sum())
                params[j] = rng.beta(k + 0.5, m - k + 0.5)
        for g in self.groups:
            counts = self.x_public[:, list(g)].sum(axis=0)
            counts = np.append(counts, m - counts.sum())
            params[g] = rng.dirichlet(counts + 0.5)
        return params

    def sample(self, rng: np.random.Generator, n: int, n_test: int = 100,
               n_public: int | None = None) -> AuxiliaryData:
        """One auxiliary population: ``n`` private rows, ``n_test`` test rows and ``n_public``
        (default m, the number of real public rows) public rows (module docstring)."""
        n_public = self.m if n_public is None else int(n_public)
        if n < 1 or n_test < 2 or n_public < 0:
            raise ValueError("need n >= 1, n_test >= 2, n_public >= 0")
        params = self._parameters(rng)
        total = n + n_test + n_public
        x_raw = self._features(rng, params, total)
        pre = self.preprocessing
        centred = x_raw - np.asarray(pre.x_mean)
        if pre.x_scale:   # the signal acts on the columns in the round's public units
            centred = centred / np.asarray(pre.x_scale)
        m = self.m
        y_pub = self.y_public
        s_pub = float(np.std(y_pub, ddof=1))
        if not (math.isfinite(s_pub) and s_pub > 0):
            s_pub = 1.0
        sigma_y = s_pub * math.sqrt((m - 1) / rng.chisquare(m - 1))
        r2 = self._draw_r2(rng)
        if self.condition_on_public:
            beta, sigma_y = self._conditional_beta(rng, r2)
            signal = centred @ beta
        else:
            beta = rng.standard_normal(self.d)
            signal = self._unscaled_signal(rng, centred, beta)
            sd_signal = float(np.std(signal))
            signal = signal * (math.sqrt(r2) * sigma_y / sd_signal) if sd_signal > 0 else 0.0 * signal
        z_pub = (y_pub - y_pub.mean()) / (float(np.std(y_pub)) or 1.0)
        h = 0.5   # smoothed bootstrap: sqrt(1 - h^2) * resample + h * N(0, 1) keeps variance 1
        z = math.sqrt(1 - h * h) * rng.choice(z_pub, size=total) + h * rng.standard_normal(total)
        row_scale = self._residual_row_scale(rng, total)
        if row_scale is not None:
            z = z * row_scale
        noise = math.sqrt(1.0 - r2) * sigma_y * z
        delta = sigma_y / math.sqrt(m) * rng.standard_normal()
        if self.condition_on_public:
            # The population's mean given the public mean (the signal is centred on the public
            # rows): the residual's share of sigma_y.
            delta = math.sqrt(1.0 - r2) * sigma_y / math.sqrt(m) * rng.standard_normal()
        y_raw = pre.y_mean + delta + signal + noise
        x_all = pre.transform_x(x_raw)
        y_all = pre.transform_y(y_raw)
        i1, i2 = n, n + n_test
        if self.condition_on_public:
            xp_, yp_ = pre.apply(self.x_public, self.y_public)
            return AuxiliaryData(x_all[:i1], y_all[:i1], xp_, yp_, x_all[i1:i2],
                                 y_raw[i1:i2], r2, sigma_y)
        return AuxiliaryData(x_all[:i1], y_all[:i1], x_all[i2:], y_all[i2:],
                             x_all[i1:i2], y_raw[i1:i2], r2, sigma_y)

    # The two steps of ``sample`` a subclass may replace (dpfed_apps.forecast_response draws a
    # non-linear signal and Student-t residuals through them), so that the rest of a population
    # (features, R^2, sigma_y, the target mean's error, the pre-processing) has one
    # implementation. They return the default model's values without drawing anything, so the
    # default populations' draws are those of a sampler without them.

    def _unscaled_signal(self, rng: np.random.Generator, centred: np.ndarray,
                         beta: np.ndarray) -> np.ndarray:
        """The signal on the population's rows up to its scale: ``sample`` rescales it to sd
        sqrt(R^2) sigma_y (module docstring, "Target"). Here the linear c^T beta, ``centred``
        the rows' centred raw features in the round's column units (c), ``beta`` ~ N(0, I)
        already drawn. An override may draw from ``rng`` (after beta, before the residual).
        Not called with ``condition_on_public``: beta's posterior there is this linear
        model's."""
        return centred @ beta

    def _residual_row_scale(self, rng: np.random.Generator, rows: int) -> np.ndarray | None:
        """A factor per row for the standardised residual z (module docstring, "Target"), drawn
        after z and before the target mean's error; None: z as drawn (the default). An
        override should keep E[factor^2] = 1 so that the residual's variance stays
        (1 - R^2) sigma_y^2."""
        return None

    def _conditional_beta(self, rng: np.random.Generator, r2: float) -> tuple[np.ndarray, float]:
        """(beta, sigma_y) from their posterior given the public target and R^2 (the model of
        ``r2_posterior``: beta ~ N(0, tau^2 I), tau^2 = R^2 sigma_y^2 / (tr(C^T C) / m),
        residual variance (1 - R^2) sigma_y^2, p(sigma_y^2) ~ 1 / sigma_y^2)."""
        m = self.m
        c = self._centred_public()
        y = self.y_public - self.y_public.mean()
        t = float(np.trace(c.T @ c)) / m
        if not t > 0:
            return np.zeros(self.d), float(np.std(self.y_public, ddof=1) or 1.0)
        k = (c @ c.T) / t
        v = (1.0 - r2) * np.eye(m) + r2 * k
        ev, vec = np.linalg.eigh(np.eye(m) - np.full((m, m), 1.0 / m))
        h = vec[:, ev > 0.5]
        yh = h.T @ y
        q = float(yh @ np.linalg.solve(h.T @ v @ h, yh))
        sigma2 = q / rng.chisquare(m - 1)
        noise_var = max((1.0 - r2) * sigma2, 1e-12)
        prec = c.T @ c / noise_var + np.eye(self.d) * (t / max(r2 * sigma2, 1e-12))
        chol = np.linalg.cholesky(prec)
        mean = np.linalg.solve(prec, c.T @ y / noise_var)
        beta = mean + np.linalg.solve(chol.T, rng.standard_normal(self.d))
        return beta, math.sqrt(sigma2)


def gaussian_auxiliary(rng: np.random.Generator, n: int, d: int, n_test: int) -> AuxiliaryData:
    """The paper's auxiliary data (Nieminen 2017 model (3.11); ``dpfed.bounds``): x ~ N(0, I)
    centred with its own means and rows normalised, beta ~ N(0, I), y ~ N(x^T beta, 1), no
    public rows. Same draws as ``dpfed.bounds._auxiliary_dataset``."""
    x_raw = rng.standard_normal((n + n_test, d))
    pre = Preprocessing(tuple(x_raw[:n].mean(axis=0)), 0.0, True, source="synthetic")
    x_all = pre.transform_x(x_raw)
    beta = rng.standard_normal(d)
    y_all = x_all @ beta + rng.standard_normal(n + n_test)
    y = y_all[:n] - y_all[:n].mean()
    return AuxiliaryData(x_all[:n], y, np.zeros((0, d)), np.zeros(0), x_all[n:], y_all[n:])
