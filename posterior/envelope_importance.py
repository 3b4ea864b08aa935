"""Importance sampling of the noise-aware posterior through its envelope: a nested Laplace
proposal (issue 21 item 4: a fit that scales with d).

Why the Laplace approximation fails at large d. The posterior of u = (beta, log lambda) is
far from normal in one way that grows with d: the conditional precision of beta given
a = log lambda changes with a (the release's and the public rows' information about beta
scale with lambda), and over d coefficients the log determinant of that precision changes by
~8 per posterior sd of a at d = 64. So the marginal of a, the joint density integrated over
beta, lies ~2-3 sd from where the joint mode puts it, and a normal proposal centred at the
joint mode (the old first attempt: Pareto k-hat 1.1-1.4 at d = 64) or moved to weighted
moments (population Monte Carlo: ESS 2-9 of 800) misses the mass.

What this module does instead is the nested Laplace approximation of Rue, Martino & Chopin
(JRSS B 2009, "INLA", sections 3.1-3.2) used as an importance proposal, not as the answer:

1. the joint mode and Laplace covariance (damped Newton);
2. a grid a_1 < ... < a_G of log lambda around it; at each, the conditional mode
   beta*(a_g) and the conditional precision H_g (two Newton steps from the joint
   approximation's conditional mean; Hessians by finite differences of the gradient, all
   grid points in one batched call);
3. the Laplace marginal  log p~(a_g) = log p(beta*(a_g), a_g) - 1/2 log det H_g  (INLA's
   eq. 3), interpolated linearly in a between grid points (a piecewise-exponential density,
   drawn by inverting its distribution function);
4. beta | a ~ N(m(a), H_s^-1): m interpolated linearly between the grid's conditional
   modes, H_s the mean of the two grid precisions around a (one Cholesky factor per grid
   interval);
5. ``proposals`` draws of (beta, a), weighted by the **exact** noise-aware density over the
   proposal's, truncated and resampled (``posterior.laplace``), judged by Pareto k-hat and
   effective sample size.

Steps 1-4 run on the envelope (``posterior.envelope``: O(d) per point, within ~0.02 in log
density of the exact model at d = 64); only step 5 evaluates the exact density, so the
sample is of the exact noise-aware posterior and its intervals are that model's. ``None`` when
a step fails (no mode, envelope not applicable, a precision not positive definite): the caller
goes on with its other samplers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.linalg import solve_triangular

from posterior import noise_aware as na
from posterior.envelope import Envelope, envelope, envelope_logp, envelope_logp_grad
from posterior.laplace import (ImportanceResult, LaplaceResult, _covariance, _weights,
                               newton_batched)
from posterior.psis import pareto_khat

__all__ = ["prepare_envelope", "EnvelopeFit", "EnvelopeImportance", "envelope_importance", "WIDER",
           "EXACT_PROPOSALS",
           "TOP_UP_ESS", "MAX_PROPOSALS", "SCREEN_MIN_DIM", "SCREEN_KHAT",
           "nested_laplace_proposal", "NestedProposal"]

#: Exact-density evaluations of step 5 (the only O(d^3) ones), and the top-up: fewer
#: effective draws than TOP_UP_ESS from the first EXACT_PROPOSALS draws up to MAX_PROPOSALS.
#: The nested proposal keeps 10-30 % of its draws effective at d = 64 (bench_fit releases).
EXACT_PROPOSALS = 800
TOP_UP_ESS = 200.0
MAX_PROPOSALS = 2400
#: A top-up draws what the ESS so far says is needed for TOP_UP_ESS, times this margin (at
#: least a quarter of EXACT_PROPOSALS), not straight up to MAX_PROPOSALS: at d = 64 a third
#: of the fits keep 120-199 effective draws of 800, and needed ~1 000-1 300, not 2 400.
_TOP_UP_MARGIN = 1.25
#: From this dimension on, the first proposals are weighted by the envelope before the exact
#: density (O(d) against O(d^3) per point: ~5 ms against ~90 ms for 800 at d = 128): if those
#: weights' Pareto k-hat is above SCREEN_KHAT, the exact ones would be too (their log ratio to
#: the envelope's varies by sd 0.00-0.01 over the proposal's draws at d = 128), and the exact
#: evaluations are skipped (the fit goes to attempt 0b). bench_fit releases: at d = 128 8 of 10
#: first tries had an envelope k-hat above 1 (1.06-2.10), at d = 64 none of 80 (max 1.00):
#: not worth its ~3 ms there. The threshold is the fit's own (0.7) plus a margin: over 60
#: proposals of 800 each (10 releases x 3 seeds, first and wider mixture) the envelope's and
#: the exact weights' k-hat differed by at most 0.029 at d = 128 and 0.034 at d = 96, and
#: never fell on opposite sides of 0.7; at 1.0, the tries with a k-hat in (0.7, 1] paid 800
#: exact densities (~150 ms at d = 128) to fail the fit's check.
SCREEN_MIN_DIM = 96
SCREEN_KHAT = 0.8
# Grid of log lambda (step 2): points, and its span in joint-Laplace sds below/above the mode.
_GRID = 11
_SPAN = (-7.0, 3.0)
_FD_STEP = 1e-5
# The defensive mixture of NestedProposal.draw: share and sd factor of its wider component.
_SCALE = 1.05
_WIDE = 0.3
_WIDE_SCALE = 1.2
#: The second try's (sd factor, wide share, wide sd factor) when the first's k-hat is high.
WIDER = (1.1, 0.5, 1.3)


class NestedProposal:
    """The proposal of steps 2-4: ``draw(count, rng, widen)`` -> (u, log q(u)); ``widen``:
    the defensive mixture's (sd factor, share of the wide component, its extra sd factor),
    default (_SCALE, _WIDE, _WIDE_SCALE)."""

    def __init__(self, grid, log_marginal, modes, chols):
        self.grid = grid                    # (G,) log lambda
        self.log_marginal = log_marginal    # (G,) log p~(a_g), up to a constant
        self.modes = modes                  # (G, d) conditional modes of beta
        self.chols = chols                  # (G-1, d, d): Cholesky factors of H_s (lower)
        self.logdet_half = np.sum(np.log(np.diagonal(chols, axis1=1, axis2=2)), axis=1)
        lo, hi = log_marginal[:-1], log_marginal[1:]
        width = np.diff(grid)
        top = float(np.max(log_marginal))
        slope = (hi - lo) / width
        t = slope * width
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # Mass of each interval under the piecewise-linear log density.
            mass = np.where(np.abs(t) > 1e-10,
                            (np.exp(hi - top) - np.exp(lo - top)) / np.where(t == 0, 1.0, slope),
                            np.exp(lo - top) * width)
        self._slope = slope
        self._log_norm = top + np.log(np.sum(mass))
        self._p = mass / np.sum(mass)

    def draw(self, count, rng, widen=None):
        d = self.modes.shape[1]
        seg = rng.choice(self._p.size, size=count, p=self._p)
        width = self.grid[seg + 1] - self.grid[seg]
        t = self._slope[seg] * width
        v = rng.random(count)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # Inverse distribution function of the density proportional to exp(t x) on [0, 1].
            x = np.where(np.abs(t) > 1e-10, np.log1p(v * np.expm1(t)) / np.where(t == 0, 1.0, t),
                         v)
        x = np.clip(x, 0.0, 1.0)
        a = self.grid[seg] + x * width
        log_pa = self.log_marginal[seg] + self._slope[seg] * (a - self.grid[seg]) - self._log_norm
        m = self.modes[seg] * (1.0 - x)[:, None] + self.modes[seg + 1] * x[:, None]
        eps = rng.standard_normal((count, d))
        # Defensive mixture (Hesterberg 1995): a share _WIDE of the draws from the same
        # conditional normal with its sd times _WIDE_SCALE, so that the weights of draws in
        # the tails the normal conditional underrates stay bounded. Both components share z
        # = L^T (beta - m): the mixture density needs only |z|^2.
        sc, share, ws = widen or (_SCALE, _WIDE, _WIDE_SCALE)
        wide = rng.random(count) < share
        eps *= sc
        eps[wide] *= ws
        q = np.einsum("ij,ij->i", eps, eps) / sc ** 2
        log_cond = -0.5 * d * np.log(2 * np.pi) - d * np.log(sc) + np.logaddexp(
            np.log1p(-share) - 0.5 * q, np.log(share) - d * np.log(ws) - 0.5 * q / ws ** 2)
        beta = np.empty((count, d))
        for s in np.unique(seg):
            rows = seg == s
            # beta = m + L^-T eps has precision L L^T = H_s.
            beta[rows] = m[rows] + solve_triangular(self.chols[s], eps[rows].T, lower=True,
                                                    trans="T").T
        return np.column_stack([beta, a]), log_pa + self.logdet_half[seg] + log_cond


def _conditional_newton(fgb, grid, beta0, steps=2):
    """Conditional modes of beta at each a in ``grid`` (Newton from ``beta0``, rows) and the
    conditional precisions there (minus the Hessian in beta, finite differences of the
    gradient; all grid points in one call per step). The precision returned is the one of
    the last Newton step, taken one step before the mode (from the joint approximation's
    conditional mean, the steps move little: a Hessian at the mode itself cost another
    G (d + 1) gradients, a third of this function, for a proposal no better: bench_fit's
    d = 64 releases, ESS and k-hat per fit within their Monte Carlo noise); the value at the
    mode is evaluated there. Returns (modes, values, precisions)."""
    g_count, d = beta0.shape
    beta = beta0.copy()
    for _ in range(steps):
        h = _FD_STEP * np.maximum(1.0, np.abs(beta))                  # (G, d)
        pts = np.repeat(beta[:, None, :], d + 1, axis=1)               # (G, d+1, d)
        pts[:, 1:, :] += h[:, :, None] * np.eye(d)[None]
        us = np.concatenate([pts, np.repeat(grid[:, None, None], d + 1, axis=1)], axis=2)
        grad = fgb(us.reshape(-1, d + 1))[1]
        grad = grad.reshape(g_count, d + 1, d + 1)[:, :, :d]
        g0 = grad[:, 0, :]
        hess = (grad[:, 1:, :] - g0[:, None, :]) / h[:, :, None]
        prec = -0.5 * (hess + hess.transpose(0, 2, 1))
        try:
            step = np.linalg.solve(prec, g0[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            return None
        beta = beta + step
    val = fgb(np.column_stack([beta, grid]))[0]
    return beta, val, prec


def _is_pd(m: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(m)
        return True
    except np.linalg.LinAlgError:
        return False


def nested_laplace_proposal(fgb, lap: LaplaceResult) -> NestedProposal | None:
    """Steps 2-4 of the module docstring around the joint approximation ``lap``."""
    k = lap.mode.size
    d = k - 1
    sd_a = float(np.sqrt(lap.cov[d, d]))
    grid = lap.mode[d] + sd_a * np.linspace(_SPAN[0], _SPAN[1], _GRID)
    # Conditional mean of beta given a under the joint normal approximation: the start.
    slope = lap.cov[:d, d] / lap.cov[d, d]
    beta0 = lap.mode[:d] + (grid - lap.mode[d])[:, None] * slope[None, :]
    out = _conditional_newton(fgb, grid, beta0)
    if out is None:
        return None
    modes, vals, precs = out
    # Grid points far out in the tails where the conditional fit failed (not finite, or a
    # precision that is not positive definite) are cut off: the grid kept is the run of good
    # points around the joint mode's a.
    good = np.array([np.all(np.isfinite(m)) and np.isfinite(v) and np.all(np.isfinite(p))
                     and _is_pd(p) for m, v, p in zip(modes, vals, precs)])
    centre = int(np.argmin(np.abs(grid - lap.mode[d])))
    if not good[centre]:
        return None
    lo, hi = centre, centre
    while lo > 0 and good[lo - 1]:
        lo -= 1
    while hi < good.size - 1 and good[hi + 1]:
        hi += 1
    if hi - lo < 2:
        return None
    grid, modes, vals, precs = grid[lo:hi + 1], modes[lo:hi + 1], vals[lo:hi + 1], \
        precs[lo:hi + 1]
    try:
        chols_g = np.linalg.cholesky(precs)
        chols = np.linalg.cholesky(0.5 * (precs[:-1] + precs[1:]))
    except np.linalg.LinAlgError:
        return None
    log_marginal = vals - np.sum(np.log(np.diagonal(chols_g, axis1=1, axis2=2)), axis=1)
    return NestedProposal(grid, log_marginal, modes, chols)


@dataclass(frozen=True)
class EnvelopeImportance(ImportanceResult):
    """``envelope_importance``'s result: an ImportanceResult plus ``starts``, proposals
    resampled by their weights (exact, or the envelope's when screened), ``chains`` of them
    (``envelope_importance``): where attempt 0b's chains start when this sample fails the fit's checks. From
    Gaussian draws of the proposal's moments instead, 1 of 10 d = 128 releases had chains
    that never agreed (r-hat 64 after both extensions) and 5 of 10 needed an extension;
    from these starts none and 2 (0b's CPU median 1.93 -> 0.93 s, load 6.4)."""

    starts: np.ndarray | None = None


@dataclass(frozen=True)
class EnvelopeFit:
    """Steps 1-4, computed once per fit: the envelope's density and gradient (``fgb``), its
    joint Laplace approximation and the nested proposal built on it."""

    fgb: Callable
    laplace: LaplaceResult
    nested: NestedProposal
    env: Envelope


def prepare_envelope(inp: na.NoiseAwareInputs, u0: np.ndarray) -> EnvelopeFit | None:
    """Steps 1-4 of the module docstring from the start ``u0``; None when the envelope does
    not apply or gives no mode or no proposal."""
    try:
        env = envelope(inp)
    except (ValueError, np.linalg.LinAlgError):
        return None

    def fgb(us):
        return envelope_logp_grad(us, env)

    def f(u):
        v, g = fgb(np.asarray(u)[None])
        return float(v[0]), g[0]

    g0 = float(np.linalg.norm(f(u0)[1]))
    scale = max(1.0, g0)
    status, mode, val, grad, prec, it = newton_batched(f, fgb, u0, tol=1e-6 * scale)
    cov, pd = _covariance(prec)
    gnorm = float(np.linalg.norm(grad))
    if not (np.isfinite(val) and pd and gnorm <= 1e-3 * scale):
        return None
    lap = LaplaceResult(mode, cov, float(val), True, it, gnorm,
                        f"envelope Newton (status {status})", "newton", it)
    nested = nested_laplace_proposal(fgb, lap)
    return None if nested is None else EnvelopeFit(fgb, lap, nested, env)


def envelope_importance(prepared: EnvelopeFit, exact_batch, *, draws: int,
                        rng: np.random.Generator, proposals: int = EXACT_PROPOSALS,
                        top_up_ess: float = TOP_UP_ESS, max_proposals: int = MAX_PROPOSALS,
                        widen=None, chains: int = 8) -> EnvelopeImportance | None:
    """Step 5: draws from the exact noise-aware posterior (module docstring) by importance
    sampling from ``prepared``'s nested proposal; ``exact_batch(us)``: its log density at
    the rows of ``us``. ``proposals`` exact evaluations first; while their effective sample
    size is below ``top_up_ess`` (and their Pareto k-hat at most 0.7: more draws cannot mend a
    heavy tail), more, as many as that ESS says are needed (``_TOP_UP_MARGIN``), up to
    ``max_proposals`` in all, all weighted together. ``widen``: the proposal's (sd factor,
    wide share, wide sd factor), default (_SCALE, _WIDE, _WIDE_SCALE); ``WIDER`` for a retry.
    ``chains``: how many ``starts`` the result carries for attempt 0b's HMC.

    From ``SCREEN_MIN_DIM`` coefficients on, a first batch whose envelope weights have a
    Pareto k-hat above ``SCREEN_KHAT`` is not weighted by the exact density: the result then
    has no draws (shape (0, d + 1)), ``proposals`` 0 and the envelope weights' ESS and k-hat,
    which fail the fit's checks (attempt 0b runs, from ``starts``)."""
    nested, lap = prepared.nested, prepared.laplace
    k = lap.mode.size

    def batch(count):
        u, log_q = nested.draw(int(count), rng, widen)
        lw = exact_batch(u) - log_q
        lw[~np.isfinite(lw)] = -np.inf
        return u, lw

    if k - 1 >= SCREEN_MIN_DIM:
        u, log_q = nested.draw(int(proposals), rng, widen)
        lw_env = envelope_logp(u, prepared.env) - log_q
        lw_env[~np.isfinite(lw_env)] = -np.inf
        khat_env = pareto_khat(lw_env) if np.any(np.isfinite(lw_env)) else float("inf")
        if khat_env > SCREEN_KHAT:
            if not np.any(np.isfinite(lw_env)):
                return None
            w_env, ess_env = _weights(lw_env)
            return EnvelopeImportance(np.empty((0, k)), ess_env, 0, lap, True, khat=khat_env,
                                      proposal=_proposal_moments(u),
                                      starts=u[rng.choice(u.shape[0], chains, p=w_env)])
        lw = exact_batch(u) - log_q
        lw[~np.isfinite(lw)] = -np.inf
    else:
        u, lw = batch(proposals)
    if not np.any(np.isfinite(lw)):
        return None
    ess = _weights(lw)[1]
    while ess < top_up_ess and u.shape[0] < max_proposals and pareto_khat(lw) <= 0.7:
        need = min(float(max_proposals),
                   np.ceil(u.shape[0] * _TOP_UP_MARGIN * top_up_ess / max(ess, 1.0)))
        more = min(max(int(need) - u.shape[0], proposals // 4, 1), max_proposals - u.shape[0])
        u2, lw2 = batch(more)
        u, lw = np.concatenate([u, u2]), np.concatenate([lw, lw2])
        ess = _weights(lw)[1]
    w, ess = _weights(lw)
    positions = (rng.random() + np.arange(draws)) / draws
    idx = np.minimum(np.searchsorted(np.cumsum(w), positions), u.shape[0] - 1)
    return EnvelopeImportance(u[rng.permutation(idx)], ess, u.shape[0], lap, True,
                              khat=pareto_khat(lw), proposal=_proposal_moments(u),
                              starts=u[rng.choice(u.shape[0], chains, p=w)])


def _proposal_moments(u):
    """The proposal's own mean and covariance's Cholesky factor (unweighted draws of q):
    where the marginal of log lambda really is, for HMC's preconditioning when the weights
    fail (attempt 0b); None when the covariance is not positive definite."""
    try:
        return u.mean(axis=0), np.linalg.cholesky(np.cov(u, rowvar=False))
    except np.linalg.LinAlgError:
        return None
