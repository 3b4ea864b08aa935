"""Every GDSC drug in one round: the joint Gaussian / Laplace release against per-drug rounds
(issue 23, "Targets"; docs/evaluation.md "Every drug in one round").

    python benchmarks/joint_gdsc_study.py [--drugs N] [--repeats R] [--n 700 300] [--seed S]
        [--y-bound B | --choose-y-bound] [--rows ROW,...] [--json out.json] [--uci]

Panel: the 988 GDSC v17 cell lines with genomic features (the patients) and the 262 drugs with
at least 400 measured lines (``dpfed_apps.evaluation.protocol.eligible_drugs``; 82 % of the
line x drug matrix is filled). d = 10 default features (``dpfed.datasets.default_feature_names``).

Per repeat (one permutation of the 988 lines, seeded by (seed, 23, repeat)): 10 public lines
shared by every drug, the held-out test lines (988 - 10 - 700 = 278, the same for every n) and
the private pool; the private training set of size n is the pool's first n lines (nested, as in
``dpfed_apps.evaluation.protocol``). Each drug's fit sees the lines that have its response.
Pre-processing as the single-drug evaluation (``Preprocessing.from_public_data(scale_columns=
True)`` on the public lines: centre, rows to unit norm); x bounds as it chooses them
(``repeat_bounds``: omega_x ~3.2 sigma_x > 1, i.e. no box clipping, rows in the unit ball:
x_bound = 1, x_norm_bound = 1). Responses standardised per drug by the public lines' mean and sd
(what the coordinator writes in each TargetSpec; ``public_centre_scale``), clipped to +-y_bound
in those units; y_bound chosen on synthetic panels (``--choose-y-bound``; never on test lines).

Rows (all per-patient privacy, add/remove; the ``ROWS`` table): the joint Gaussian release of
all 262 drugs at (eps 10, delta 1e-6), K = 1, K = 10 independent sites and K = 10 secure
(Skellam shares, ``secure_sum``); the joint Laplace
release at pure eps 10; one drug per round at eps 10/262 (Laplace, 262 rounds compose to 10);
per-drug Gaussian rounds (mu = mu(10, 1e-6) / sqrt(262) each: 262 GDP rounds compose to mu);
one drug in one Laplace round at eps 2 (today's single-drug headline mechanism) and the same drug
in a Gaussian round of one target at (eps 2, delta 1e-6) (should Gaussian be the single-target
default?); public-only (10 public lines) and non-private (exact statistics of the same lines).
Every private row uses the product's pieces: ``dpfed.joint_noise.joint_calibration``, the site's
release (``site_node.joint_release.release_joint_statistics``; ``site_node.release`` for the
Laplace single-target rounds), ``dpfed.joint_targets.target_statistics`` for each target's view,
and ``posterior.fit_posterior`` (default "auto": noise-aware, NUTS if refused) as the aggregator
calls it (public statistics of the target as ``public``, x_bound, y_unit = y_bound).

Scores per drug (the lines of the test set that have its response): Spearman of x_test beta
(posterior mean) against the measured response, NaN (a constant prediction) scored as 0;
private / non-private = mean over drugs and repeats of each; drugs at or above public-only
(per-drug mean over repeats); coverage of 90 % intervals of the HELD-OUT least-squares
coefficients: per coefficient, |b_test - m| <= 1.645 sqrt(v_post + v_test), with m, v_post the
posterior mean and variance and b_test, v_test the least squares of clip(y, y_bound) on the
test lines and its sampling variance (the held-out estimate's own error is added, so a
calibrated posterior covers ~90 %).

Joint rounds are fitted as the aggregator fits them: from ``aggregator.joint_prior.MIN_TARGETS``
targets on, every target's prior is centred at the across-target mean m0 of the release
(``aggregator.joint_prior``; ``--zero-mean``: centred at 0, the fit of the earlier tables).
Rows scored on the K = 1 joint Gaussian release itself (``SAME_RELEASE_ROWS``, paired with it,
not in the default rows): the prior centred at 0, the closed-form noise-matched ridge at c = 2 /
8 / 32 (and c = 8 around m0), and an oracle with the exact counts (diagnostic only).

Randomness: release noise from OpenDP / the site's samplers (CSPRNG, not seedable); fit seeds
and the splits from ``--seed``. Progress on stderr. ``--no-nuts``: a refused noise-aware fit is
counted and scored as beta = 0 instead of falling back to NUTS (minutes of PyMC compilation on
a loaded machine); the docs' runs use it (refusals only in the near-public-only Laplace rows).
Quick mode: ``--drugs 5 --repeats 1 --n 700`` (~6 s; tests/test_joint_study.py runs 10 drugs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EPSILON = 10.0
DELTA = 1e-6
N_PUBLIC = 10
X_BOUND = 1.0
X_NORM_BOUND = 1.0
Z90 = 1.6448536269514722
#: y bound (public sd units) chosen by ``--choose-y-bound`` on synthetic panels (6 panels x 60
#: targets: 0.25-1.0 within 2 se, 0.5 best on the mean ratio; docs/evaluation.md).
DEFAULT_Y_BOUND = 0.5
#: The joint split the same search preferred (``--split``; docs/evaluation.md: +0.008 / +0.014
#: on GDSC at n = 700 / 300 over the placeholder ``dpfed.joint_noise.JOINT_DEFAULT_SPLIT``).
TUNED_SPLIT = (0.05, 0.90, 0.03, 0.02)
Y_BOUND_GRID = (0.35, 0.5, 1.0)

#: row -> what it is (the table's first column).
ROWS = {
    "joint_gauss": "joint Gaussian, all drugs, (10, 1e-6), K = 1",
    "joint_gauss_k10": "joint Gaussian, all drugs, (10, 1e-6), K = 10 independent sites",
    "joint_gauss_k10_secure": "joint Gaussian, all drugs, (10, 1e-6), K = 10 secure (Skellam)",
    "joint_laplace": "joint Laplace, all drugs, pure eps 10",
    "per_drug_laplace": "one drug per round, Laplace eps 10/262",
    "per_drug_gauss": "one drug per round, Gaussian mu(10, 1e-6)/sqrt(262)",
    "single_laplace_eps2": "one drug, Laplace eps 2 (today's single-drug round)",
    "single_gauss_eps2": "one drug, Gaussian (2, 1e-6) (m = 1 joint round)",
    "public": "public only (10 lines)",
    "nonprivate": "non-private",
    "joint_gauss_zero_mean": "joint Gaussian K = 1, the same release, prior centred at 0 "
                             "(the fit before aggregator.joint_prior)",
    "joint_gauss_exact_n": "joint Gaussian K = 1, the same release, exact counts (oracle, "
                           "diagnostic only)",
    "joint_gauss_ridge_c2": "joint Gaussian K = 1, the same release, closed-form ridge c = 2",
    "joint_gauss_ridge_c8": "joint Gaussian K = 1, the same release, closed-form ridge c = 8",
    "joint_gauss_ridge_c32": "joint Gaussian K = 1, the same release, closed-form ridge c = 32",
    "joint_gauss_ridge_c8_prior_mean": "joint Gaussian K = 1, the same release, ridge c = 8 "
                                       "around the across-drug mean",
}
#: Rows scored on the joint Gaussian K = 1 row's release (paired with it; diagnostics and the
#: across-drug prior mean). Not in the default rows.
SAME_RELEASE_ROWS = ("joint_gauss_zero_mean", "joint_gauss_exact_n", "joint_gauss_ridge_c2",
                     "joint_gauss_ridge_c8", "joint_gauss_ridge_c32",
                     "joint_gauss_ridge_c8_prior_mean")
DEFAULT_ROWS = tuple(r for r in ROWS if r not in SAME_RELEASE_ROWS)
ROW_INDEX = {r: i for i, r in enumerate(ROWS)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the panel --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Panel:
    """Raw features of every line with features, ln IC50 of the eligible drugs (NaN: missing)."""

    line_ids: np.ndarray
    x_raw: np.ndarray           # (L, d)
    y_raw: np.ndarray           # (L, m)
    drugs: tuple[int, ...]
    feature_names: tuple[str, ...]

    @property
    def m(self) -> int:
        return len(self.drugs)


def load_panel() -> Panel:
    from dpfed import datasets
    from dpfed_apps.evaluation.protocol import eligible_drugs

    names = datasets.default_feature_names()
    table = datasets.load_responses()
    known = set(int(i) for i in datasets.load_genomic_features().line_ids)
    keep = np.array([int(i) in known for i in table.line_ids])
    ids = table.line_ids[keep]
    drugs = tuple(eligible_drugs())
    cols = [table.drug_ids.index(d) for d in drugs]
    return Panel(ids, datasets.feature_matrix(names, ids), np.array(table.ln_ic50[keep][:, cols]),
                 drugs, tuple(names))


def public_centre_scale(y_public: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-target public centre and scale (TargetSpec.y_mean, y_scale) from the public lines'
    responses (p, m) with NaN: mean and sd (ddof 1) of the public responses; a drug with fewer
    than 2 public responses (or sd 0) gets the median sd of the others, and with none the mean
    of every public response. All public. Returns (mean, scale, number of drugs using a
    fallback)."""
    y = np.asarray(y_public, dtype=np.float64)
    count = np.sum(np.isfinite(y), axis=0)
    mean = np.array([np.nanmean(c) if k > 0 else np.nan for c, k in zip(y.T, count)])
    sd = np.array([np.nanstd(c, ddof=1) if k >= 2 else np.nan for c, k in zip(y.T, count)])
    ok = np.isfinite(sd) & (sd > 0)
    fallback = int(np.sum(~ok | ~np.isfinite(mean)))
    sd = np.where(ok, sd, np.median(sd[ok]) if ok.any() else 1.0)
    mean = np.where(np.isfinite(mean), mean, np.nanmean(y) if np.isfinite(y).any() else 0.0)
    return mean, sd, fallback


@dataclass
class Cell:
    """One repeat's data after the public pre-processing: standardised responses z (NaN
    missing), lines split into public / pool (nested prefixes) / test."""

    x: np.ndarray               # (L, d) pre-processed
    z: np.ndarray               # (L, m) standardised (public centre / scale), NaN missing
    public: np.ndarray
    pool: np.ndarray
    test: np.ndarray
    fallback: int = 0
    meta: dict = field(default_factory=dict)


def repeat_cell(panel: Panel, repeat: int, seed: int, n_max: int) -> Cell:
    from dpfed.preprocess import Preprocessing

    total = panel.x_raw.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 23, repeat]))
    order = rng.permutation(total)
    public = np.sort(order[:N_PUBLIC])
    pool = order[N_PUBLIC:N_PUBLIC + n_max]
    test = np.sort(order[N_PUBLIC + n_max:])
    prep = Preprocessing.from_public_data(panel.x_raw[public], np.zeros(public.size),
                                          scale_columns=True)
    mean, scale, fb = public_centre_scale(panel.y_raw[public])
    return Cell(prep.transform_x(panel.x_raw), (panel.y_raw - mean) / scale, public, pool, test,
                fb, dict(preprocessing=prep))


# -- releases ---------------------------------------------------------------------------------

def _local_release(x, y, cal):
    """Stand-in for site_node.joint_release.release_joint_statistics until it lands: exact
    clipped joint statistics plus OpenDP noise with the calibration's per-part parameters."""
    from dpfed.joint_statistics import joint_exact_statistics
    from site_node.gaussian import add_gaussian_noise
    from site_node.laplace import add_count_noise, add_laplace_noise

    ex = joint_exact_statistics(x, y, cal.x_bound, cal.y_bound, cal.x_norm_bound)
    d, m = ex.dim, ex.targets
    iu = np.triu_indices(d)
    counts = [int(ex.n_x)] + [int(v) for v in ex.n]
    if cal.mechanism == "gaussian":
        def noisy(part, values):
            return add_gaussian_noise(values, cal.sensitivities[part], cal.losses[part])[0]
        cnt = np.rint(noisy("n", np.asarray(counts, dtype=np.float64))).astype(np.int64)
    else:
        def noisy(part, values):
            return add_laplace_noise(values, cal.sensitivities[part], cal.losses[part])[0]
        cnt = np.asarray(add_count_noise(counts, cal.losses["n"])[0], dtype=np.int64)
    up = noisy("xtx", ex.xtx[iu])
    xtx = np.zeros((d, d))
    xtx[iu] = up
    xtx = xtx + np.triu(xtx, 1).T
    xty = noisy("xty", ex.xty.ravel()).reshape(m, d)
    yty = noisy("yty", ex.yty)
    from dpfed.joint_statistics import JointStatistics
    return JointStatistics(xtx, int(max(cnt[0], 0)), xty, yty, np.maximum(cnt[1:], 0),
                           cal.noise())


def secure_sum(blocks, cal):
    """What a secure round of K = len(blocks) sites with the joint Gaussian calibration hands
    the aggregator, simulated: each site's exact clipped joint statistics on a fixed-point grid
    per part (gamma_p = 2^floor(log2(sigma_p / 16)), counts on grid 1) plus its share of
    Skellam noise (``dpfed.secagg.skellam.noise_share``, T = K: the K shares sum to one
    Sk(lam_p) draw, lam_p = ``lam_for_rho``(Delta_p / gamma_p, rho_p), the variance of the
    central Gaussian), summed and decoded. Masks are not simulated (they cancel exactly in the
    modular sum, tests/evaluation/test_secure_aggregation.py). Simplifications: the sums, not
    each row, are rounded to the grid; the lam is the variance-matched one (the accountant
    charges the Skellam's eq. A2, slightly above rho: ``dpfed.secagg.skellam``), so this is
    the secure round's utility at equal noise variance; the aggregator's noise description is
    the central one (same variance per entry)."""
    from dpfed.joint_statistics import JointStatistics, joint_exact_statistics
    from dpfed.secagg.skellam import lam_for_rho, noise_share

    k = len(blocks)
    parts = ("xtx", "xty", "yty", "n")
    grid = {p: 1.0 if p == "n" else 2.0 ** math.floor(math.log2(cal.scales[p] / 16.0))
            for p in parts}
    lam = {p: lam_for_rho(cal.sensitivities[p] / grid[p], cal.losses[p]) for p in parts}
    total = None
    for x, y in blocks:
        ex = joint_exact_statistics(x, y, cal.x_bound, cal.y_bound, cal.x_norm_bound)
        d, m = ex.dim, ex.targets
        iu = np.triu_indices(d)
        vals = {"xtx": ex.xtx[iu], "xty": ex.xty.ravel(), "yty": ex.yty,
                "n": np.concatenate([[ex.n_x], ex.n]).astype(np.float64)}
        site = {p: np.rint(vals[p] / grid[p]).astype(np.int64) +
                noise_share(np.full(vals[p].size, lam[p]), k) for p in parts}
        total = site if total is None else {p: total[p] + site[p] for p in parts}
    dec = {p: total[p] * grid[p] for p in parts}
    xtx = np.zeros((d, d))
    xtx[iu] = dec["xtx"]
    xtx = xtx + np.triu(xtx, 1).T
    counts = np.maximum(np.rint(dec["n"]), 0).astype(np.int64)
    return JointStatistics(xtx, int(counts[0]), dec["xty"].reshape(m, d), dec["yty"],
                           counts[1:], cal.noise())


RELEASE_USED: dict = {}


def release_joint(x, y, cal):
    """The site's joint release: ``site_node.joint_release.release_joint_statistics`` when it
    is importable and works with this calibration, else the local stand-in (recorded in
    ``RELEASE_USED`` and in the JSON: the two draw the same law from the same samplers)."""
    if RELEASE_USED.get("function") != "local stand-in":
        try:
            from site_node.joint_release import release_joint_statistics
            out = release_joint_statistics(x, y, cal)
            RELEASE_USED["function"] = "site_node.joint_release.release_joint_statistics"
            return out
        except (ImportError, AttributeError, TypeError) as exc:
            log(f"site_node.joint_release unusable ({type(exc).__name__}: {exc}): "
                "local stand-in")
            RELEASE_USED["function"] = "local stand-in"
    return _local_release(x, y, cal)


#: Budget split (Sxx, Sxy, Syy, counts) of the releases of m > 1 targets (``--split``);
#: None: ``dpfed.joint_noise.JOINT_DEFAULT_SPLIT``. One-target rounds keep the default.
JOINT_SPLIT: dict = {"split": None}


def joint_calibration(m: int, mechanism: str, epsilon: float, y_bound: float, d: int, *,
                      x_bound: float = X_BOUND, x_norm_bound: float | None = X_NORM_BOUND):
    from dpfed.joint_noise import joint_calibration as jc

    return jc(d, m, mechanism=mechanism, epsilon=epsilon,
              delta=DELTA if mechanism == "gaussian" else 0.0, x_bound=x_bound,
              y_bound=y_bound, x_norm_bound=x_norm_bound,
              budget_split=JOINT_SPLIT["split"] if m > 1 else None)


def per_round_epsilon(rounds: int, epsilon: float = EPSILON, delta: float = DELTA) -> float:
    """eps_1 with mu(eps_1, delta) = mu(epsilon, delta) / sqrt(rounds): a Gaussian round of
    one target at (eps_1, delta) has GDP parameter mu_1, and ``rounds`` of them compose to
    sqrt(rounds) mu_1 = mu(epsilon, delta) (Dong, Roth & Su 2019), i.e. (epsilon, delta)."""
    from dpfed.gaussian import mu_for_epsilon_delta

    target = mu_for_epsilon_delta(epsilon, delta) / math.sqrt(rounds)
    lo, hi = 1e-6, epsilon
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if mu_for_epsilon_delta(mid, delta) < target:
            lo = mid
        else:
            hi = mid
    return hi


# -- fits and scores --------------------------------------------------------------------------

def target_view(joint, j: int, public, k: int | None = None, *, x_bound: float = X_BOUND,
                x_norm_bound: float | None = X_NORM_BOUND):
    """(statistics, public) the fit of target ``j`` sees, as the aggregator builds them
    (``aggregator.joint_fit.target_inputs``): ``dpfed.joint_targets.target_statistics`` of the
    joint sum, the public rows' second moments bounding the MCAR sampling variance, plus the
    target's exact public statistics (None without public responses). ``k``: the target's
    index in ``joint`` when it differs from j (a one-target round)."""
    from dpfed.joint_targets import target_statistics

    has_public = public is not None and public.n >= 1
    moments = public.xtx / public.n if has_public else None
    view = target_statistics(joint, j if k is None else k, x_bound=x_bound,
                             x_norm_bound=x_norm_bound, second_moments=moments)
    return (view + public, public) if has_public else (view, None)


#: Joint rounds' fits centred at the across-target mean as the aggregator's
#: (``aggregator.joint_prior``, from its MIN_TARGETS targets on); ``--zero-mean``: at 0, the
#: fit before it (the earlier tables).
PRIOR_MEAN = {"on": True}

#: The fit's fallback when the noise-aware Laplace fit refuses: "nuts" is the production
#: default ("auto"); None (``--no-nuts``) counts the refusal instead (FIT_LOG) and scores it.
FIT = {"fallback": "nuts"}
FIT_LOG: list = []


def fit(stats, public, y_bound, seed, draws, x_bound: float = X_BOUND):
    """posterior.fit_posterior as the aggregator calls it (method "auto": the noise-aware fit,
    NUTS if it refuses): (beta mean, beta variance). Each fit's method and time go to
    ``FIT_LOG``."""
    from posterior import fit_posterior

    t0 = time.perf_counter()
    try:
        post = fit_posterior(stats, public=public, x_bound=x_bound, y_unit=y_bound,
                             draws=draws, seed=seed, fallback=FIT["fallback"])
    except Exception:
        FIT_LOG.append(("refused", time.perf_counter() - t0))
        raise
    FIT_LOG.append((post.method if "fallback_from" not in post.diagnostics else
                    f"{post.method} after {post.diagnostics['fallback_from']}",
                    time.perf_counter() - t0))
    b = np.asarray(post.beta_draws)
    return b.mean(axis=0), b.var(axis=0)


def exact_fit(x, y, seed, draws):
    from dpfed.statistics import exact_statistics
    from posterior import fit_posterior

    if y.size == 0:
        return np.zeros(x.shape[1]), None
    b = np.asarray(fit_posterior(exact_statistics(x, y), draws=draws, seed=seed).beta_draws)
    return b.mean(axis=0), b.var(axis=0)


def spearman0(pred, measured) -> float:
    from dpfed.metrics import spearman

    v = spearman(pred, measured)
    return float(v) if math.isfinite(v) else 0.0


def heldout_ls(x, y, y_bound):
    """Least squares of clip(y, y_bound) on x over held-out lines and its sampling variance
    (None if the design is rank deficient)."""
    yc = np.clip(y, -y_bound, y_bound)
    n, d = x.shape
    if n <= d + 2:
        return None
    g = x.T @ x
    if np.linalg.matrix_rank(g) < d or np.linalg.cond(g) > 1e8:
        return None
    gi = np.linalg.inv(g)
    b = gi @ (x.T @ yc)
    s2 = float(np.sum((yc - x @ b) ** 2)) / (n - d)
    return b, s2 * np.diag(gi)


@dataclass
class Scores:
    spearman: dict = field(default_factory=dict)    # row -> list over fitted drugs
    covered: dict = field(default_factory=dict)     # row -> [covered, total]
    errors: dict = field(default_factory=dict)      # row -> count of refused fits
    seconds: dict = field(default_factory=dict)
    fits: dict = field(default_factory=dict)        # row -> {fit method: count, "max_s"}
    meta: dict = field(default_factory=dict)        # e.g. |m0| of the across-drug prior mean


def _cover(scores: Scores, row: str, mean, var, ls):
    if ls is None or var is None:
        return
    b, v = ls
    hit = np.abs(b - mean) <= Z90 * np.sqrt(var + v)
    c = scores.covered.setdefault(row, [0, 0])
    c[0] += int(hit.sum())
    c[1] += int(hit.size)


def evaluate(cell: Cell, n: int, rows, fit_idx, y_bound: float, *, seed: int, draws: int = 1000,
             public_scores: dict | None = None) -> Scores:
    """Every row of ``rows`` at n private lines; fits of the targets ``fit_idx`` only (the
    joint releases always carry every target of the panel)."""
    from dpfed.joint_statistics import JointStatistics, public_targets
    from dpfed.statistics import clipped_exact_statistics
    from site_node.release import release_statistics

    x, z = cell.x, cell.z
    d, m = x.shape[1], z.shape[1]
    priv = cell.pool[:n]
    xp, zp = x[priv], z[priv]
    xq, zq = x[cell.public], z[cell.public]
    xt, zt = x[cell.test], z[cell.test]
    pubt = public_targets(xq, zq, X_BOUND, y_bound, X_NORM_BOUND)
    seeds = np.random.SeedSequence([seed, n, 5]).generate_state(len(fit_idx) * 16)
    out = Scores()
    tests = []
    for j in fit_idx:
        have = np.isfinite(zt[:, j])
        tests.append((have, heldout_ls(xt[have], zt[have, j], y_bound)))

    def score(row, j, k, mean, var):
        have, ls = tests[k]
        out.spearman.setdefault(row, []).append(spearman0(xt[have] @ mean, zt[have, j]))
        _cover(out, row, mean, var, ls)

    def fit_all(row, view_of, *, prior_mean=None, fitter=None, seed_row=None):
        """Fit and score every target of ``fit_idx`` for ``row``: the posterior (``fit``) or
        ``fitter(stats, public) -> (mean, var)``; with ``prior_mean`` m0 the statistics are
        shifted by m0 and the mean shifted back (aggregator.joint_prior); ``seed_row``: the
        row whose fit seeds to use (paired rows on the same release)."""
        from aggregator.joint_prior import shift

        t0 = time.perf_counter()
        first = len(FIT_LOG)
        for k, j in enumerate(fit_idx):
            try:
                stats, public = view_of(j)
                if prior_mean is not None:
                    stats = shift(stats, prior_mean)
                    public = shift(public, prior_mean) if public is not None else None
                if fitter is None:
                    mean, var = fit(stats, public, y_bound,
                                    int(seeds[16 * k + ROW_INDEX[seed_row or row]]), draws)
                else:
                    mean, var = fitter(stats, public)
                if prior_mean is not None:
                    mean = mean + prior_mean
            except Exception as exc:  # a refused fit is counted, and scored as a zero beta
                out.errors[row] = out.errors.get(row, 0) + 1
                out.errors.setdefault("messages", []).append(f"{row}: {type(exc).__name__}")
                mean, var = np.zeros(d), None
            score(row, j, k, mean, var)
        out.seconds[row] = time.perf_counter() - t0
        methods = [m for m, _ in FIT_LOG[first:]]
        out.fits[row] = {m: methods.count(m) for m in set(methods)}
        out.fits[row]["max_s"] = max((t for _, t in FIT_LOG[first:]), default=0.0)

    def prior_mean_of(total):
        """The aggregator's across-target prior mean of a joint release (all m targets)."""
        from aggregator.joint_prior import pooled_mean
        return pooled_mean(total, [target_view(total, j, pubt[j]) for j in range(m)],
                           x_bound=X_BOUND)

    means = {}

    def aggregator_mean(total):
        """m0 as the aggregator uses it (``aggregator.joint_fit.prior_mean``: from
        ``joint_prior.MIN_TARGETS`` targets on), None with ``--zero-mean``."""
        from aggregator.joint_prior import MIN_TARGETS
        if not PRIOR_MEAN["on"] or m < MIN_TARGETS:
            return None
        if id(total) not in means:
            try:
                means[id(total)] = prior_mean_of(total)
            except Exception as exc:  # the aggregator logs it and fits around 0
                out.errors.setdefault("messages", []).append(f"prior mean: {type(exc).__name__}")
                means[id(total)] = None
        return means[id(total)]

    def joint_row(row, cal, blocks):
        t0 = time.perf_counter()
        total = None
        for b in blocks:
            rel = release_joint(xp[b], zp[b], cal)
            total = rel if total is None else total + rel
        out.seconds[row + ":release"] = time.perf_counter() - t0
        fit_all(row, lambda j: target_view(total, j, pubt[j]), prior_mean=aggregator_mean(total))
        return total

    def ridge(c):
        from dpfed.bounds import psd_ridge_solve

        def fitter(stats, public):
            r = 1.0 + c * math.sqrt(stats.noise.variance("xtx"))
            return psd_ridge_solve(np.asarray(stats.xtx), np.asarray(stats.xty)[None, :],
                                   [r])[0][0], None
        return fitter

    def have(j):
        return np.isfinite(zp[:, j])

    one = [np.arange(n)]
    same = [r for r in SAME_RELEASE_ROWS if r in rows]
    if "joint_gauss" in rows or same:
        total = joint_row("joint_gauss", joint_calibration(m, "gaussian", EPSILON, y_bound, d),
                          one)
        m0 = aggregator_mean(total)
        if m0 is None and any(r.endswith("prior_mean") for r in same):
            m0 = prior_mean_of(total)
        if m0 is not None:
            out.meta["prior_mean_norm"] = float(np.linalg.norm(m0))
        for r in same:
            t0 = time.perf_counter()
            if r == "joint_gauss_zero_mean":
                fit_all(r, lambda j: target_view(total, j, pubt[j]), seed_row="joint_gauss")
            elif r == "joint_gauss_exact_n":
                # Oracle (diagnostic): the release's sums with the exact counts n_x, n_j.
                h = np.isfinite(zp)
                oracle = JointStatistics(total.xtx, int(n), total.xty, total.yty,
                                         h.sum(axis=0).astype(np.int64), total.noise)
                fit_all(r, lambda j: target_view(oracle, j, pubt[j]), seed_row="joint_gauss",
                        prior_mean=aggregator_mean(oracle))
            elif r.startswith("joint_gauss_ridge_c"):
                c = float(r.split("_c")[1].split("_")[0])
                fit_all(r, lambda j: target_view(total, j, pubt[j]), fitter=ridge(c),
                        prior_mean=m0 if r.endswith("prior_mean") else None)
            out.seconds[r] = time.perf_counter() - t0
    if "joint_gauss_k10" in rows:
        joint_row("joint_gauss_k10", joint_calibration(m, "gaussian", EPSILON, y_bound, d),
                  np.array_split(np.arange(n), 10))
    if "joint_gauss_k10_secure" in rows:
        cal = joint_calibration(m, "gaussian", EPSILON, y_bound, d)
        t0 = time.perf_counter()
        total = secure_sum([(xp[b], zp[b]) for b in np.array_split(np.arange(n), 10)], cal)
        out.seconds["joint_gauss_k10_secure:release"] = time.perf_counter() - t0
        fit_all("joint_gauss_k10_secure", lambda j: target_view(total, j, pubt[j]),
                prior_mean=aggregator_mean(total))
    if "joint_laplace" in rows:
        joint_row("joint_laplace", joint_calibration(m, "laplace", EPSILON, y_bound, d), one)

    def laplace_round(eps):
        def view(j):
            h = have(j)
            rel = release_statistics(xp[h], zp[h, j], epsilon=eps, x_bound=X_BOUND,
                                     y_bound=y_bound, x_norm_bound=X_NORM_BOUND)
            pub = pubt[j] if pubt[j].n >= 1 else None
            return (rel + pub, pub) if pub is not None else (rel, None)
        return view

    def gauss_round(cal):
        def view(j):
            h = have(j)
            rel = release_joint(xp[h], zp[h, j:j + 1], cal)
            return target_view(rel, j, pubt[j], k=0)
        return view

    if "per_drug_laplace" in rows:
        fit_all("per_drug_laplace", laplace_round(EPSILON / m))
    if "per_drug_gauss" in rows:
        fit_all("per_drug_gauss", gauss_round(
            joint_calibration(1, "gaussian", per_round_epsilon(m), y_bound, d)))
    if "single_laplace_eps2" in rows:
        fit_all("single_laplace_eps2", laplace_round(2.0))
    if "single_gauss_eps2" in rows:
        fit_all("single_gauss_eps2", gauss_round(joint_calibration(1, "gaussian", 2.0, y_bound, d)))
    if "nonprivate" in rows:
        t0 = time.perf_counter()
        train = np.concatenate([priv, cell.public])
        for k, j in enumerate(fit_idx):
            h = np.isfinite(z[train, j])
            mean, _ = exact_fit(x[train][h], z[train, j][h],
                                int(seeds[16 * k + ROW_INDEX["nonprivate"]]), draws)
            score("nonprivate", j, k, mean, None)   # unclipped: no clipped-LS coverage
        out.seconds["nonprivate"] = time.perf_counter() - t0
    if "public" in rows:
        if public_scores is None:
            for k, j in enumerate(fit_idx):
                h = np.isfinite(zq[:, j])
                mean, _ = exact_fit(xq[h], zq[h, j], int(seeds[16 * k + ROW_INDEX["public"]]),
                                    draws)
                score("public", j, k, mean, None)
        else:
            out.spearman["public"] = list(public_scores)
    return out


# -- the y bound, chosen on synthetic panels --------------------------------------------------

def synthetic_cell(panel: Panel, cell: Cell, rng: np.random.Generator, n_max: int) -> Cell:
    """A synthetic panel shaped like the real one from PUBLIC inputs only: features of every
    line drawn by ``dpfed.auxiliary.AuxiliarySource`` from the 10 public lines; per target a
    signal c^T beta (beta ~ N(0, I), R^2 ~ Beta(2, 20) as the auxiliary source) plus noise from
    a smoothed bootstrap of the public lines' standardised responses (pooled over drugs: their
    skew and tails), responses missing completely at random at the public lines' missing rate;
    then standardised by the synthetic public lines as the coordinator does."""
    from dpfed.auxiliary import AuxiliarySource

    prep = cell.meta["preprocessing"]
    xq_raw = panel.x_raw[cell.public]
    zq = cell.z[cell.public]
    src = AuxiliarySource(xq_raw, np.nanmean(zq, axis=1), prep, feature_names=panel.feature_names)
    total = panel.x_raw.shape[0]
    raw = src.sample_raw_features(rng, total)
    centred = raw - np.asarray(prep.x_mean)
    if prep.x_scale:
        centred = centred / np.asarray(prep.x_scale)
    pool_z = zq[np.isfinite(zq)]
    pool_z = (pool_z - pool_z.mean()) / pool_z.std()
    fill = float(np.isfinite(zq).mean())
    m = panel.m
    beta = rng.standard_normal((centred.shape[1], m))
    signal = centred @ beta
    sd = signal.std(axis=0)
    sd[sd == 0] = 1.0
    r2 = rng.beta(2.0, 20.0, size=m)
    h = 0.5
    noise = math.sqrt(1 - h * h) * rng.choice(pool_z, size=(total, m)) + \
        h * rng.standard_normal((total, m))
    y = signal / sd * np.sqrt(r2) + noise * np.sqrt(1 - r2)
    y[rng.random((total, m)) > fill] = np.nan
    # Every line of the synthetic panel is fresh; reuse the real split's index sets.
    mean, scale, fb = public_centre_scale(y[cell.public])
    return Cell(prep.transform_x(raw), (y - mean) / scale, cell.public, cell.pool, cell.test,
                fb, cell.meta)


def choose_y_bound(panel: Panel, args) -> dict:
    """Mean Spearman of the joint Gaussian row on synthetic panels for each (y bound, budget
    split) of the grids (``--grid``, ``--splits``), at each n; the choice maximises the mean
    ratio over n. The same panels and noise-free fits for every candidate (paired)."""
    rows = ("joint_gauss", "nonprivate")
    fit_idx = list(range(0, panel.m, max(1, panel.m // args.drugs)))[:args.drugs]
    splits = args.splits or [None]
    cands = [(by, sp) for by in args.grid for sp in splits]
    res = {}
    for rep in range(args.repeats):
        cell = repeat_cell(panel, 1000 + rep, args.seed, max(args.n))
        syn = synthetic_cell(panel, cell, np.random.default_rng([args.seed, 99, rep]), max(args.n))
        for n in args.n:
            for by, sp in cands:
                JOINT_SPLIT["split"] = sp
                s = evaluate(syn, n, rows, fit_idx, by, seed=args.seed + rep)
                r = res.setdefault((n, by, sp), {"private": [], "nonprivate": []})
                r["private"] += s.spearman["joint_gauss"]
                r["nonprivate"] += s.spearman["nonprivate"]
                log(f"synthetic panel {rep}: n = {n}, y_bound {by}, split {sp}: "
                    f"{np.mean(s.spearman['joint_gauss']):.3f} / "
                    f"{np.mean(s.spearman['nonprivate']):.3f}")
    JOINT_SPLIT["split"] = None
    table = []
    for (n, by, sp), v in sorted(res.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        diff = np.array(v["private"]) - np.array(res[(n, cands[0][0], cands[0][1])]["private"])
        table.append({"n": n, "y_bound": by, "split": sp,
                      "private": float(np.mean(v["private"])),
                      "nonprivate": float(np.mean(v["nonprivate"])),
                      "ratio": float(np.mean(v["private"]) / np.mean(v["nonprivate"])),
                      "minus_first": float(diff.mean()),
                      "se": float(diff.std(ddof=1) / math.sqrt(diff.size))})
    best = max(cands, key=lambda c: np.mean([t["ratio"] for t in table
                                             if (t["y_bound"], t["split"]) == c]))
    return {"table": table, "choice": {"y_bound": best[0], "split": best[1]},
            "targets_scored": len(fit_idx), "panels": args.repeats}


# -- single-target rounds: Gaussian (eps, 1e-6) vs Laplace eps, on UCI ---------------------------

def uci_single(path: Path, repeats: int, epsilon: float = 2.0, seed: int = 0) -> dict:
    """One target, one site: the Laplace release at pure ``epsilon`` (today's round) against a
    Gaussian round of one target at (``epsilon``, 1e-6), on the rows, split, public scales,
    bounds and split of benchmarks/uci.py (200 test, 30 public, the rest private; bounds and
    budget split chosen for the Laplace round on auxiliary data shaped like the public rows,
    used for both: the Gaussian round gets no tuning of its own)."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds
    from dpfed.preprocess import Preprocessing
    from dpfed.statistics import clipped_exact_statistics, exact_statistics
    from site_node.release import release_statistics

    spec = importlib.util.spec_from_file_location("uci_bench", ROOT / "benchmarks" / "uci.py")
    uci = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(uci)
    names, x, y = uci.load(path)
    rng = np.random.default_rng(seed)
    scores = {"laplace": [], "gaussian": [], "nonprivate": [], "public": []}
    refused = {"laplace": 0, "gaussian": 0}
    for rep in range(repeats):
        perm = rng.permutation(len(y))
        test, pub, priv = perm[:200], perm[200:230], perm[230:]
        scale = x[pub].std(axis=0, ddof=1)
        scale[scale == 0] = 1.0
        xs = x / scale
        pre = Preprocessing.from_public_data(xs[pub], y[pub], normalize_rows=False)
        zp, yp = pre.apply(xs[pub], y[pub])
        zq, yq = pre.apply(xs[priv], y[priv])
        zt = pre.transform_x(xs[test])
        sigma_x, sigma_y = float(np.std(zp)), float(np.std(yp))
        aux = AuxiliarySource(xs[pub], y[pub], pre, feature_names=tuple(names))
        choice = choose_bounds(len(priv), x.shape[1], epsilon, auxiliary=aux,
                               neighbouring="add_remove", xtx_sensitivity="exact",
                               ridge="noise_matched", search_sxx_share=True, n_datasets=8,
                               n_noise=8)
        bx, by = choice.bounds(sigma_x, sigma_y)
        public = clipped_exact_statistics(zp, yp, bx, by)
        lap = release_statistics(zq, yq, epsilon=epsilon, x_bound=bx, y_bound=by,
                                 budget_split=choice.budget_split)
        cal = joint_calibration(1, "gaussian", epsilon, by, x.shape[1], x_bound=bx,
                                x_norm_bound=None)
        gau = target_view(release_joint(zq, yq[:, None], cal), 0, public, x_bound=bx,
                          x_norm_bound=None)
        for name, (stats, pub_) in (("laplace", (lap + public, public)), ("gaussian", gau)):
            try:
                mean, _ = fit(stats, pub_, by, rep, 1000, x_bound=bx)
            except Exception:  # a refused fit is counted, and scored as a zero beta
                refused[name] += 1
                mean = np.zeros(x.shape[1])
            scores[name].append(spearman0(zt @ mean, y[test]))
        npv, _ = exact_fit(np.vstack([zq, zp]), np.concatenate([yq, yp]), rep, 1000)
        scores["nonprivate"].append(spearman0(zt @ npv, y[test]))
        pbv, _ = exact_fit(zp, yp, rep, 1000)
        scores["public"].append(spearman0(zt @ pbv, y[test]))
        log(f"{path.stem} repeat {rep}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in
                                                      scores.items()))
    diff = np.array(scores["gaussian"]) - np.array(scores["laplace"])
    return {"data": path.stem, "rows": int(len(y)), "private_rows": int(len(y) - 230),
            "epsilon": epsilon, "delta": DELTA, "repeats": repeats, "refused": refused,
            **{k: float(np.mean(v)) for k, v in scores.items()},
            "gaussian_minus_laplace": float(diff.mean()),
            "se": float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else None}


# -- the study --------------------------------------------------------------------------------

def summarise(runs: dict, drugs: list[int]) -> list[dict]:
    """runs: (n, repeat) -> Scores. One summary row per (n, row)."""
    out = []
    for n in sorted({k[0] for k in runs}, reverse=True):
        reps = [runs[k] for k in sorted(runs) if k[0] == n]
        names = [r for r in ROWS if all(r in s.spearman for s in reps)]
        per = {r: np.array([s.spearman[r] for s in reps]) for r in names}   # (R, drugs)
        nonpriv = per.get("nonprivate")
        public = per.get("public")
        for r in names:
            v = per[r]
            row = {"n": n, "row": r, "label": ROWS[r], "repeats": len(reps), "drugs": len(drugs),
                   "spearman": float(v.mean()),
                   "se": float(v.mean(axis=0).std(ddof=1) / math.sqrt(v.shape[1]))
                   if v.shape[1] > 1 else None}
            if nonpriv is not None:
                row["ratio"] = float(v.mean() / nonpriv.mean())
            if public is not None:
                row["at_or_above_public"] = int(np.sum(v.mean(axis=0) >= public.mean(axis=0)))
            cov = [s.covered.get(r) for s in reps if s.covered.get(r)]
            if cov:
                row["coverage90"] = float(sum(c[0] for c in cov) / sum(c[1] for c in cov))
            row["refused"] = int(sum(s.errors.get(r, 0) for s in reps))
            secs = [s.seconds.get(r) for s in reps if r in s.seconds]
            if secs:
                row["fit_seconds"] = float(np.median(secs))
            out.append(row)
    return out


def markdown(summary: list[dict]) -> str:
    lines = ["| n | row | private | ratio to non-private | drugs >= public-only | "
             "90 % coverage (held-out LS coef.) | refused |", "|---|---|---|---|---|---|---|"]
    for s in summary:
        cov = f"{s['coverage90']:.3f}" if "coverage90" in s else ""
        ratio = f"{s['ratio']:.2f}" if "ratio" in s else ""
        above = f"{s['at_or_above_public']} / {s['drugs']}" if "at_or_above_public" in s else ""
        lines.append(f"| {s['n']} | {s['label']} | {s['spearman']:.3f} | {ratio} | {above} | "
                     f"{cov} | {s['refused']} |")
    return "\n".join(lines)


def timing(panel: Panel, y_bound: float, seed: int) -> dict:
    """Fit of every target from one joint Gaussian release (n = 700, production draws 5000
    and the study's 1000), and the release at n = 1e5 (rows resampled from the panel)."""
    from dpfed.joint_statistics import public_targets

    cell = repeat_cell(panel, 0, seed, 700)
    x, z = cell.x, cell.z
    d, m = x.shape[1], z.shape[1]
    cal = joint_calibration(m, "gaussian", EPSILON, y_bound, d)
    rel = release_joint(x[cell.pool], z[cell.pool], cal)
    xq, zq = x[cell.public], z[cell.public]
    pubt = public_targets(xq, zq, X_BOUND, y_bound, X_NORM_BOUND)
    res = {}
    for draws in (5000, 1000):
        w0, c0 = time.perf_counter(), time.process_time()
        for j in range(m):
            fit(*target_view(rel, j, pubt[j]), y_bound, j, draws)
        res[f"fit_all_targets_draws{draws}"] = {"wall_s": time.perf_counter() - w0,
                                                "cpu_s": time.process_time() - c0}
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, x.shape[0], 100_000)
    xb, zb = x[rows], z[rows]
    rel_times = []
    for _ in range(3):
        w0, c0 = time.perf_counter(), time.process_time()
        release_joint(xb, zb, cal)
        rel_times.append((time.perf_counter() - w0, time.process_time() - c0))
    res["release_n1e5"] = {"wall_s": min(t[0] for t in rel_times),
                           "cpu_s": min(t[1] for t in rel_times)}
    res["release_function"] = RELEASE_USED.get("function")
    return res


def run(args) -> dict:
    panel = load_panel()
    if args.choose_y_bound:
        return {"choose_y_bound": choose_y_bound(panel, args)}
    k = max(1, panel.m // args.drugs) if args.drugs < panel.m else 1
    fit_idx = list(range(0, panel.m, k))[:args.drugs]
    drugs = [panel.drugs[i] for i in fit_idx]
    rows = tuple(args.rows)
    runs = {}
    t0 = time.time()
    for rep in range(args.first_repeat, args.first_repeat + args.repeats):
        cell = repeat_cell(panel, rep, args.seed, max(args.n))
        public_scores = None
        for n in sorted(args.n, reverse=True):
            s = evaluate(cell, n, rows, fit_idx, args.y_bound, seed=args.seed * 1000 + rep,
                         public_scores=public_scores)
            public_scores = s.spearman.get("public")
            runs[(n, rep)] = s
            log(f"repeat {rep} n = {n} ({time.time() - t0:.0f} s): " + ", ".join(
                f"{r} {np.mean(v):.3f}" for r, v in s.spearman.items()))
            log(f"  fits: {s.fits}")
        if args.json:   # after every repeat: a long run's partial results are usable
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(_result(args, panel, drugs, rows, runs, cell, t0),
                                            indent=1))
    return _result(args, panel, drugs, rows, runs, cell, t0)


def _result(args, panel, drugs, rows, runs, cell, t0) -> dict:
    summary = summarise(runs, drugs)
    per_drug = {}
    for (n, rep), s in runs.items():
        for r, v in s.spearman.items():
            per_drug.setdefault(f"{n}:{r}", []).append(v)
    return {"config": {"drugs": drugs, "repeats": len({k[1] for k in runs}), "n": list(args.n),
                       "seed": args.seed, "y_bound": args.y_bound, "rows": list(rows),
                       "joint_split": JOINT_SPLIT["split"],
                       "prior_mean": PRIOR_MEAN["on"],
                       "epsilon": EPSILON, "delta": DELTA, "x_bound": X_BOUND,
                       "x_norm_bound": X_NORM_BOUND, "panel_drugs": panel.m,
                       "lines": int(panel.x_raw.shape[0]),
                       "test_lines": int(panel.x_raw.shape[0]) - N_PUBLIC - max(args.n),
                       "public_centre_fallbacks": cell.fallback,
                       "release_function": RELEASE_USED.get("function")},
            "summary": summary, "seconds": time.time() - t0,
            "errors": sorted({m for s in runs.values() for m in s.errors.get("messages", [])}),
            "fit_methods": {f"{n}:{rep}": s.fits for (n, rep), s in runs.items()},
            "fit_fallback": FIT["fallback"],
            "release_seconds": {f"{n}:{k}": v for (n, _), s in runs.items()
                                for k, v in s.seconds.items()},
            "per_drug_spearman": {k: np.mean(v, axis=0).tolist() for k, v in per_drug.items()}}


def _split_arg(text: str) -> tuple[float, ...]:
    parts = tuple(float(v) for v in text.split(","))
    if len(parts) != 4 or abs(sum(parts) - 1.0) > 1e-9 or min(parts) <= 0:
        raise argparse.ArgumentTypeError("a split is 4 positive shares summing to 1")
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drugs", type=int, default=262, help="drugs scored (evenly spaced); the "
                    "joint releases always carry all 262")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--n", type=int, nargs="+", default=[700, 300])
    ap.add_argument("--first-repeat", type=int, default=0, help="repeats first-repeat .. "
                    "first-repeat + repeats - 1 (to extend a run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--y-bound", type=float, default=DEFAULT_Y_BOUND)
    ap.add_argument("--choose-y-bound", action="store_true",
                    help="score the y bounds of --grid on synthetic panels instead")
    ap.add_argument("--grid", type=float, nargs="+", default=list(Y_BOUND_GRID))
    ap.add_argument("--rows", type=lambda s: s.split(","), default=list(DEFAULT_ROWS))
    ap.add_argument("--split", type=_split_arg, help="budget split Sxx,Sxy,Syy,n of the "
                    "releases of all targets (default dpfed.joint_noise.JOINT_DEFAULT_SPLIT)")
    ap.add_argument("--splits", type=_split_arg, nargs="+", help="--choose-y-bound: splits "
                    "to compare too")
    ap.add_argument("--timing", action="store_true", help="fit-all-targets and n = 1e5 release "
                    "times only")
    ap.add_argument("--uci", type=Path, nargs="*", help="UCI CSVs (default: every file of "
                    "../shared/data/uci): single-target Gaussian vs Laplace at eps 2 instead")
    ap.add_argument("--no-nuts", action="store_true", help="no NUTS fallback: a refused "
                    "noise-aware fit is counted and scored as beta = 0")
    ap.add_argument("--zero-mean", action="store_true", help="joint rounds' fits with the "
                    "prior centred at 0 (before aggregator.joint_prior; the earlier tables)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    unknown = set(args.rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; known: {', '.join(ROWS)}")
    if args.no_nuts:
        FIT["fallback"] = None
    PRIOR_MEAN["on"] = not args.zero_mean
    JOINT_SPLIT["split"] = args.split
    if args.uci is not None:
        paths = args.uci or sorted((ROOT.parent / "shared" / "data" / "uci").glob("*.csv"))
        result = {"uci_single": [uci_single(p, args.repeats, seed=args.seed) for p in paths]}
    elif args.timing:
        result = {"timing": timing(load_panel(), args.y_bound, args.seed)}
    else:
        result = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if "summary" in result:
        print(markdown(result["summary"]))
    else:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
