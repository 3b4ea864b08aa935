"""Robust private linear regression: the proposed method (Honkela et al. 2018, sections 4.2-4.3;
method.md sections 2-3).

Each of K sites projects its private rows into [-Bx, Bx] x [-By, By] and releases Sxx, Sxy, Syy
with Laplace noise (``site_node.release.release_statistics``, the production mechanism with
OpenDP noise, under the setting's neighbouring relation and Sxx rule: by default add/remove with
noisy n, exact Sxx sensitivity; with ``neighbouring="replace_one"`` the paper's bounded DP, n
exact; here via ``release_many``, which draws the K sites' noise in one OpenDP call per part with
the same per-site mechanism; with ``setting.x_norm_bound`` the rows are also projected into
the L2 ball, ``dpfed.sensitivity``). The aggregator sums the releases and adds the exact
statistics of the public rows, clipped with the round's public bounds like the private rows
(``clipped_public_statistics``, as ``coordinator.roundspec`` does), then fits the Gamma-prior
model: by default the noise-aware posterior (method.md section 8), which knows the sum holds
K independent release noises (``Statistics.noise``) and fits the public part with its own
exact likelihood.

With ``PrivacySetting.aggregation == "secure"`` (issue 10, method.md section 10) the sum is
what a secure round hands the aggregator instead (``secure_sum``): each site's exact clipped
statistics (quantised rows, integer sums: ``site_node.release.exact_clipped_statistics``, as a
site of a secure round computes them) on the fixed-point grid plus its 1/T share of
distributed discrete Laplace noise (``dpfed.secagg.calibration``, the code the round protocol
runs), summed modulo 2^64 and decoded. With T = K (every site honest) the sum carries ONE
discrete Laplace draw at the grid-calibrated scale, and its ``Statistics.noise`` says so
(``GridCalibration.noise_description(K)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfed.secagg import fixedpoint
from dpfed.secagg.calibration import GridCalibration, calibrate
from dpfed.sensitivity import noise_calibration
from dpfed.statistics import Statistics, clipped_exact_statistics, exact_statistics, validate_shapes
from dpfed_apps.evaluation.methods.base import (PrivacySetting, TrainingData, split_rows,
                                                validate_posterior)
from dpfed_apps.evaluation.methods.posterior_fit import posterior_beta
from site_node.release import exact_clipped_statistics, release_many


def secure_inputs(blocks, setting: PrivacySetting, noise_threshold: int | None = None
                  ) -> tuple[GridCalibration, list[np.ndarray]]:
    """The grid calibration of a secure round of ``len(blocks)`` = K sites and each site's
    input x_u (``GridCalibration.release_exact``: the exact statistics of its clipped,
    quantised rows, Sxx upper triangle, Sxy, Syy and n, in fixed point, plus its noise share),
    i.e. exactly what each site hands ``dpfed.secagg.protocol.SiteSession.masked_input``.
    ``noise_threshold`` T defaults to K (every site honest). All public inputs: eps, bounds,
    split, relation, K, the largest site's rows (n_max, which only sizes the grid) and T;
    the calibration is the one of ``dpfed.secure_round._calibration`` (the round's relation,
    ``statistics="exact"``)."""
    shaped = [validate_shapes(x, y) for x, y in blocks]
    if len(shaped) < 2:
        raise ValueError("secure aggregation needs at least 2 sites (K = 1 is independent)")
    d = shaped[0][0].shape[1]
    if any(x.shape[1] != d for x, _ in shaped):
        raise ValueError("every block must have the same number of columns d")
    k = len(shaped)
    t = k if noise_threshold is None else int(noise_threshold)
    cal = noise_calibration(d, setting.epsilon, setting.x_bound, setting.y_bound,
                            setting.budget_split, neighbouring=setting.neighbouring,
                            xtx_sensitivity=setting.xtx_sensitivity,
                            x_norm_bound=setting.x_norm_bound)
    grid = calibrate(d=d, n_max=max(x.shape[0] for x, _ in shaped), n_sites=k,
                     x_bound=setting.x_bound, y_bound=setting.y_bound, calibration=cal,
                     noise_threshold=t, statistics="exact")
    sites = [exact_clipped_statistics(x, y, setting.x_bound, setting.y_bound,
                                      setting.x_norm_bound) for x, y in shaped]
    # Each site's release with its own share, the K shares drawn in one CSPRNG call.
    return grid, grid.release_exact_many(sites)


def decode_secure_sum(grid: GridCalibration, vector, contributors: int) -> Statistics:
    """The Statistics of an unmasked secure sum of ``contributors`` inputs: decoded values, n
    clamped at 0 (post-processing, as each independent release clamps its own n), and the
    noise description of the sum (one draw when T = contributors)."""
    upper, n = grid.decode(vector)
    return Statistics.from_upper(grid.layout.d, max(0, int(round(n))), upper,
                                 grid.noise_description(contributors))


def secure_sum(blocks, setting: PrivacySetting, noise_threshold: int | None = None
               ) -> Statistics:
    """What a secure round of K = ``len(blocks)`` sites hands the aggregator: the sum modulo
    2^64 of the sites' inputs (``secure_inputs``), decoded (``decode_secure_sum``).

    The masks are not simulated: every masked input is x_u + PRG(b_u) + sum_v +-PRG(s_uv) mod
    2^64, the pairwise masks cancel in the sum and the aggregator removes the self-masks it
    reconstructs, all in exact integer arithmetic modulo 2^64, so the unmasked sum of a round
    in which no site drops out is sum_u x_u mod 2^64 bit for bit (checked against
    ``dpfed.secagg.simulate.run_round`` on the same inputs in
    tests/evaluation/test_secure_aggregation.py)."""
    grid, inputs = secure_inputs(blocks, setting, noise_threshold)
    return decode_secure_sum(grid, fixedpoint.wrap_sum(inputs), len(inputs))


def public_statistics(data: TrainingData) -> Statistics:
    """Exact statistics of the public rows (zero with n = 0 when there are none)."""
    if data.n_public == 0:
        return Statistics.zeros(data.dim)
    return exact_statistics(data.x_public, data.y_public)


def clipped_public_statistics(data: TrainingData, setting: PrivacySetting) -> Statistics:
    """Exact statistics of the public rows clipped like the private rows (box, then the
    row-norm ball): both parts then describe the same clipped-data regression, which the
    model fits with one beta and one lambda (``dpfed.statistics.clipped_exact_statistics``)."""
    if data.n_public == 0:
        return Statistics.zeros(data.dim)
    return clipped_exact_statistics(data.x_public, data.y_public, setting.x_bound,
                                    setting.y_bound, setting.x_norm_bound)


@dataclass(frozen=True)
class RobustPrivate:
    """``posterior``: one of ``dpfed_apps.evaluation.methods.base.POSTERIORS`` ("laplace": the
    noise-aware fit, the default; "plug-in-advi": the paper's); ``draws``: m."""

    posterior: str = "laplace"
    draws: int = 1000        # the predictor is the posterior mean; 1000 draws estimate it
    name: ClassVar[str] = "robust_private"
    private: ClassVar[bool] = True

    def __post_init__(self):
        validate_posterior(self.posterior, self.draws)

    def statistics(self, data: TrainingData, setting: PrivacySetting) -> Statistics:
        """Sum of the K site releases plus the exact public statistics: exactly what the
        production federation aggregates. Fresh OpenDP noise on every call."""
        total = clipped_public_statistics(data, setting)
        blocks = [(data.x_private[rows], data.y_private[rows])
                  for rows in split_rows(data.n_private, setting.n_sites)]
        if not blocks:
            return total
        if setting.aggregation == "secure" and len(blocks) >= 2:
            return total + secure_sum(blocks, setting)
        # The K sites' releases, their noise drawn in 3 OpenDP calls (release_many: each
        # site's block gets exactly the mechanism and guarantee of release_statistics).
        for site in release_many(blocks, epsilon=setting.epsilon, x_bound=setting.x_bound,
                                 y_bound=setting.y_bound, budget_split=setting.budget_split,
                                 neighbouring=setting.neighbouring,
                                 xtx_sensitivity=setting.xtx_sensitivity,
                                 x_norm_bound=setting.x_norm_bound):
            total = total + site
        return total

    def fit(self, data: TrainingData, setting: PrivacySetting, *, seed: int) -> np.ndarray:
        return posterior_beta(self.statistics(data, setting), posterior=self.posterior,
                              draws=self.draws, seed=seed,
                              public=clipped_public_statistics(data, setting),
                              x_bound=setting.x_bound, y_unit=setting.y_bound,
                              fallback="nuts")
