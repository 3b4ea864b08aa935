"""The site's private release of a JOINT round: one Sxx for m targets (issue 23 parts 2-3).

A joint round names m responses (drugs). X^T X does not depend on the response, so it is
released once and shared by every target (method.md section 13; Neel 2023, PRIMO); per target
j the round releases Sxy_j, Syy_j and the count n_j over the rows that HAVE response j. The
joint vector is (``dpfed.joint_sensitivity``, eq. J1)

    [ Sxx upper (d(d+1)/2) | n_x | Sxy_1 .. Sxy_m | Syy_1 .. Syy_m | n_1 .. n_m ].

Clipping is the single-target release's (``site_node.release.clip`` then ``project_rows``: the
box |x_i| <= Bx, then the ball ||x|| <= R); every present response is clipped to
[-By, By] (the responses were standardised by the round's public TargetSpec, so one By serves
all). A missing response (NaN) contributes nothing to its target; it is not a reason to drop
the row, whose features still enter Sxx and n_x. An infinite value (feature or response)
raises ValueError before anything is drawn (it would otherwise be clipped into a bound).

Noise, per part p in (xtx, xty, yty, n), from the round's ``dpfed.joint_noise.JointCalibration``
(the calibration is the one concept; this module only draws it):

* ``laplace`` (pure eps): each part is an eps_p-DP Laplace mechanism at its own L1 sensitivity
  (eq. J2 split by part), eps = sum eps_p (basic composition). Real parts with
  ``site_node.laplace.add_laplace_noise`` (OpenDP, CSPRNG, grid 2^k below the sensitivity);
  the m + 1 counts [n_x, n_1 .. n_m] with OpenDP's discrete Laplace
  (``site_node.laplace.add_count_noise``) at scale (1 + m) / eps_n: the count vector's L1
  sensitivity is 1 + m (a patient is one row: n_x and each present n_j move by one), and the
  discrete Laplace loss at integer L1 distance D is exactly D / scale, so the certificate is
  (1 + m) times OpenDP's certificate at distance 1.
* ``gaussian`` ((eps, delta), accounted as mu-GDP): part p gets sigma_p = Delta_p / (mu
  sqrt(share_p)), i.e. rho_p = share_p mu^2 / 2, with Delta_p the part's term of the L2
  sensitivity at the extreme row (eq. J3), so the whole release is mu-GDP / (mu^2/2)-zCDP (zCDP
  composition, Bun & Steinke 2016, Lemma 2.3). Drawn with ``site_node.gaussian.
  add_gaussian_noise`` (OpenDP's discrete Gaussian on the grid 2^k, k = floor(log2 Delta_p) -
  40, CSPRNG), which certifies rho_p at L2 distance Delta_p. The counts are drawn the same way
  and then rounded to the nearest integer: an integer-valued law, and rounding is
  post-processing. (OpenDP 0.16's Gaussian on 64-bit integers takes an INTEGER L2 distance; the
  count block's sqrt(1 + m) is not one, and certifying at ceil(sqrt(1 + m)) would need a larger
  sigma than the calibration declares.)

Counts are clamped at 0 after the noise (post-processing). Nothing data-dependent is released
unaccounted: the certified losses are summed and checked against the calibration's total before
anything is returned (``JointReleaseInfo``); a parameter that does not match the calibration
(the drawn scale, a sensitivity below the one recomputed here from ``dpfed.joint_sensitivity``)
raises ValueError before any noise is drawn.
"""

from __future__ import annotations

import math

import numpy as np

from dpfed.joint_sensitivity import joint_l1_sensitivity, joint_l2_sensitivity
from dpfed.joint_statistics import JointStatistics
from site_node.gaussian import add_gaussian_noise, gaussian_scale
from site_node.laplace import add_count_noise, add_laplace_noise, laplace_scale
from site_node.release import clip, project_rows

__all__ = ["release_joint_statistics", "joint_clipped_statistics", "JointReleaseInfo"]

PARTS = ("xtx", "xty", "yty", "n")
# Relative slack between a certified loss and the calibration's (float summation order).
_CERT_SLACK = 1e-9
# The scales OpenDP uses are the calibration's nudged up by the grid slack (~1e-8 relative).
_SCALE_SLACK = 1e-6
# Rows per block of the clip + accumulate pass: about 1 MiB of clipped responses.
_BLOCK_BYTES = 1 << 20


class JointReleaseInfo(dict):
    """Accounting of one joint release: the mechanism, what OpenDP certified per part
    (``epsilon_<part>`` for Laplace, ``rho_<part>`` for Gaussian) and in total
    (``epsilon_certified`` / ``rho_certified``), the calibration's total, d, m, the counts."""


def _data(x, y, d: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """x (n, d) and y (n, m) float64; shapes checked against the calibration (ValueError)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1 and m == 1:
        y = y.reshape(-1, 1)
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"x must be an (n, {d}) array, got shape {x.shape}")
    if y.ndim != 2 or y.shape != (x.shape[0], m):
        raise ValueError(f"y must be an ({x.shape[0]}, {m}) array (NaN = missing response), "
                         f"got shape {y.shape}")
    return x, y


def joint_clipped_statistics(x, y, x_bound: float, y_bound: float,
                             x_norm_bound: float | None = None):
    """The exact joint statistics of the clipped rows, in one blocked pass:
    (Sxx (d, d) exactly symmetric, n_x, Sxy (m, d), Syy (m,), n (m,) int64).

    Features: clipped to the box, then projected into the ball (``site_node.release``).
    Responses: NaN is missing (contributes nothing to its target); present ones are clipped
    to [-By, By]. Sxy for all targets is one matrix product per block with the missing
    responses zeroed. Raises ValueError (naming a row and column, never a value) for a
    non-finite feature or an infinite response."""
    n, d = x.shape
    m = y.shape[1]
    rows = max(64, min(max(n, 1), _BLOCK_BYTES // (8 * max(m, d))))
    xtx = np.zeros((d, d))
    xty = np.zeros((m, d))
    yty = np.zeros(m)
    missing = np.zeros(m, dtype=np.int64)
    zb = np.empty((rows, d))
    ub = np.empty((rows, m))
    nan = np.empty((rows, m), dtype=bool)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        k = stop - start
        xs, ys = x[start:stop], y[start:stop]
        if not np.all(np.isfinite(xs)):
            bad = np.argwhere(~np.isfinite(xs))[0]
            raise ValueError(f"x contains NaN or infinite values (first at row "
                             f"{int(bad[0]) + start}, column {int(bad[1])})")
        z, u, miss = zb[:k], ub[:k], nan[:k]
        np.isnan(ys, out=miss)
        if np.any(np.isinf(ys)):
            bad = np.argwhere(np.isinf(ys))[0]
            raise ValueError(f"y contains an infinite value (first at row "
                             f"{int(bad[0]) + start}, target {int(bad[1])}); a missing "
                             f"response is NaN")
        np.copyto(z, clip(xs, x_bound))
        if x_norm_bound is not None:
            project_rows(z, x_norm_bound)
        np.copyto(u, clip(ys, y_bound))
        np.putmask(u, miss, 0.0)   # missing: contributes nothing (2x faster than u[miss] = 0)
        xtx += z.T @ z
        xty += u.T @ z
        yty += np.einsum("ij,ij->j", u, u)
        missing += miss.sum(axis=0)
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    return xtx, int(n), xty, yty, (n - missing).astype(np.int64)


def _check_calibration(cal, d: int, m: int) -> None:
    """The calibration's per-part budgets add up to its total, and its sensitivities are not
    below those recomputed from ``dpfed.joint_sensitivity`` (fail closed, nothing drawn)."""
    if cal.mechanism not in ("laplace", "gaussian"):
        raise ValueError(f"unknown mechanism {cal.mechanism!r}")
    if (cal.d, cal.m) != (d, m):
        raise ValueError(f"the calibration is for d={cal.d}, m={cal.m}, the data has "
                         f"d={d}, m={m}")
    if set(cal.sensitivities) != set(PARTS) or set(cal.scales) != set(PARTS):
        raise ValueError(f"the calibration must give parts {PARTS}")
    kw = dict(x_norm_bound=cal.x_norm_bound, include_n=True)
    if cal.mechanism == "laplace":
        parts = {p: float(cal.losses[p]) for p in PARTS}
        total = float(cal.epsilon)
        # The parts' L1 sensitivities add up to the joint L1 sensitivity (eq. J2).
        need = joint_l1_sensitivity(d, m, cal.x_bound, cal.y_bound, **kw)
        have = math.fsum(float(cal.sensitivities[p]) for p in PARTS)
        if have < need * (1 - 1e-12):
            raise ValueError("the calibration's L1 sensitivities are below the joint L1 "
                             "sensitivity (dpfed.joint_sensitivity eq. J2)")
    else:
        parts = {p: float(cal.losses[p]) for p in PARTS}
        total = float(cal.rho)
        zero = {"xtx": 0.0, "n_x": 0.0, "xty": 0.0, "yty": 0.0, "n": 0.0}
        for p in PARTS:
            weights = dict(zero, **({"n_x": 1.0, "n": 1.0} if p == "n" else {p: 1.0}))
            need = joint_l2_sensitivity(d, m, cal.x_bound, cal.y_bound, weights=weights, **kw)
            if float(cal.sensitivities[p]) < need * (1 - 1e-12):
                raise ValueError(f"the calibration's L2 sensitivity of part {p} is below its "
                                 f"term of the joint L2 sensitivity (eq. J3)")
    if not all(math.isfinite(v) and v > 0 for v in parts.values()):
        raise ValueError("every part needs a finite budget > 0")
    if math.fsum(parts.values()) > total * (1 + _CERT_SLACK):
        raise ValueError("the calibration's per-part budgets exceed its total")


def _drawn_scale(cal, part: str, size: int) -> float:
    """The scale OpenDP will use for ``part`` (no draw), checked against the calibration's
    declared scale: the release's noise description must be what is drawn."""
    sens = float(cal.sensitivities[part])
    if cal.mechanism == "laplace":
        # Counts: discrete Laplace with scale 1 / (eps_n / (1 + m)) = (1 + m) / eps_n.
        scale = (float(cal.sensitivities["n"]) / float(cal.losses["n"]) if part == "n"
                 else laplace_scale(size, sens, float(cal.losses[part])))
    else:
        scale = gaussian_scale(size, sens, float(cal.losses[part]))
    want = float(cal.scales[part])
    if not abs(scale - want) <= _SCALE_SLACK * want:
        raise ValueError(f"part {part}: the scale OpenDP draws ({scale:.10g}) is not the "
                         f"calibration's ({want:.10g})")
    return scale


def release_joint_statistics(x, y, calibration, *, return_info: bool = False):
    """Release the joint statistics of private data with the noise of ``calibration``.

    ``x`` (n, d) features (finite; the caller leaves out rows without features), ``y`` (n, m)
    responses already standardised by each target's public (y_mean, y_scale), NaN where a
    patient has no response j. ``calibration``: a ``dpfed.joint_noise.JointCalibration`` (from
    the signed spec: ``calibration_from_spec``). The bounds and split must be public.

    Returns ``JointStatistics`` (noisy n_x and n_j clamped at 0; ``noise =
    calibration.noise()``), and with ``return_info=True`` also a ``JointReleaseInfo``.
    Raises ValueError, releasing nothing, on invalid data or a calibration this module cannot
    draw exactly (module docstring); in that case no noise has been drawn.
    """
    cal = calibration
    d, m = int(cal.d), int(cal.m)
    x, y = _data(x, y, d, m)
    _check_calibration(cal, d, m)
    iu = np.triu_indices(d)
    sizes = {"xtx": iu[0].size, "xty": m * d, "yty": m, "n": m + 1}
    scales = {p: _drawn_scale(cal, p, sizes[p]) for p in PARTS}
    noise = cal.noise()
    # All data validated and reduced before the first noise is drawn.
    sxx, n_x, sxy, syy, n_j = joint_clipped_statistics(x, y, cal.x_bound, cal.y_bound,
                                                       cal.x_norm_bound)
    counts = np.concatenate([[n_x], n_j]).astype(np.int64)
    values = {"xtx": sxx[iu], "xty": sxy.ravel(), "yty": syy}
    noisy, certified = {}, {}
    if cal.mechanism == "laplace":
        for p in ("xtx", "xty", "yty"):
            noisy[p], certified[p] = add_laplace_noise(
                values[p], float(cal.sensitivities[p]), float(cal.losses[p]),
                chunks=2 if values[p].size >= 1024 else 1)
        l1_n = float(cal.sensitivities["n"])
        if l1_n != round(l1_n):
            raise ValueError("the counts' L1 sensitivity must be an integer")  # pragma: no cover
        drawn, per_unit = add_count_noise(counts.tolist(), float(cal.losses["n"]) / l1_n)
        noisy["n"], certified["n"] = np.asarray(drawn, dtype=np.int64), l1_n * per_unit
        total, cap, unit = math.fsum(certified.values()), float(cal.epsilon), "epsilon"
    else:
        for p in ("xtx", "xty", "yty"):
            noisy[p], certified[p] = add_gaussian_noise(
                values[p], float(cal.sensitivities[p]), float(cal.losses[p]))
        drawn, certified["n"] = add_gaussian_noise(counts.astype(np.float64),
                                                   float(cal.sensitivities["n"]),
                                                   float(cal.losses["n"]))
        noisy["n"] = np.rint(drawn).astype(np.int64)   # post-processing: integer counts
        total, cap, unit = math.fsum(certified.values()), float(cal.rho), "rho"
    if total > cap * (1 + _CERT_SLACK):
        # Not reached: each part is calibrated to at most its share. Fail closed regardless:
        # the noisy values are discarded, never returned.
        raise ValueError(f"the certified {unit} {total!r} exceeds the calibration's {cap!r}")
    ns = np.maximum(noisy["n"], 0)   # clamp: post-processing
    upper = noisy["xtx"]
    xtx = np.zeros((d, d))
    xtx[iu] = upper
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    stats = JointStatistics(xtx=xtx, n_x=int(ns[0]), xty=noisy["xty"].reshape(m, d),
                            yty=np.asarray(noisy["yty"], dtype=np.float64),
                            n=ns[1:].astype(np.int64), noise=noise)
    if not return_info:
        return stats
    info = JointReleaseInfo(mechanism=cal.mechanism, dim=d, targets=m, n_x=int(ns[0]),
                            x_bound=float(cal.x_bound), y_bound=float(cal.y_bound),
                            budget_split=[float(s) for s in cal.budget_split],
                            scales={p: float(s) for p, s in scales.items()})
    for p in PARTS:
        info[f"{unit}_{p}"] = float(certified[p])
    info[f"{unit}_certified"] = total
    info[unit] = cap
    info["epsilon"] = float(cal.epsilon)
    if cal.mechanism == "gaussian":
        info["delta"] = float(cal.delta)
        info["mu"] = float(cal.mu)
    if cal.x_norm_bound is not None:
        info["x_norm_bound"] = float(cal.x_norm_bound)
    return stats, info
