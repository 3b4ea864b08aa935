"""The Monte Carlo cross-validation protocol of the paper's experiment (Honkela et al. 2018,
section 4.5; method.md section 5), as pure functions.

Per drug with at least ``min_lines`` measured cell lines (262 of GDSC v17's 265), per repeat:

- a random permutation of the drug's lines (seeded by (seed, drug, repeat)) gives 100 *test*
  lines, 30 *candidate public* lines of which the first 10 are used as the public
  (non-private) training lines, and the rest, the *private pool*, in random order;
- the private training set of size n is the first n lines of the private pool: the sets are
  **nested** (n = 100 is a subset of n = 200 ...) within a repeat, as in the paper's reference
  code's use of one permutation per repeat. Nesting makes the curve over n smoother (differences
  between sizes are not blurred by a fresh draw of lines) and does not bias any single cell.
  Sizes larger than the pool are skipped for that drug (GDSC v17 has fewer lines than the
  paper's 985: 56 drugs reach n = 800), so each (method, n) mean says how many drugs it covers;
- pre-processing (feature means, target mean: ``dpfed_apps.simulation.public_preprocessing``) and
  the threshold scales (``dpfed.preprocess.public_sigmas``) come from the 10 public lines only;
- clipping bounds, Sxx share of the split and ridge of robust_private (``bounds="public"``, the
  default): per repeat, ``dpfed.bounds.choose_bounds_table`` on auxiliary data shaped like
  that repeat's 10 public lines (``dpfed.auxiliary``; no private or test line is read), one
  search for every (n, K, eps) of the grid, with the release's row-norm bound (rows have unit
  norm, ``dpfed.sensitivity``); the other methods (and robust_private with
  ``bounds="gaussian"``): ``dpfed.bounds.choose_bounds(n_site, d, eps)`` (method.md section 4,
  Gaussian synthetic data) scaled by the public sigmas, with n_site the smallest site's size
  (K sites share the n private lines in near-equal blocks, each releasing with the same eps);
  with secure aggregation (issue 10, ``aggregations``) the aggregator sees ONE noise draw on
  the sum of all n rows, the trade-off of a single site with n rows, so its bounds are chosen
  for n (``bounds_size``);
- the public range of the pre-processed target needed by the rescaling baselines (y_range) is
  the largest |y| over the 30 candidate public lines, also public;
- n = 0 means public only: every method reduces to the Gamma-prior posterior of the 10 public
  lines (no private data, nothing to protect), computed once per repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from dpfed.preprocess import Preprocessing
from dpfed.preprocess import public_sigmas
from dpfed.secure_round import AGGREGATIONS as _ROUND_MODES
from dpfed_apps.simulation import Problem, Split, gdsc_problem, public_preprocessing

__all__ = ["ProtocolConfig", "RepeatSplit", "RepeatData", "QUICK", "eligible_drugs",
           "repeat_split", "prepare_repeat", "private_rows", "bounds_table", "site_size",
           "AGGREGATIONS", "federations", "bounds_size", "table_cell", "repeat_bounds",
           "BOUNDS_RULES"]

#: How robust_private's bounds are chosen (``ProtocolConfig.bounds``, module docstring).
BOUNDS_RULES = ("public", "gaussian")

PAPER_SIZES = (0, 100, 200, 300, 400, 500, 600, 700, 800)
#: How robust_private's K >= 2 site releases are combined (issue 10), the round modes of
#: ``dpfed.secure_round``: "independent" (K releases, K noise draws on the sum) or "secure"
#: (secure aggregation with distributed noise: one draw on the sum,
#: ``dpfed_apps.evaluation.methods.robust_private.secure_sum``). K = 1 is always independent.
AGGREGATIONS = _ROUND_MODES


@dataclass(frozen=True)
class ProtocolConfig:
    """Every number of the protocol (paper section 4.5 defaults)."""

    sizes: tuple[int, ...] = PAPER_SIZES
    epsilons: tuple[float, ...] = (1.0, 2.0)
    sites: tuple[int, ...] = (1, 3, 10)      # K, for robust_private only
    aggregations: tuple[str, ...] = AGGREGATIONS  # for robust_private with K >= 2
    repeats: int = 50
    n_test: int = 100
    n_candidates: int = 30
    n_public: int = 10
    min_lines: int = 400
    seed: int = 0
    # None: the relation's default (dpfed.sensitivity): 4 shares (Sxx, Sxy, Syy, n) under
    # add/remove, (0.35, 0.60, 0.05) under replace-one.
    budget_split: tuple[float, ...] | None = None
    feature_names: tuple[str, ...] | None = None  # None: dpfed.datasets.default_feature_names()
    # The mechanism of the sufficient-statistics methods (method.md section 9). eps under
    # add/remove implies 2 eps under replace-one: compare with the paper's figures under
    # neighbouring = "replace_one".
    neighbouring: str = "add_remove"
    xtx_sensitivity: str = "exact"
    # robust_private's bounds: "public" (per repeat, public-shaped auxiliary data, row-norm
    # bound) or "gaussian" (the paper's search, coordinate clipping only; before issue 9's
    # second part).
    bounds: str = "public"

    def __post_init__(self):
        from dpfed.sensitivity import (check_neighbouring, check_xtx_rule, default_budget_split,
                                       validate_privacy_parameters)
        check_neighbouring(self.neighbouring)
        check_xtx_rule(self.xtx_sensitivity)
        split = self.budget_split if self.budget_split is not None else \
            default_budget_split(self.neighbouring)
        split = validate_privacy_parameters(1.0, 1.0, 1.0, split,
                                            neighbouring=self.neighbouring)[3]
        object.__setattr__(self, "budget_split", split)
        if self.bounds not in BOUNDS_RULES:
            raise ValueError(f"bounds must be one of {BOUNDS_RULES}, got {self.bounds!r}")
        if any((not isinstance(n, int)) or n < 0 for n in self.sizes) or not self.sizes:
            raise ValueError(f"sizes must be non-negative integers, got {self.sizes!r}")
        if any(not (math.isfinite(e) and e > 0) for e in self.epsilons) or not self.epsilons:
            raise ValueError(f"epsilons must be finite and > 0, got {self.epsilons!r}")
        if any((not isinstance(k, int)) or k < 1 for k in self.sites) or not self.sites:
            raise ValueError(f"sites must be integers >= 1, got {self.sites!r}")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")
        if not 2 <= self.n_public <= self.n_candidates:
            raise ValueError("need 2 <= n_public <= n_candidates")
        if self.n_test < 2:
            raise ValueError("need at least 2 test lines")
        object.__setattr__(self, "sizes", tuple(sorted(set(int(n) for n in self.sizes))))
        object.__setattr__(self, "epsilons", tuple(float(e) for e in self.epsilons))
        object.__setattr__(self, "sites", tuple(sorted(set(int(k) for k in self.sites))))
        aggs = tuple(self.aggregations) if not isinstance(self.aggregations, str) else ()
        if not aggs or any(a not in AGGREGATIONS for a in aggs):
            raise ValueError(f"aggregations must be a non-empty subset of {AGGREGATIONS}, "
                             f"got {self.aggregations!r}")
        object.__setattr__(self, "aggregations", tuple(a for a in AGGREGATIONS if a in aggs))

    @property
    def features(self) -> tuple[str, ...]:
        if self.feature_names:
            return tuple(self.feature_names)
        from dpfed.datasets import default_feature_names

        return default_feature_names()


#: ``dpfed evaluate --quick``: every method and K, both eps, 3 sizes, few repeats.
QUICK = dict(sizes=(0, 100, 400), repeats=3)


def eligible_drugs(min_lines: int = 400) -> list[int]:
    """GDSC v17 drugs with at least ``min_lines`` lines that have a response and features."""
    from dpfed import datasets

    table = datasets.load_responses()
    known = set(int(i) for i in datasets.load_genomic_features().line_ids)
    has_features = np.array([int(i) in known for i in table.line_ids])
    out = []
    for j, drug in enumerate(table.drug_ids):
        if int(np.sum(np.isfinite(table.ln_ic50[:, j]) & has_features)) >= min_lines:
            out.append(int(drug))
    return out


@dataclass(frozen=True)
class RepeatSplit:
    """Row indices of one repeat: test lines, the 30 candidate public lines (first n_public
    used), and the private pool in its random order (nested subsets are its prefixes)."""

    test: np.ndarray
    candidates: np.ndarray
    public: np.ndarray
    private_pool: np.ndarray


def repeat_split(n_rows: int, config: ProtocolConfig, drug: int, repeat: int) -> RepeatSplit:
    """The split of repeat ``repeat`` of ``drug`` (one permutation seeded by (seed, drug, repeat))."""
    need = config.n_test + config.n_candidates
    if n_rows <= need:
        raise ValueError(f"{n_rows} lines cannot make {config.n_test} test and "
                         f"{config.n_candidates} candidate public lines plus a private pool")
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, int(drug), int(repeat)]))
    order = rng.permutation(n_rows)
    test = order[:config.n_test]
    candidates = order[config.n_test:need]
    return RepeatSplit(np.sort(test), candidates, np.sort(candidates[:config.n_public]),
                       order[need:])


def private_rows(split: RepeatSplit, n: int) -> np.ndarray:
    """The nested private training set of size n (the first n of the pool)."""
    if n > split.private_pool.size:
        raise ValueError(f"private pool has {split.private_pool.size} lines, {n} requested")
    return split.private_pool[:n]


def site_size(n: int, k: int) -> int:
    """Rows of the smallest of K near-equal sites (``np.array_split``): the n the bounds are
    chosen for, since smaller data sets want tighter clipping (as in dpfed_apps.simulation)."""
    return n // k


def federations(config: ProtocolConfig, method: str) -> list[tuple[int, str]]:
    """The (K, aggregation) variants of ``method``: robust_private gets every K of the config,
    K = 1 independent only and K >= 2 once per aggregation; every other method (K = 1)
    ``(1, "independent")``."""
    if method != "robust_private":
        return [(1, "independent")]
    return [(k, agg) for k in config.sites
            for agg in (("independent",) if k == 1 else config.aggregations)]


def bounds_size(n: int, k: int, aggregation: str = "independent") -> int:
    """The n the clipping bounds are chosen for: the smallest site's (``site_size``) when the
    K releases are independent (each carries its own noise draw); the total n with secure
    aggregation, whose sum of n rows carries one draw, like a single site's release of n rows."""
    return n if aggregation == "secure" else site_size(n, k)


@dataclass(frozen=True)
class RepeatData:
    """One repeat, pre-processed with the public parameters, ready for the methods."""

    drug: int
    repeat: int
    x_test: np.ndarray
    y_test: np.ndarray
    x_public: np.ndarray
    y_public: np.ndarray
    x_pool: np.ndarray          # private pool, in pool order (prefix n = training set)
    y_pool: np.ndarray
    sigma_x: float
    sigma_y: float
    y_range: float
    preprocessing: Preprocessing = field(repr=False)
    # The public lines before pre-processing (what an AuxiliarySource reads).
    x_public_raw: np.ndarray | None = field(default=None, repr=False)
    y_public_raw: np.ndarray | None = field(default=None, repr=False)

    @property
    def pool_size(self) -> int:
        return int(self.y_pool.shape[0])


def prepare_repeat(problem: Problem, config: ProtocolConfig, drug: int, repeat: int) -> RepeatData:
    """Split, then pre-process everything with parameters from the public lines only."""
    split = repeat_split(problem.n, config, drug, repeat)
    # dpfed_apps.simulation's public step, on a Split whose public part is our 10 public lines.
    prep = public_preprocessing(problem, Split(split.test, split.public, (split.private_pool,)))
    sigma_x, sigma_y = public_sigmas(problem.x[split.public], problem.y[split.public], prep)
    x_test = prep.transform_x(problem.x[split.test])
    x_pub, y_pub = prep.apply(problem.x[split.public], problem.y[split.public])
    x_pool, y_pool = prep.apply(problem.x[split.private_pool], problem.y[split.private_pool])
    y_cand = prep.transform_y(problem.y[split.candidates])
    y_range = float(np.max(np.abs(y_cand)))
    if not (math.isfinite(y_range) and y_range > 0):
        y_range = 1.0
    return RepeatData(int(drug), int(repeat), x_test, problem.y[split.test], x_pub, y_pub,
                      x_pool, y_pool, sigma_x, sigma_y, y_range, prep,
                      problem.x[split.public], problem.y[split.public])


def load_problem(drug: int, config: ProtocolConfig) -> Problem:
    return gdsc_problem(drug, config.features)


def bounds_table(config: ProtocolConfig, d: int, *, cache_dir=None) -> dict[tuple[int, float], tuple[float, float]]:
    """(omega_x, omega_y) of ``choose_bounds(n_site, d, eps)`` for every site size and eps the
    grid needs (computed once, in the parent, and shipped to the workers)."""
    import inspect

    from dpfed.bounds import choose_bounds

    if "neighbouring" in inspect.signature(choose_bounds).parameters:
        mechanism = dict(budget_split=config.budget_split, neighbouring=config.neighbouring,
                         xtx_sensitivity=config.xtx_sensitivity)
    else:
        # A dpfed.bounds that still simulates only the paper's 3-share mechanism: give it the
        # (Sxx, Sxy, Syy) shares, rescaled to sum to 1. The bounds are a utility heuristic
        # (public, data-independent), not a privacy parameter, so this is safe, only less tuned.
        shares = config.budget_split[:3]
        mechanism = dict(budget_split=tuple(p / sum(shares) for p in shares))
    table = {}
    for eps in config.epsilons:
        for n in config.sizes:
            if n == 0:
                continue
            for k, agg in federations(config, "robust_private"):
                m = bounds_size(n, k, agg)
                if m < 2 or (m, eps) in table:
                    continue
                choice = choose_bounds(m, d, eps, cache_dir=cache_dir, **mechanism)
                table[(m, eps)] = (float(choice.omega_x), float(choice.omega_y))
    return table


def table_cell(n: int, k: int, aggregation: str = "independent") -> tuple[int, int]:
    """The (n, draws) cell of ``dpfed.bounds.choose_bounds_table`` that robust_private's
    bounds for n rows at K sites come from: K independent draws on the sum, or one with
    secure aggregation (the sum of n rows carries one draw, like ``bounds_size``)."""
    return (n, 1 if aggregation == "secure" else k)


def repeat_cells(config: ProtocolConfig, pool_size: int) -> list[tuple[int, int]]:
    """The table cells (``table_cell``) of every robust_private cell of a repeat whose pool
    has ``pool_size`` lines."""
    return sorted({table_cell(n, k, agg) for n in config.sizes if 0 < n <= pool_size
                   for k, agg in federations(config, "robust_private") if site_size(n, k) >= 2})


def repeat_bounds(data: RepeatData, config: ProtocolConfig, *, cache_dir=None) -> dict:
    """robust_private's bounds for every (n, K, eps) of one repeat (``bounds="public"``):
    ``dpfed.bounds.choose_bounds_table`` on auxiliary data shaped like this repeat's public
    lines only (raw public rows, the public pre-processing, the feature names: no private or
    test line), with the release's row-norm bound. {(n, K, eps): BoundsChoice}; bounds are
    ``choice.bounds(*source.scales())`` (the public sigmas of ``prepare_repeat``)."""
    from dpfed.auxiliary import AuxiliarySource
    from dpfed.bounds import choose_bounds_table
    from dpfed.sensitivity import row_norm_bound

    cells = repeat_cells(config, data.pool_size)
    if not cells:
        return {}
    source = AuxiliarySource(data.x_public_raw, data.y_public_raw, data.preprocessing,
                             feature_names=config.features)
    seed = int(np.random.SeedSequence([config.seed, data.drug, data.repeat, 7])
               .generate_state(1)[0])
    return choose_bounds_table(source, cells, config.epsilons, neighbouring=config.neighbouring,
                               xtx_sensitivity=config.xtx_sensitivity,
                               x_norm_bound=row_norm_bound(data.preprocessing.normalize_rows),
                               budget_split=config.budget_split, seed=seed,
                               cache_dir=cache_dir)
