"""Noise calibration of a joint release: Laplace (pure eps) or Gaussian ((eps, delta)) (issue 23).

The joint vector of ``dpfed.joint_sensitivity`` (``JointLayout(d, m, include_n=True)``) is
released in four parts p: ``xtx`` (Sxx upper triangle), ``xty`` (every Sxy_j), ``yty`` (every
Syy_j) and ``n`` (n_x and every n_j). A round's ``budget_split`` (s_xtx, s_xty, s_yty, s_n),
summing to 1, shares the privacy loss between them. Add/remove neighbours only.

**Laplace** (pure eps-DP by basic composition; method.md section 2). Part p gets eps_p = s_p eps
and Laplace noise of scale b_p = Delta1_p / eps_p per coordinate, with the part's L1
sensitivity (eq. J2 of ``dpfed.joint_sensitivity`` split by part; t = min(Bx, R/sqrt(d))):

    Delta1_xtx = d(d+1)/2 t^2,  Delta1_xty = m d t By,  Delta1_yty = m By^2,  Delta1_n = 1 + m.

The counts get discrete Laplace noise on the integer grid. Their sum is the joint L1 (J2),
tested. The L1 of the targets' block grows like m: at m = 262 the Laplace release of Sxy is
hopeless at any useful epsilon (the issue's study: 0.30 of non-private).

**Gaussian** (mu-GDP, Dong, Roth & Su 2019; (eps, delta) by the exact profile of Balle & Wang
2018, ``dpfed.gaussian``). The round's (eps, delta) gives mu = ``mu_for_epsilon_delta``. Part p
gets Gaussian noise of sd sigma_p per coordinate. The release is the unit-variance Gaussian
mechanism on (f_p / sigma_p)_p, whose GDP parameter is the weighted L2 sensitivity
sup_row sqrt(sum_p ||g_p||^2 / sigma_p^2) (``joint_l2_sensitivity(weights=1/sigma^2)``). Every
part's norm ||g_p|| is largest at the *same* row (the concentrated row with every response at
+By: eq. J3), so the supremum is sum_p Delta2_p^2 / sigma_p^2 with

    Delta2_xtx^2 = (S^2 + k c^2 + r^2)/2,  Delta2_xty^2 = m By^2 S,  Delta2_yty^2 = m By^4,
    Delta2_n^2 = 1 + m,

and sigma_p = Delta2_p / (mu sqrt(s_p)) makes it exactly mu^2 (s_p of mu^2 to part p). Each part
is then the Gaussian mechanism of rho_p = s_p mu^2 / 2 at sensitivity Delta2_p (what the site
asks OpenDP for, ``site_node.gaussian``); rho = sum rho_p = mu^2 / 2. The L2 of the targets'
block grows like sqrt(m). The ledger charges ``Gaussian(mu)`` (the exact profile); OpenDP
certifies the zCDP of its discrete Gaussian, which implies the same mu-GDP up to the grid's
slack 2^-40 of the sensitivity (``site_node.gaussian`` docstring; method.md section 13).

Both the site (what it declares) and the aggregator (what it expects from the spec) compute
``joint_calibration(...).noise()``, so the two agree exactly. The scales are the nominal ones;
OpenDP's samplers use scales larger by at most a relative ~1e-8 (more noise, never less).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from dpfed.accounting import Gaussian, PureDP
from dpfed.gaussian import mu_for_epsilon_delta
from dpfed.joint_sensitivity import concentrated_row, joint_l1_sensitivity
from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.sensitivity import check_norm_bound, coordinate_bound

__all__ = ["MECHANISMS", "LAPLACE", "GAUSSIAN", "JOINT_PARTS", "JOINT_DEFAULT_SPLIT",
           "JointCalibration", "joint_calibration", "calibration_from_spec", "mechanism_of"]

LAPLACE = "laplace"
GAUSSIAN = "gaussian"
MECHANISMS = (LAPLACE, GAUSSIAN)
JOINT_PARTS = ("xtx", "xty", "yty", "n")
#: Shares of the loss (eps for Laplace, mu^2 for Gaussian) per part when a round names none.
#: Sxy carries the signal of every target; Sxx is shared and its L2 sensitivity is small
#: (about 1 at R = 1 against sqrt(m) By for Sxy), so a small share already makes its noise
#: small. Chosen by benchmarks/joint_gdsc_study.py on synthetic panels built from the 10
#: public lines only (m = 262, d = 10), then checked on GDSC: +0.008 +- 0.003 (n = 700) and
#: +0.014 +- 0.005 (n = 300) in Spearman over (0.30, 0.60, 0.05, 0.05) (docs/evaluation.md,
#: "Every drug in one round").
JOINT_DEFAULT_SPLIT = (0.05, 0.90, 0.03, 0.02)


def _positive(name: str, value) -> float:
    if isinstance(value, (bool,)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _split(budget_split) -> tuple[float, ...]:
    if budget_split is None:
        return JOINT_DEFAULT_SPLIT
    try:
        split = tuple(float(p) for p in budget_split)
    except (TypeError, ValueError):
        raise ValueError("budget_split must be 4 numbers (Sxx, Sxy, Syy, counts)") from None
    if len(split) != 4:
        raise ValueError(f"a joint round's budget_split needs 4 shares (Sxx, Sxy, Syy, counts), "
                         f"got {len(split)}")
    if not all(math.isfinite(p) and p > 0 for p in split) or abs(sum(split) - 1.0) > 1e-9:
        raise ValueError("every share of budget_split must be > 0 and they must sum to 1")
    return split


def mechanism_of(value) -> str:
    """The mechanism a spec names ("" means Laplace, the default)."""
    name = str(value or LAPLACE)
    if name not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    return name


@dataclass(frozen=True)
class JointCalibration:
    """Sensitivity, loss share and noise scale of each part of one joint release."""

    mechanism: str
    d: int
    m: int
    epsilon: float
    delta: float
    x_bound: float
    y_bound: float
    budget_split: tuple[float, ...]
    x_norm_bound: float | None
    #: Laplace: each part's L1 sensitivity; Gaussian: its L2 sensitivity (at the extreme row).
    sensitivities: dict = field(default_factory=dict)
    #: Laplace b or Gaussian sigma per coordinate, per part.
    scales: dict = field(default_factory=dict)
    #: Laplace: eps_p per part; Gaussian: rho_p per part (zCDP of the part's mechanism).
    losses: dict = field(default_factory=dict)
    #: Gaussian: the GDP parameter of the whole release (0 for Laplace).
    mu: float = 0.0

    @property
    def rho(self) -> float:
        """zCDP of the whole release: mu^2/2 (Gaussian), eps^2/2 (Laplace: pure eps implies it)."""
        return self.mu ** 2 / 2 if self.mechanism == GAUSSIAN else self.epsilon ** 2 / 2

    def noise(self) -> NoiseDescription:
        """The NoiseDescription one site's release carries (module docstring)."""
        if self.mechanism == GAUSSIAN:
            terms = {p: (NoiseTerm("gaussian", self.scales[p]),) for p in JOINT_PARTS}
        else:
            terms = {p: (NoiseTerm("laplace", self.scales[p]),) for p in JOINT_PARTS[:3]}
            terms["n"] = (NoiseTerm("discrete_laplace", self.scales["n"], 1, 1.0),)
        return NoiseDescription(**terms)

    def event(self):
        """What the release costs each patient in it, in the accountant's terms
        (``dpfed.accounting``): PureDP(eps) or Gaussian(mu)."""
        return Gaussian(self.mu) if self.mechanism == GAUSSIAN else PureDP(self.epsilon)


def _l1_parts(d, m, bx, by, norm) -> dict:
    t = float(coordinate_bound(d, bx, norm))
    return {"xtx": 0.5 * d * (d + 1) * t * t, "xty": m * d * t * by, "yty": m * by * by,
            "n": 1.0 + m}


def _l2_parts(d, m, bx, by, norm) -> dict:
    s, k, c, r = concentrated_row(d, bx, norm)
    return {"xtx": math.sqrt(0.5 * (s * s + k * c * c + r * r)), "xty": math.sqrt(m * by * by * s),
            "yty": math.sqrt(m) * by * by, "n": math.sqrt(1.0 + m)}


def joint_calibration(d: int, m: int, *, mechanism: str, epsilon: float, delta: float = 0.0,
                      x_bound: float, y_bound: float, budget_split=None,
                      x_norm_bound: float | None = None) -> JointCalibration:
    """The calibration of a joint release (module docstring). ``delta`` must be 0 for Laplace
    and in (0, 1) for Gaussian. Raises ValueError before anything could be drawn."""
    mechanism = mechanism_of(mechanism)
    for name, value in (("d", d), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    d, m = int(d), int(m)
    epsilon = _positive("epsilon", epsilon)
    bx, by = _positive("x_bound", x_bound), _positive("y_bound", y_bound)
    norm = check_norm_bound(x_norm_bound)
    split = _split(budget_split)
    delta = float(delta)
    if mechanism == LAPLACE:
        if delta != 0.0:
            raise ValueError("a Laplace release is pure epsilon-DP: delta must be 0")
        sens = _l1_parts(d, m, bx, by, norm)
        losses = {p: s * epsilon for p, s in zip(JOINT_PARTS, split)}
        scales = {p: sens[p] / losses[p] for p in JOINT_PARTS}
        mu = 0.0
    else:
        if not 0.0 < delta < 1.0:
            raise ValueError(f"a Gaussian release needs 0 < delta < 1, got {delta!r}")
        mu = mu_for_epsilon_delta(epsilon, delta)
        sens = _l2_parts(d, m, bx, by, norm)
        losses = {p: s * mu * mu / 2.0 for p, s in zip(JOINT_PARTS, split)}
        scales = {p: sens[p] / (mu * math.sqrt(s)) for p, s in zip(JOINT_PARTS, split)}
    for p in JOINT_PARTS:
        if not (0 < scales[p] < math.inf and 0 < sens[p] < math.inf):
            raise ValueError(f"the {p} noise scale is not a positive finite number; bounds or "
                             f"epsilon are out of range")
    return JointCalibration(mechanism, d, m, epsilon, delta, bx, by, split, norm, sens, scales,
                            losses, mu)


def calibration_from_spec(spec) -> JointCalibration:
    """The calibration a joint ``dpfed.v1.RoundSpec`` (``spec.targets`` non-empty) asks for;
    the row-norm bound follows the spec's pre-processing (``dpfed.sensitivity.row_norm_bound``)."""
    from dpfed.sensitivity import row_norm_bound
    if not len(spec.targets):
        raise ValueError("not a joint round: the spec names no targets")
    if (spec.neighbouring or "add_remove") != "add_remove":
        raise ValueError("a joint round releases counts: neighbouring must be add_remove")
    return joint_calibration(len(spec.feature_names), len(spec.targets),
                             mechanism=spec.mechanism, epsilon=spec.epsilon, delta=spec.delta,
                             x_bound=spec.x_bound, y_bound=spec.y_bound,
                             budget_split=list(spec.budget_split) or None,
                             x_norm_bound=row_norm_bound(spec.preprocessing.normalize_rows))


def l1_total(cal: JointCalibration) -> float:
    """The joint L1 sensitivity (eq. J2) of a Laplace calibration's parts, for checks."""
    return joint_l1_sensitivity(cal.d, cal.m, cal.x_bound, cal.y_bound,
                                x_norm_bound=cal.x_norm_bound, include_n=True)
