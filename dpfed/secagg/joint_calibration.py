"""Grid calibration of a JOINT secure round: m targets, Laplace or Gaussian (issue 23 parts 2-3).

A joint round releases one vector in the layout of ``dpfed.joint_sensitivity.JointLayout(d, m,
include_n=True)`` (``JointStatistics.to_vector``): [Sxx upper | n_x | Sxy_1..m | Syy_1..m |
n_1..m]. In a secure round each site encodes that vector's exact integer statistics
(``dpfed.secagg.exact.joint_exact_statistics``) on a power-of-two grid per part and adds its
share of the distributed noise; the aggregator only sees the sum. Parts (as in the
NoiseDescription of a joint round, docs/joint design): ``xtx`` (Sxx), ``xty`` (every Sxy_j),
``yty`` (every Syy_j), ``n`` (n_x and every n_j, on the integer grid, scale 1).

**Grid sensitivities.** As for single-target rounds (``fixedpoint.grid_sensitivity``,
``dpfed.secagg.exact``): a quantised row lies in the same box and ball as the clipped row, so
the real per-part sensitivities of eq. J2 / J3 (``dpfed.joint_sensitivity``) hold for the
quantised statistics; the one rounding round(s v) of each site's exact sum moves each entry by
at most one more grid unit. Per part p of k_p entries and scale s_p:

    L1_p,grid = ceil(s_p L1_p) + k_p,        L2_p,grid = s_p L2_p + sqrt(k_p)          (S1)

(triangle inequality on per-entry |Delta_grid| <= s_p |delta| + 1); the counts are integers on
scale 1: L1 = 1 + m, L2 = sqrt(1 + m), no rounding term. L1_p and L2_p are each part's norm at
the L1- resp. L2-extreme row of ``joint_sensitivity`` (one row maximises every part at once,
``joint_sensitivity`` module docstring), so summing per-part maxima loses nothing but (S1).

**Laplace** (pure eps): the real calibration of ``dpfed.joint_noise`` gives eps_p per part
(shares of epsilon); the discrete Laplace scale on the grid is b_p = L1_p,grid / eps_p
(``dlaplace.grid_noise_scale``) and T shares NB(1/T) - NB(1/T) per site sum to one draw
(method.md section 10). Event: PureDP(epsilon) (basic composition over parts).

**Gaussian via distributed Skellam** (Agarwal, Kairouz & Liu, NeurIPS 2021). Each site adds
Poisson(lam_p / T) - Poisson(lam_p / T) per entry of part p (``dpfed.secagg.skellam``); T
honest shares sum to Sk(lam_p) exactly. Privacy is charged with the Skellam RDP bound, eq. A2
of ``dpfed.accounting``, converted to (eps, delta) by eq. A3 (NOT the Gaussian profile:
Skellam is not Gaussian). Eq. A2 is the sum over coordinates of the one-dimensional bound
f(Delta_i, lam) = alpha Delta_i^2/(4 lam) + min(((2 alpha - 1) Delta_i^2 + 6|Delta_i|) /
(16 lam^2), 3|Delta_i| / (4 lam)) (independent coordinates: Renyi divergences of product laws
add; the multidimensional statement follows from sum of mins <= min of sums). With a lam_i per
coordinate and lam* = min_i lam_i, w_i = lam* / lam_i <= 1:

    f(Delta_i, lam_i) <= alpha w_i Delta_i^2 / (4 lam*) + min(((2 alpha - 1) w_i Delta_i^2
                         + 6 w_i |Delta_i|) / (16 lam*^2), 3 w_i |Delta_i| / (4 lam*))

(w_i^2 <= w_i), so the per-part mechanism is bounded by ONE Skellam event
``Skellam(lam*, l1*, l2*)`` with l2*^2 = sum_p w_p L2_p,grid^2 and l1* = sum_p w_p L1_p,grid
(raised to l2* if smaller: a larger l1 only loosens A2). That is the event the ledger debits
(``JointGridCalibration.event``). lam_p follows the Gaussian design's split (shares of mu^2,
mu = ``dpfed.gaussian.mu_for_epsilon_delta``): lam_p = kappa L2_p,grid^2 / (2 mu^2 share_p),
i.e. kappa times the variance the central Gaussian would give on the grid, and kappa >= 1 is
the smallest value (bisection; every term of A2 decreases in kappa) whose converted epsilon at
the spec's delta is <= epsilon. kappa is the variance cost over the central Gaussian of the
same (eps, delta): it comes from the RDP conversion (A3 is looser than the exact Gaussian
profile) and A2's 1/lam^2 term (negligible on a fine grid). ``JointGridCalibration.kappa``;
measured 1.13-1.20 (sd 1.06-1.10 x) at eps 0.3-4, delta 1e-5..1e-6, d = 10, m = 1..262
(tests/test_secure_joint.py bounds it in (1, 1.3); docs/benchmarks.md, "Secure joint round").

With c colluders among C contributors the honest noise is Sk((C - c) lam_p / T): a round
unmasks only with C >= T + c (``dpfed.secure_round.min_contributors``), so at least T honest
shares, the calibrated law or more, protect every patient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpfed.accounting import PureDP, Skellam, compose
from dpfed.joint_sensitivity import JointLayout
from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.secagg import dlaplace, skellam
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError, SumOutOfRange, TooFewSurvivors
from dpfed.secagg.exact import JointExactStatistics

__all__ = ["MECHANISMS", "JOINT_PARTS", "JointGridCalibration", "calibrate_joint",
           "skellam_inflation"]

MECHANISMS = ("laplace", "gaussian")
#: Noise parts of a joint vector (the NoiseDescription parts): n covers n_x and every n_j.
JOINT_PARTS = ("xtx", "xty", "yty", "n")
# Layout slices (JointLayout names) -> noise part.
_PART_OF_SLICE = {"xtx": "xtx", "n_x": "n", "xty": "xty", "yty": "yty", "n": "n"}
_KAPPA_MAX = 64.0


@dataclass(frozen=True)
class JointGridCalibration:
    """Public per part (``JOINT_PARTS``): power-of-two ``scales`` (n: 1), grid sensitivities
    ``l1`` / ``l2`` (S1), and ``grid_noise``: the discrete Laplace b (laplace) or the Skellam
    lam of one full draw (gaussian), in grid units. ``kappa``: the Skellam variance over the
    central Gaussian's (1 for laplace). Sizes the grid was checked for: ``n_sites`` K and
    ``n_max`` rows per site."""

    mechanism: str
    d: int
    m: int
    epsilon: float
    delta: float
    scales: dict
    l1: dict
    l2: dict
    grid_noise: dict
    noise_threshold: int
    n_sites: int
    n_max: int
    qx: int
    qy: int
    kappa: float = 1.0
    row_bounds: dict = field(default_factory=dict)

    # -- layout ------------------------------------------------------------------------------
    @property
    def layout(self) -> JointLayout:
        return JointLayout(self.d, self.m, include_n=True)

    @property
    def length(self) -> int:
        return self.layout.size

    def per_entry(self, per_part: dict) -> np.ndarray:
        out = np.empty(self.length)
        for name, sl in self.layout.slices().items():
            out[sl] = per_part[_PART_OF_SLICE[name]]
        return out

    @property
    def scale_vector(self) -> np.ndarray:
        return self.per_entry(self.scales)

    def sd_grid(self, part: str) -> float:
        """sd of one full draw of ``part``'s noise in grid units."""
        b = self.grid_noise[part]
        if self.mechanism == "gaussian":
            return math.sqrt(2.0 * b)
        return math.sqrt(dlaplace.dl_variance(b))

    # -- sites -------------------------------------------------------------------------------
    def encode_exact(self, stats: JointExactStatistics) -> np.ndarray:
        """The site's exact joint statistics on the grid (one rounding, exact), mod 2^64."""
        if not isinstance(stats, JointExactStatistics) or (stats.d, stats.m) != (self.d, self.m):
            raise ParameterError(f"expected JointExactStatistics of d = {self.d}, m = {self.m}")
        if (stats.qx, stats.qy) != (self.qx, self.qy):
            raise ParameterError("the statistics were quantised to another grid than the "
                                 "round's")
        return fp.encode_integers(stats.on_grid(self.scales))

    def release_exact(self, stats: JointExactStatistics) -> np.ndarray:
        """``encode_exact(stats)`` plus this site's 1/T noise share (CSPRNG)."""
        return self.release_exact_many([stats])[0]

    def release_exact_many(self, sites) -> list[np.ndarray]:
        """``release_exact`` for several sites' statistics, the shares in one CSPRNG call."""
        xs = [self.encode_exact(s) for s in sites]
        shares = self.noise_shares(len(xs))
        return [fp.add_signed(x, share) for x, share in zip(xs, shares)]

    def noise_shares(self, k: int) -> np.ndarray:
        """k independent noise shares of the whole vector (k x length int64, grid units, one
        CSPRNG call): per entry of part p, Poisson(lam_p/T) - Poisson(lam_p/T) (gaussian,
        ``skellam.noise_share``) or NB(1/T) - NB(1/T) of DL(b_p) (laplace,
        ``dlaplace.noise_share``). What ``release_exact`` adds."""
        if k == 0:
            return np.zeros((0, self.length), dtype=np.int64)
        noise = np.tile(self.per_entry(self.grid_noise), k)
        sampler = skellam.noise_share if self.mechanism == "gaussian" else dlaplace.noise_share
        return np.asarray(sampler(noise, self.noise_threshold),
                          dtype=np.int64).reshape(k, self.length)

    # -- aggregator --------------------------------------------------------------------------
    def decode(self, vector) -> np.ndarray:
        """The real values of an unmasked sum, in the joint layout (counts are integers)."""
        values = fp.decode(vector, self.scale_vector)
        if values.size != self.length:
            raise ParameterError(f"expected a vector of length {self.length}")
        return values

    def _draws(self) -> int:
        return math.ceil(self.n_sites / self.noise_threshold)

    def _tail(self, part: str) -> float:
        """Noise tail bound of a sum (grid units): TAIL_SCALES sds per full draw it holds."""
        return fp.TAIL_SCALES * self._draws() * self.sd_grid(part)

    def row_capacity(self) -> int:
        """Rows in all that the sum holds without any real part wrapping modulo 2^64."""
        return min(fp.row_capacity(scale=self.scales[p], row_bound=self.row_bounds[p],
                                   n_sites=self.n_sites, noise_draws=1.0,
                                   grid_noise=self._tail(p) / fp.TAIL_SCALES)
                   for p in ("xtx", "xty", "yty"))

    def check_sum(self, values, *, bound_name: str = "max_site_rows") -> None:
        """Refuse (``SumOutOfRange``) a decoded sum that may have wrapped modulo 2^64 or no
        honest sites could have sent (``GridCalibration.check_sum``'s rule, with n_x the row
        count and each n_j <= n_x's bound). Post-processing of the released sum only."""
        values = np.asarray(values, dtype=np.float64)
        sl = self.layout.slices()
        n_tail = self._tail("n")
        n_x = float(values[sl["n_x"]][0])
        counts = np.concatenate([values[sl["n_x"]], values[sl["n"]]])
        capacity = self.row_capacity()
        n_upper = n_x + n_tail
        if not (np.all(np.isfinite(counts)) and float(counts.min()) >= -n_tail
                and float(counts.max()) <= capacity + n_tail and n_upper <= capacity):
            raise SumOutOfRange(
                f"the sum outgrew the fixed-point grid or its counts are implausible and it is "
                f"not used: raise {bound_name} to at least "
                f"{math.ceil(max(n_upper, 0.0) / self.n_sites)} rows per site if the sites hold "
                f"more rows (this grid holds {capacity} rows in all without wrapping)")
        for name in ("xtx", "xty", "yty"):
            part = _PART_OF_SLICE[name]
            s = self.scales[part]
            limit = (max(n_upper, 0.0) * self.row_bounds[part]
                     + (self.n_sites / 2.0 + self._tail(part)) / s)
            block = values[sl[name]]
            worst = float(np.max(np.abs(block))) if block.size else 0.0
            if not worst <= limit:
                raise SumOutOfRange(
                    f"the unmasked sum is implausible and is not used: an entry of {part} is "
                    f"beyond its bound for n <= {n_upper:.0f} rows: a contribution is corrupt "
                    f"or the sum wrapped modulo 2^64 (raise {bound_name} if the sites hold "
                    f"more rows)")

    # -- description and accounting ----------------------------------------------------------
    def noise_description(self, contributors: int) -> NoiseDescription:
        """The noise of a sum of ``contributors`` shares (1 for what one site declares):
        per part one term of C shares of threshold T on the part's grid 1/s
        (``discrete_laplace``: scale b/s; ``skellam``: scale sqrt(2 lam)/s, the sd of one
        full draw; dpfed.noise.LAWS)."""
        if isinstance(contributors, bool) or not isinstance(contributors, int) \
                or contributors < 1:
            raise ParameterError("contributors must be a positive integer")
        law = "skellam" if self.mechanism == "gaussian" else "discrete_laplace"
        terms = {}
        for p in JOINT_PARTS:
            s = float(self.scales[p])
            b = float(self.grid_noise[p])
            scale = math.sqrt(2.0 * b) / s if law == "skellam" else b / s
            terms[p] = (NoiseTerm(law, scale, contributors, 1.0 / s, self.noise_threshold),)
        return NoiseDescription(**terms)

    def sum_noise(self, contributors: int) -> NoiseDescription:
        """``noise_description`` of the unmasked sum; TooFewSurvivors below T."""
        if contributors < self.noise_threshold:
            raise TooFewSurvivors(f"{contributors} contribution(s) hold fewer than T = "
                                  f"{self.noise_threshold} noise shares")
        return self.noise_description(contributors)

    def event(self):
        """The privacy event every patient in the release is charged (at >= T honest
        shares): PureDP(epsilon) (laplace) or the dominating Skellam event (module docstring)."""
        if self.mechanism == "laplace":
            return PureDP(self.epsilon)
        return _skellam_event(self.grid_noise, self.l1, self.l2)


def _skellam_event(lams: dict, l1: dict, l2: dict) -> Skellam:
    """Skellam(lam*, l1*, l2*) dominating per-part Skellam noise (module docstring)."""
    lam_star = min(lams.values())
    w = {p: lam_star / lams[p] for p in JOINT_PARTS}
    l2_star = math.sqrt(math.fsum(w[p] * l2[p] ** 2 for p in JOINT_PARTS))
    l1_star = max(math.fsum(w[p] * l1[p] for p in JOINT_PARTS), l2_star)
    return Skellam(lam_star, l1_star, l2_star)


def skellam_inflation(lam_unit: dict, l1: dict, l2: dict, epsilon: float, delta: float
                      ) -> float:
    """The smallest kappa >= 1 (to a relative 1e-9, rounded up) such that Skellam noise of lam
    ``kappa * lam_unit[p]`` per part is (epsilon, delta)-DP by eq. A2 + A3
    (``dpfed.accounting``); ParameterError beyond kappa = 64."""
    def ok(kappa):
        lams = {p: kappa * lam_unit[p] for p in JOINT_PARTS}
        return compose([_skellam_event(lams, l1, l2)]).epsilon(delta) <= epsilon
    lo, hi = 1.0, 1.0
    if ok(lo):
        return lo
    while not ok(hi):
        lo, hi = hi, hi * 2.0
        if hi > _KAPPA_MAX:
            raise ParameterError("no Skellam noise within 64 x the central Gaussian's variance "
                                 "meets this (epsilon, delta)")
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def calibrate_joint(calibration, *, n_max: int, n_sites: int, noise_threshold: int
                    ) -> JointGridCalibration:
    """The JointGridCalibration of a joint secure round (module docstring) from the real-unit
    ``dpfed.joint_noise.JointCalibration`` of its spec (per-part sensitivities, shares of
    epsilon or mu^2, noise scales) and the public round sizes: ``n_max`` rows per site (sizes
    the grid only), ``n_sites`` invited sites K, ``noise_threshold`` T."""
    from dpfed.joint_noise import joint_calibration
    from dpfed.secagg.exact import quantum_exponents

    cal = calibration
    if cal.mechanism not in MECHANISMS:
        raise ParameterError(f"mechanism must be one of {', '.join(MECHANISMS)}")
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 1:
        raise ParameterError("n_max must be a positive integer")
    if isinstance(n_sites, bool) or not isinstance(n_sites, int) or n_sites < 1:
        raise ParameterError("n_sites must be a positive integer")
    if isinstance(noise_threshold, bool) or not isinstance(noise_threshold, int) \
            or not 1 <= noise_threshold <= n_sites:
        raise ParameterError("noise_threshold must be in [1, n_sites]")
    d, m = int(cal.d), int(cal.m)
    share = dict(zip(JOINT_PARTS, cal.budget_split))
    # Per-part L1 (eq. J2 terms) for both mechanisms (eq. A2 needs it), per-part L2 (eq. J3
    # terms) for gaussian: the lead's real-unit calibration is the one implementation.
    real_l1 = joint_calibration(d, m, mechanism="laplace", epsilon=cal.epsilon,
                                x_bound=cal.x_bound, y_bound=cal.y_bound,
                                budget_split=cal.budget_split,
                                x_norm_bound=cal.x_norm_bound).sensitivities
    real_l2 = dict(cal.sensitivities) if cal.mechanism == "gaussian" else None
    real_scale = dict(cal.scales)
    # Grid: the rule of fixedpoint.choose_scales (rounding <= 2^-20 noise scales, no overflow
    # with 40-scale tails), with the joint row bounds.
    row_bounds = fp.row_bounds(x_bound=cal.x_bound, y_bound=cal.y_bound)
    draws = math.ceil(n_sites / noise_threshold)
    rows = float(n_max) * float(n_sites)
    scales = {"n": 1.0}
    for p in ("xtx", "xty", "yty"):
        scales[p] = fp.choose_scale(max_abs_sum=rows * row_bounds[p],
                                    noise_scale=real_scale[p], n_sites=n_sites,
                                    noise_draws=draws)
    sizes = {"xtx": d * (d + 1) // 2, "xty": m * d, "yty": m, "n": 1 + m}
    l1, l2 = {}, {}
    for p in ("xtx", "xty", "yty"):
        l1[p] = fp.grid_sensitivity(real_l1[p], scales[p], sizes[p])
        if real_l2 is not None:
            l2[p] = scales[p] * real_l2[p] + math.sqrt(sizes[p])                 # (S1)
    l1["n"] = 1 + m
    if real_l2 is not None:
        l2["n"] = math.sqrt(1 + m)
    kappa = 1.0
    if cal.mechanism == "laplace":
        noise = {p: dlaplace.grid_noise_scale(int(l1[p]), cal.losses[p]) for p in JOINT_PARTS}
        l2 = {p: float(l1[p]) for p in JOINT_PARTS}      # unused by the pure-eps event
    else:
        mu2 = cal.mu * cal.mu
        unit = {p: l2[p] ** 2 / (2.0 * mu2 * share[p]) for p in JOINT_PARTS}
        kappa = skellam_inflation(unit, l1, l2, cal.epsilon, cal.delta)
        # lam_for_variance checks each lam (finite, > 0, < 2^50: the Poisson sampler's range)
        noise = {p: skellam.lam_for_variance(2.0 * kappa * unit[p]) for p in JOINT_PARTS}
    qx, qy = quantum_exponents(cal.x_bound, cal.y_bound, cal.x_norm_bound)
    out = JointGridCalibration(cal.mechanism, d, m, float(cal.epsilon), float(cal.delta), scales,
                               l1, l2, noise, int(noise_threshold), int(n_sites), int(n_max),
                               qx, qy, kappa, row_bounds)
    # The grid must hold n_sites * n_max rows with the sum's noise tails (a Skellam sd may
    # exceed the Gaussian sd the scales were chosen with by sqrt(kappa)).
    if out.row_capacity() < rows:
        raise ParameterError("bounds, rows or sites too large for 64-bit secure aggregation "
                             "with this noise")
    if rows + out._tail("n") >= 2.0 ** 63:
        raise ParameterError("n overflows 2^63")
    return out
