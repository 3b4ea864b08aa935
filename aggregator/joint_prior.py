"""An across-target prior mean for the fit of a joint round (issue 23; docs/method.md
section 13 "Every target in one release").

The fit of one target puts a prior centred at 0 on beta (method.md section 1: beta ~
N(0, I / lambda0), lambda0 ~ Gamma(2, 2), integrated out to a Student-t). In a joint round
every target's coefficients are in the same units (each response standardised by its public
centre and scale, one y bound), and on drug panels they share a common part: a cell line that
is resistant to one drug tends to be resistant to many. So the joint fit centres each target's
prior at an across-target mean m0:

    beta_j ~ t-prior centred at m0,   i.e.  beta_j = m0 + gamma_j,  gamma_j ~ the usual prior.

This is the empirical-Bayes version of the hierarchical model beta_j ~ N(m0, I / lambda0)
(Efron & Morris, JASA 1973, "Stein's estimation rule and its competitors"; Gelman et al.,
*Bayesian Data Analysis*, 3rd ed., section 5.5), with m0 estimated from the joint release
itself (``pooled_mean``): the least-squares fit of the pooled regression of every target (the
sum over targets of what each target's fit sees, view + public) with the noise-aware
estimate of its design. It is post-processing of the released and public values: no privacy cost.

**Shifting the statistics** (``shift``). Rather than giving every fit path of the posterior a
prior mean, target j is fitted for gamma_j = beta_j - m0 on the statistics of the response
y - x^T m0, which are linear in the released ones:

    Sxy' = Sxy - Sxx m0,   Syy' = Syy - 2 m0^T Sxy + m0^T Sxx m0,   (Sxx, n unchanged),

and beta_j = m0 + gamma_j (draws shifted back). The exact public statistics shift exactly.
In a release R = S + E, the shifted values carry new noise: R_xy' - S_xy' = e_xy - E_xx m0
and R_yy' - S_yy' = e_yy - 2 m0^T e_xy + m0^T E_xx m0. With the upper entries of E_xx
independent with variance v_xx, each entry of E_xx m0 has variance exactly v_xx |m0|^2 and
m0^T E_xx m0 has variance v_xx (2 |m0|^4 - sum_a m0_a^4); these enter the description as
gaussian terms (xty: v_xx |m0|^2; yty: 4 v_xy |m0|^2 + v_xx (2 |m0|^4 - sum m0^4)).
**Approximations** (stated; small on GDSC, where v_xx |m0|^2 is ~1 % of v_xy): (i) the
covariances the shift creates are dropped (between entries of E_xx m0, rank one in m0; between
the new xty and yty terms; and between E_xx m0 and the model's own errors-in-variables term
E_xx gamma, whose cross-term 2 v_xx gamma^T m0 has no sign); (ii) m0 is treated as fixed
although it is estimated from the same release, target j weighing 1/m in it (the
empirical-Bayes caveat: the intervals do not include m0's uncertainty, which is ~1/m of a
target's; with few targets m0 is poorly estimated, hence ``MIN_TARGETS``); (iii) m0 is taken
from the joint values with noise: it is an estimate, not a parameter of the model.
Coverage of the 90 % intervals is measured on GDSC (docs/evaluation.md) and in
tests/test_joint_prior.py.

Single-target rounds never use this (one target has no across-target mean).
"""

from __future__ import annotations

import math

import numpy as np

from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.statistics import Statistics

__all__ = ["MIN_TARGETS", "POOLED_RIDGE", "pooled_statistics", "pooled_mean", "shift"]

#: The across-target prior mean is used from this many targets on (below, m0 is an average
#: of too few targets to be a prior for each of them; a round of fewer keeps the 0 mean).
MIN_TARGETS = 10
#: Ridge of the pooled fit (in the statistics' units: the pooled design of m targets is ~m
#: times a target's, so this only guards a rank-deficient design).
POOLED_RIDGE = 1.0
#: Plus this many sds of the pooled design's release noise (the noise-matched ridge of
#: dpfed.bounds; c = 2 scored best of 2 / 8 / 32 as a target's closed-form fit on GDSC,
#: docs/evaluation.md): shrinks m0 where the noisy design cannot tell its direction.
POOLED_RIDGE_C = 2.0


def pooled_statistics(joint, inputs: list[tuple]) -> tuple[Statistics, Statistics | None]:
    """(pooled total, pooled public): the sums over targets of what each target's fit sees
    (``inputs``: (view_j + public_j, public_j) as ``aggregator.joint_fit.target_inputs``), with
    the noise description of the sum. Every view's design is r_j times the ONE released Sxx,
    so its release noise is shared, not independent: the pooled Sxx carries that noise scaled
    by sum_j r_j, plus the views' own missing-response terms (dpfed.joint_targets; summed as
    if independent); Sxy, Syy and the counts carry m independent draws of their part's noise
    (each target has its own). ``joint``: the summed JointStatistics with its noise."""
    if not inputs:
        raise ValueError("the pooled fit needs at least one target")
    if joint.noise is None:
        raise ValueError("the noise of these joint statistics is unknown")
    base = joint.noise
    n_x = int(joint.n_x)
    ratios = [min(1.0, int(n_j) / n_x) if n_x > 0 else 0.0 for n_j in joint.n]
    v_base = base.variance("xtx")
    extra = sum(max(0.0, total.noise.variance("xtx") - r * r * v_base)
                for (total, _), r in zip(inputs, ratios))
    xtx_terms = base.scaled(xtx=max(sum(ratios), 1e-12)).xtx if v_base > 0 else ()
    if extra > 0:
        xtx_terms = xtx_terms + (NoiseTerm("gaussian", math.sqrt(extra)),)
    rep = base.repeated(len(inputs))
    noise = NoiseDescription(xtx_terms, rep.xty, rep.yty, rep.n)
    xtx = np.sum([np.asarray(t.xtx) for t, _ in inputs], axis=0)
    total = Statistics(0.5 * (xtx + xtx.T), np.sum([np.asarray(t.xty) for t, _ in inputs],
                                                    axis=0),
                       float(sum(float(t.yty) for t, _ in inputs)),
                       int(sum(int(t.n) for t, _ in inputs)), noise)
    publics = [p for _, p in inputs if p is not None]
    public = None
    if publics:
        public = publics[0]
        for p in publics[1:]:
            public = public + p
    return total, public


def pooled_mean(joint, inputs: list[tuple], *, x_bound: float,
                ridge: float = POOLED_RIDGE) -> np.ndarray:
    """m0: the least-squares fit of the pooled regression of every target
    (``pooled_statistics``) with the noise-aware estimate of its design: A_post, the pooled
    release's Sxx combined with the design prior (posterior.noise_aware.noise_aware_inputs,
    method.md section 8, step 1), plus the pooled public Sxx:

        m0 = (PSD(A_post + P_xx) + (ridge + c sd_xx) I)^-1 (R_xy + P_xy),

with sd_xx the pooled design's release noise sd per entry (``POOLED_RIDGE_C``).

    The design's release noise is shared by every target and does not average out over them,
    so the raw pooled Sxx is not enough where it is noisy (a synthetic panel at eps 1, Sxx
    noise 37 % of its diagonal: m0 came out at 4x the truth); at GDSC's n = 700, eps 10 the
    two agree. (The full noise-aware posterior of the pooled regression was tried: with one
    residual precision for 262 heterogeneous, correlated targets it converged to a mode far
    from the pooled least squares on GDSC; not used.) Raises ValueError when not finite."""
    from dpfed.bounds import psd_ridge_solve
    from posterior.noise_aware import noise_aware_inputs

    total, public = pooled_statistics(joint, inputs)
    inp = noise_aware_inputs(total, public, x_bound)
    pxx, pxy, _, _ = inp.public_parts()
    sxx = inp.rxx + pxx
    r = float(ridge) + POOLED_RIDGE_C * math.sqrt(total.noise.variance("xtx"))
    m0 = psd_ridge_solve(0.5 * (sxx + sxx.T), (inp.rxy + pxy)[None, :], [r])[0][0]
    if not np.all(np.isfinite(m0)):
        raise ValueError("the pooled fit of the targets is not finite")
    return m0


def _shifted_noise(noise: NoiseDescription, m0: np.ndarray) -> NoiseDescription:
    """The noise description of the shifted statistics (module docstring)."""
    if noise.is_exact:
        return noise
    v_xx, v_xy = noise.variance("xtx"), noise.variance("xty")
    s2 = float(m0 @ m0)
    add_xy = v_xx * s2
    add_yy = 4.0 * v_xy * s2 + v_xx * (2.0 * s2 * s2 - float(np.sum(m0 ** 4)))
    xty = noise.xty + ((NoiseTerm("gaussian", math.sqrt(add_xy)),) if add_xy > 0 else ())
    yty = noise.yty + ((NoiseTerm("gaussian", math.sqrt(add_yy)),) if add_yy > 0 else ())
    return NoiseDescription(noise.xtx, xty, yty, noise.n)


def shift(stats: Statistics, m0: np.ndarray) -> Statistics:
    """The statistics of the response y - x^T m0 (module docstring); the noise description
    gains what the shift adds (None stays None: unknown noise stays unknown)."""
    m0 = np.asarray(m0, dtype=np.float64)
    if m0.shape != (stats.dim,) or not np.all(np.isfinite(m0)):
        raise ValueError(f"the prior mean must be a finite vector of length {stats.dim}")
    sxx = np.asarray(stats.xtx)
    sxy = np.asarray(stats.xty)
    xty = sxy - sxx @ m0
    yty = float(stats.yty) - 2.0 * float(m0 @ sxy) + float(m0 @ sxx @ m0)
    noise = None if stats.noise is None else _shifted_noise(stats.noise, m0)
    return Statistics(sxx, xty, yty, stats.n, noise)
