"""Floating-point-safe Gaussian noise from OpenDP for the site (issue 23; used by the joint
release, ``site_node.joint_release``).

The central Gaussian mechanism of ``dpfed.gaussian``: sigma = Delta_2 / sqrt(2 rho) on a vector
of L2 sensitivity Delta_2 is rho-zCDP (Bun & Steinke 2016). As with the Laplace noise
(``site_node.laplace``; Mironov 2012 on floating-point noise), the samples come from OpenDP's
``make_gaussian`` (OpenDP 0.16: ``vector_domain(atom_domain(T=float, nan=False), size=n)``,
``l2_distance(T=float)``, output measure ``ZeroConcentratedDivergence``): it rounds every input
to a grid 2^k and adds *discrete* Gaussian noise sampled exactly from the operating system's
CSPRNG (Canonne, Kamath & Steinke, NeurIPS 2020), so no float bit of the output depends on
the input beyond the grid value.

The grid is k = floor(log2 Delta_2) - 40, as for the Laplace noise: rounding moves the L2
distance of two neighbours by at most sqrt(size) 2^k, which OpenDP's privacy map includes.
The scale starts at sigma_for_rho(Delta_2, rho) and is nudged up (relative 1e-12 steps) until
OpenDP's own map certifies a loss <= rho at distance Delta_2; the certified rho is returned and
is what a ledger must charge (it is never above the requested rho).

What to charge. OpenDP proves rho-zCDP for its discrete Gaussian, so
``dpfed.accounting.ZCDP(certified)`` is the proof-backed event. ``dpfed.accounting.Gaussian``
(the exact mu-GDP profile) is the *continuous* Gaussian's; the discrete Gaussian's exact
profile is given by discrete-Gaussian tails instead (Canonne, Kamath & Steinke 2020, Theorem 7)
and, on a grid 2^40 times finer than the sensitivity, agrees with it to far below any delta
that matters, but that is an argument, not OpenDP's certificate. The difference in eps is a few
per cent (one release of mu = 1 at delta 1e-6: 4.89 as GDP, 5.22 as rho = 0.5 through RDP). The
ledger charges ``Gaussian(mu)`` (``dpfed.joint_noise.JointCalibration.event``): the round promises
(eps, delta) by the exact profile, and the issue's own study found the textbook rho conversion
costs 0.81 -> 0.84 of the non-private accuracy (docs/method.md section 13).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import opendp.prelude as dp

from dpfed.gaussian import sigma_for_rho

dp.enable_features("contrib")

_GRID_BITS_BELOW_SENSITIVITY = 40

__all__ = ["gaussian_scale", "add_gaussian_noise"]


@functools.lru_cache(maxsize=256)
def _calibrated_gaussian(size: int, l2_sensitivity: float, rho: float):
    """(measurement, scale, certified rho) of OpenDP's Gaussian on ``size`` floats."""
    k = math.floor(math.log2(l2_sensitivity)) - _GRID_BITS_BELOW_SENSITIVITY
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    metric = dp.l2_distance(T=float)
    scale = sigma_for_rho(l2_sensitivity + math.sqrt(size) * 2.0 ** k, rho)
    for _ in range(64):
        meas = dp.m.make_gaussian(domain, metric, scale=scale, k=k)
        certified = meas.map(l2_sensitivity)
        if certified <= rho:
            return meas, scale, certified
        scale = math.nextafter(scale * (1 + 1e-12), math.inf)
    raise RuntimeError("could not calibrate the Gaussian scale")  # pragma: no cover


def gaussian_scale(size: int, l2_sensitivity: float, rho: float) -> float:
    """The standard deviation actually used: sigma_for_rho(Delta_2, rho) up to a relative ~1e-8
    (the grid's slack)."""
    return _calibrated_gaussian(int(size), float(l2_sensitivity), float(rho))[1]


def add_gaussian_noise(values, l2_sensitivity: float, rho: float) -> tuple[np.ndarray, float]:
    """``values`` (1-D, finite) plus OpenDP Gaussian noise calibrated to rho-zCDP at L2
    sensitivity ``l2_sensitivity``. Returns (noisy values, certified rho <= ``rho``)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError("values must be a non-empty 1-D array")
    if not np.all(np.isfinite(values)):
        raise ValueError("values must be finite")
    for name, v in (("l2_sensitivity", l2_sensitivity), ("rho", rho)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v!r}")
    meas, _, certified = _calibrated_gaussian(values.size, float(l2_sensitivity), float(rho))
    return np.asarray(meas(values.tolist()), dtype=np.float64), certified
