"""L1 sensitivities, budget split and noise scales of the released statistics (pure functions).

The mechanism (method.md sections 2 and 9; Honkela et al. 2018, section 4.2; Nieminen 2017,
Algorithm 2 with its loops to d, method.md section 6) adds independent Laplace noise to the
upper triangle of Sxx, to Sxy and to Syy, and under add/remove neighbours discrete Laplace noise
to n, with scale (L1 sensitivity) / (share of epsilon). By basic composition the release is
eps-DP. Two neighbouring relations are supported (``NEIGHBOURING``):

``add_remove`` (unbounded DP, the default): D' = D plus or minus one record. n is private.

| part | L1 sensitivity | why |
|---|---|---|
| Sxx upper triangle | d(d+1)/2 Bx^2 | one row v adds v_j v_k, sum over j <= k of |v_j v_k| <= d(d+1)/2 Bx^2 |
| Sxy | d Bx By | sum_j |v_j w| <= d Bx By |
| Syy | By^2 | w^2 in [0, By^2] |
| n | 1 | |

``replace_one`` (bounded DP, the paper's): |D| = |D'|, one record replaced. n is public.

| part | L1 sensitivity | why |
|---|---|---|
| Sxx upper triangle | d(d+1)/2 Bx^2 (exact) | proof in ``_xtx_replace_one_proof`` |
| Sxy | 2 d Bx By | v_j w - v'_j w' in [-2 Bx By, 2 Bx By] |
| Syy | By^2 | both terms in [0, By^2] |
| n | public, released exactly | |

The paper bounds the Sxx triangle by summing a per-entry bound 2 Bx^2 over the d(d+1)/2
entries, d(d+1) Bx^2 (Nieminen 2017, proof of Theorem 3.9 (i)): valid, but twice the exact value
under replace-one and twice the add/remove value too. ``xtx_sensitivity="paper"`` selects it (to
reproduce the paper), ``"exact"`` (the default) the exact value. A replacement is a removal
followed by an addition, so eps-DP under add/remove implies 2 eps-DP under replace-one (group
privacy over the two steps); state which one a figure uses.

**Row-norm bound** (``x_norm_bound`` R, optional). When every released row is also projected
into the L2 ball ||x||_2 <= R (``site_node.release`` does it; rows normalised to unit norm by
the round's pre-processing are unchanged by it with R = 1), the worst row is smaller: with
t = min(Bx, R / sqrt(d)),

| part | add/remove | replace-one | why |
|---|---|---|---|
| Sxx upper triangle | d(d+1)/2 t^2 | min(d(d+1)/2 Bx^2, d(d+1) t^2) | sum_{j<=k} |v_j v_k| = (||v||_1^2 + ||v||_2^2)/2, ||v||_1 <= d t, ||v||_2^2 <= d t^2; replace-one: the box proof, or remove + add |
| Sxy | d t By | 2 d t By | sum_j |v_j w| <= ||v||_1 By |
| Syy, n | unchanged | unchanged | |

Every add/remove value is attained by v = (t, ..., t) (inside both the box and the ball). So
with R = 1 and d = 10 the Sxx and Sxy noise stop growing at Bx = 1/sqrt(10) ~ 0.32, and the
clipping threshold of the features can be raised to 1 (no coordinate clipping of a unit row)
at no extra noise: on the bundled binary features, whose normalised rows have one or two
large entries (~0.7-0.9), that keeps the signal the box clipping at 0.3 flattened
(docs/evaluation.md). ``xtx_sensitivity="paper"`` keeps the paper's d(d+1) Bx^2 for Sxx.
``tests/test_sensitivity.py`` checks the new bounds by brute force.

Imports nothing from the roles (site_node, aggregator, coordinator): both the site (to draw
noise) and the aggregator (to check the noise a contribution declares) compute from here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from dpfed.noise import NoiseDescription, NoiseTerm

__all__ = ["NEIGHBOURING", "XTX_SENSITIVITIES", "DEFAULT_BUDGET_SPLIT",
           "DEFAULT_SPLIT_ADD_REMOVE", "default_budget_split", "check_neighbouring",
           "check_xtx_rule", "validate_privacy_parameters", "xtx_sensitivity",
           "xtx_sensitivity_tight", "xty_sensitivity", "yty_sensitivity", "n_sensitivity",
           "NoiseCalibration", "noise_calibration", "expected_noise", "row_norm_bound",
           "coordinate_bound", "check_norm_bound"]

NEIGHBOURING = ("add_remove", "replace_one")
XTX_SENSITIVITIES = ("exact", "paper")

#: (Sxx, Sxy, Syy) shares under replace-one: Nieminen (2017) thesis, section 3.4.
DEFAULT_BUDGET_SPLIT = (0.35, 0.60, 0.05)
#: (Sxx, Sxy, Syy, n) shares under add/remove. A placeholder (to be tuned, dpfed.bounds): the
#: thesis's Sxx and Sxy shares, the Syy share split between Syy and n.
DEFAULT_SPLIT_ADD_REMOVE = (0.35, 0.60, 0.03, 0.02)

_PARTS = {"add_remove": ("Sxx", "Sxy", "Syy", "n"), "replace_one": ("Sxx", "Sxy", "Syy")}


def check_neighbouring(neighbouring) -> str:
    """``neighbouring`` if it names a known relation, else ValueError (fail closed)."""
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}; known: "
                         f"{', '.join(NEIGHBOURING)}")
    return neighbouring


def check_xtx_rule(rule) -> str:
    """``rule`` if it names a known Sxx sensitivity rule, else ValueError."""
    if rule not in XTX_SENSITIVITIES:
        raise ValueError(f"unknown xtx_sensitivity {rule!r}; known: "
                         f"{', '.join(XTX_SENSITIVITIES)}")
    return rule


def default_budget_split(neighbouring: str = "add_remove") -> tuple[float, ...]:
    """The default split of the relation: 4 shares under add/remove, 3 under replace-one."""
    check_neighbouring(neighbouring)
    return DEFAULT_SPLIT_ADD_REMOVE if neighbouring == "add_remove" else DEFAULT_BUDGET_SPLIT


def row_norm_bound(normalize_rows: bool) -> float | None:
    """The row-norm bound R of a round whose pre-processing does (True) or does not normalise
    rows: 1.0 (every pre-processed row has L2 norm 1, or 0 for a row at the public mean) or
    None (no row bound). Site and aggregator derive it from the same signed spec field."""
    return 1.0 if normalize_rows else None


def check_norm_bound(x_norm_bound) -> float | None:
    """``x_norm_bound`` as a float (finite, > 0) or None; ValueError otherwise."""
    if x_norm_bound is None:
        return None
    if isinstance(x_norm_bound, (bool, np.bool_)) or not isinstance(x_norm_bound, numbers.Real) \
            or not math.isfinite(x_norm_bound) or x_norm_bound <= 0:
        raise ValueError(f"x_norm_bound must be a finite number > 0 or None, got {x_norm_bound!r}")
    return float(x_norm_bound)


def coordinate_bound(d, x_bound, x_norm_bound=None):
    """t = min(Bx, R / sqrt(d)): the largest value every coordinate of the worst-case row can
    take at once (module docstring, "Row-norm bound"); Bx when there is no row bound.
    Vectorised over ``x_bound``."""
    if x_norm_bound is None:
        return x_bound
    return np.minimum(x_bound, float(x_norm_bound) / math.sqrt(d))


def xtx_sensitivity(d, x_bound, *, rule: str = "exact", x_norm_bound=None,
                    neighbouring: str = "add_remove"):
    """L1 sensitivity of the upper triangle of X^T X: ``"exact"`` d(d+1)/2 Bx^2 under either
    relation, ``"paper"`` d(d+1) Bx^2 (Honkela et al. 2018, twice that). With a row-norm
    bound R (``x_norm_bound``) and the exact rule: d(d+1)/2 t^2 under add/remove and
    min(d(d+1)/2 Bx^2, d(d+1) t^2) under replace-one, t = ``coordinate_bound`` (module
    docstring). ``x_bound`` may be a numpy array (vectorised, for dpfed.bounds)."""
    check_xtx_rule(rule)
    factor = 1.0 if rule == "paper" else 0.5
    box = factor * d * (d + 1) * (x_bound * x_bound)
    if x_norm_bound is None or rule == "paper":
        return box
    check_neighbouring(neighbouring)
    t = coordinate_bound(d, x_bound, x_norm_bound)
    ball = 0.5 * d * (d + 1) * (t * t)
    return ball if neighbouring == "add_remove" else np.minimum(box, 2.0 * ball)


def xtx_sensitivity_tight(d: int, x_bound: float) -> float:
    """The exact L1 sensitivity of the Sxx upper triangle, d(d+1)/2 Bx^2, under either relation.

    Add/remove: one row v contributes v_j v_k to every entry j <= k; sum_{j<=k} |v_j v_k| <=
    d(d+1)/2 Bx^2, attained by v = (Bx, ..., Bx).

    Replace-one (``_xtx_replace_one_proof``): for rows v, w with |v_j|, |w_j| <= B write
    v_j v_k - w_j w_k = (a_j s_k + s_j a_k)/2 with a = v - w, s = v + w. Since
    |a_j| + |s_j| = 2 max(|v_j|, |w_j|) <= 2B, with A = sum|a_j|, S = sum|s_j|:
    sum_{j,k} |v_j v_k - w_j w_k| <= A S <= (A + S)^2 / 4 <= d^2 B^2, and the diagonal
    sum_j |v_j^2 - w_j^2| <= d B^2. The upper triangle is (full + diagonal)/2 <= d(d+1)/2 B^2,
    attained by v = (B, ..., B), w = 0. (tests/test_sensitivity.py checks both by brute force.)
    """
    return xtx_sensitivity(d, x_bound, rule="exact")


_xtx_replace_one_proof = xtx_sensitivity_tight


def xty_sensitivity(d, x_bound, y_bound, *, neighbouring: str = "add_remove",
                    x_norm_bound=None):
    """L1 sensitivity of X^T y: d Bx By under add/remove, 2 d Bx By under replace-one; with a
    row-norm bound, Bx replaced by t = ``coordinate_bound`` (||v||_1 <= d t)."""
    check_neighbouring(neighbouring)
    factor = 1.0 if neighbouring == "add_remove" else 2.0
    return factor * d * coordinate_bound(d, x_bound, x_norm_bound) * y_bound


def yty_sensitivity(y_bound, *, neighbouring: str = "add_remove"):
    """Sensitivity of y^T y under either relation: By^2 (each term lies in [0, By^2])."""
    check_neighbouring(neighbouring)
    return y_bound * y_bound


def n_sensitivity(neighbouring: str = "add_remove") -> float | None:
    """Sensitivity of n: 1 under add/remove; None under replace-one (n is public there)."""
    check_neighbouring(neighbouring)
    return 1.0 if neighbouring == "add_remove" else None


def validate_privacy_parameters(epsilon, x_bound, y_bound, budget_split, *,
                                neighbouring: str | None = None
                                ) -> tuple[float, float, float, tuple[float, ...]]:
    """Check the public privacy parameters; raise ValueError with the reason if invalid.

    ``budget_split`` must have one share per noisy part of the relation: 4 (Sxx, Sxy, Syy, n)
    under add/remove, 3 (Sxx, Sxy, Syy) under replace-one. With ``neighbouring=None`` either
    length is accepted (callers that only check the shares, e.g. dpfed.bounds)."""
    for name, value in (("epsilon", epsilon), ("x_bound", x_bound), ("y_bound", y_bound)):
        # numbers.Real admits numpy scalars (np.float32, np.int64) but not bool, str, None.
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    if neighbouring is not None:
        check_neighbouring(neighbouring)
        lengths = {len(_PARTS[neighbouring]): neighbouring}
    else:
        lengths = {4: "add_remove", 3: "replace_one"}
    expected = " or ".join(f"{k} numbers ({', '.join(_PARTS[r])}) under {r}"
                           for k, r in lengths.items())
    try:
        split = tuple(float(p) for p in budget_split)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"budget_split must be {expected}, got {budget_split!r}") from exc
    if len(split) not in lengths:
        raise ValueError(f"budget_split must be {expected}; got {len(split)} part(s)")
    if not all(math.isfinite(p) and p > 0 for p in split):
        raise ValueError(f"every part of budget_split must be finite and > 0, got {split}")
    if abs(sum(split) - 1.0) > 1e-9:
        raise ValueError(f"budget_split must sum to 1, got {sum(split)!r}")
    return float(epsilon), float(x_bound), float(y_bound), split


@dataclass(frozen=True)
class NoiseCalibration:
    """Sensitivity and epsilon share of each released part (module docstring).

    ``n_sensitivity``/``n_epsilon`` are None under replace-one (n released exactly)."""

    xtx_sensitivity: float
    xty_sensitivity: float
    yty_sensitivity: float
    xtx_epsilon: float
    xty_epsilon: float
    yty_epsilon: float
    n_sensitivity: float | None = None
    n_epsilon: float | None = None
    neighbouring: str = "add_remove"
    xtx_rule: str = "exact"
    x_norm_bound: float | None = None

    @property
    def xtx_scale(self) -> float:
        return self.xtx_sensitivity / self.xtx_epsilon

    @property
    def xty_scale(self) -> float:
        return self.xty_sensitivity / self.xty_epsilon

    @property
    def yty_scale(self) -> float:
        return self.yty_sensitivity / self.yty_epsilon

    @property
    def n_scale(self) -> float | None:
        if self.n_sensitivity is None:
            return None
        return self.n_sensitivity / self.n_epsilon

    @property
    def epsilon(self) -> float:
        """The total epsilon (sum of the shares)."""
        return (self.xtx_epsilon + self.xty_epsilon + self.yty_epsilon
                + (self.n_epsilon or 0.0))


def noise_calibration(d: int, epsilon: float, x_bound: float, y_bound: float,
                      budget_split=None, *, neighbouring: str = "add_remove",
                      xtx_sensitivity: str = "exact",
                      x_norm_bound: float | None = None) -> NoiseCalibration:
    """Sensitivities and per-part epsilons of one release (module docstring's tables).
    ``x_norm_bound``: the row-norm bound R the release enforces, or None (box only).

    ``budget_split=None`` takes the relation's default (``default_budget_split``). Raises
    ValueError on an unknown relation or rule, a split of the wrong length, or parameters whose
    scales are not positive finite numbers -- before any noise could be drawn."""
    check_neighbouring(neighbouring)
    rule = check_xtx_rule(xtx_sensitivity)
    if budget_split is None:
        budget_split = default_budget_split(neighbouring)
    epsilon, x_bound, y_bound, split = validate_privacy_parameters(
        epsilon, x_bound, y_bound, budget_split, neighbouring=neighbouring)
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"dimension must be an integer >= 1, got {d!r}")
    d = int(d)
    norm = check_norm_bound(x_norm_bound)
    # The parameter ``xtx_sensitivity`` shadows the function of that name: use globals.
    sxx = float(globals()["xtx_sensitivity"](d, x_bound, rule=rule, x_norm_bound=norm,
                                             neighbouring=neighbouring))
    n_sens = n_sensitivity(neighbouring)
    cal = NoiseCalibration(
        sxx, float(xty_sensitivity(d, x_bound, y_bound, neighbouring=neighbouring,
                                   x_norm_bound=norm)),
        yty_sensitivity(y_bound, neighbouring=neighbouring),
        split[0] * epsilon, split[1] * epsilon, split[2] * epsilon,
        n_sens, None if n_sens is None else split[3] * epsilon, neighbouring, rule, norm)
    # Extreme but finite inputs can overflow (Bx = 1e200) or underflow (eps = 1e-320) here;
    # refuse them now, before any noise is drawn, rather than midway through a release.
    for name in ("xtx", "xty", "yty", "n"):
        sens, eps = getattr(cal, f"{name}_sensitivity"), getattr(cal, f"{name}_epsilon")
        if sens is None:
            continue
        scale = sens / eps if eps > 0 else math.inf
        if not (0 < sens < math.inf and 0 < eps < math.inf and 0 < scale < math.inf):
            raise ValueError(f"the {name} noise scale is not a positive finite number "
                             f"(sensitivity {sens!r}, epsilon {eps!r}); bounds or epsilon are out of range")
    return cal


def expected_noise(d: int, epsilon: float, x_bound: float, y_bound: float, budget_split=None, *,
                   neighbouring: str = "add_remove", xtx_sensitivity: str = "exact",
                   x_norm_bound: float | None = None) -> NoiseDescription:
    """The ``NoiseDescription`` one release carries (dpfed.noise): one Laplace draw of scale
    ``noise_calibration(...).xtx_scale`` etc. per coordinate of Sxx (upper triangle), Sxy and Syy,
    and under add/remove one discrete Laplace draw on the integer grid (grid 1.0) of scale
    ``n_scale`` on n; under replace-one n has no term (exact).

    The scales are the nominal sensitivity / epsilon. The site's OpenDP sampler rounds its input
    to a grid 2^k far below the sensitivity and pays for that with a scale larger by at most a
    relative ~1e-8 (site_node.laplace); the description does not carry that difference. Both the
    site (what it declares) and the aggregator (what it expects from the spec) compute this
    same function, so the two agree exactly."""
    cal = noise_calibration(d, epsilon, x_bound, y_bound, budget_split,
                            neighbouring=neighbouring, xtx_sensitivity=xtx_sensitivity,
                            x_norm_bound=x_norm_bound)
    n_terms = () if cal.n_scale is None else (NoiseTerm("discrete_laplace", cal.n_scale, 1, 1.0),)
    return NoiseDescription(xtx=(NoiseTerm("laplace", cal.xtx_scale),),
                            xty=(NoiseTerm("laplace", cal.xty_scale),),
                            yty=(NoiseTerm("laplace", cal.yty_scale),),
                            n=n_terms)
