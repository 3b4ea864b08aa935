"""Compiled (Numba) twins of the densities of ``posterior.noise_aware`` and a damped Newton
optimiser for their mode, for ``posterior.laplace`` (the fast path of ``fit_posterior``).

The pure numpy functions of ``posterior.noise_aware`` stay the reference: they are the ones
tested against the PyMC model (tests/test_noise_aware.py). The functions here compute the same
quantities with the same formulas, written as loops over the (d + 1) x (d + 1) matrices with a
hand-written Cholesky factorisation (numpy's per-call overhead dominated at these sizes:
30-70 us per density + gradient at d = 10, against ~2 us here); tests/test_noise_aware_jit.py
checks that they agree with the numpy ones to ~1e-10 relative. Differences from the numpy
code are floating-point only:

- the gradient's C^-1 comes from the Cholesky factor (L^-T L^-1) instead of ``np.linalg.inv``;
- the batch density solves with the factor row by row instead of ``np.linalg.solve``.

The machine code is cached on disk (``cache=True``; Numba's cache next to this file, or in
``NUMBA_CACHE_DIR``), so a new process loads it instead of compiling it again.

``kind`` selects the model in the shared entry points: ``EXACT`` (method.md section 1, the
arguments are Sxx, Sxy, Syy, n and the variances are ignored) or ``NOISE_AWARE`` (module
docstring of ``posterior.noise_aware``: R_xx = A_post, R_xy, R_yy, n, Abar and the four
variances). The noise-aware functions also take the Wishart-shaped design
(``NoiseAwareInputs.wishart``: per-entry design variances ``vmat`` in the basis U, points
rotated in and gradients out inside the compiled code, so that Newton, the Hessian and the
mode are in the original basis; tests/test_design_wishart_jit.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numba
import numpy as np

from posterior import noise_aware as na
from dpfed.statistics import Statistics

__all__ = ["EXACT", "NOISE_AWARE", "Target", "target_for", "warm_up"]

EXACT = 0
NOISE_AWARE = 1

_LOG_2PI = math.log(2.0 * math.pi)

# Strict IEEE arithmetic (no fastmath): a fit must be a function of its inputs and seed, bit
# for bit, in every process. With reassociation ("reassoc") LLVM vectorised sums differently
# when a function was compiled in the process than when its machine code came from the cache,
# so a refit disagreed with the aggregator's fit in the 12th digit (tests/test_e2e.py, cold
# cache). At d + 1 = 11 the vectorisation saved nothing measurable (2.4 ms per fit either way).
_jit = numba.njit(cache=True, nogil=True)


@_jit
def _cholesky(a, low):
    """Lower Cholesky factor of the symmetric ``a`` (lower triangle read) into ``low``;
    False when ``a`` is not positive definite (a pivot <= 0 or NaN), as LAPACK's potrf."""
    k = a.shape[0]
    for j in range(k):
        lj = low[j]
        s = a[j, j]
        for p in range(j):
            s -= lj[p] * lj[p]
        if not s > 0.0:
            return False
        ljj = math.sqrt(s)
        lj[j] = ljj
        for p in range(j + 1, k):
            lj[p] = 0.0
        rj = 1.0 / ljj
        for i in range(j + 1, k):
            li = low[i]
            s = a[i, j]
            for p in range(j):
                s -= li[p] * lj[p]
            li[j] = s * rj
    return True


@_jit
def _lam0_rate(a, const):
    """c(lambda) and d log c / d log lambda at a = log lambda (``noise_aware._rate_and_slope``)."""
    rt0, code, total, width = const[4], const[5], const[6], const[7]
    if code == 0.0:
        return rt0, 0.0
    if code == 1.0:
        return rt0 * math.exp(-a), -1.0
    tau = width * total
    x = (total - math.exp(-a)) / tau
    if x > 0.0:
        sp = tau * (x + math.log1p(math.exp(-x)))
        sig = 1.0 / (1.0 + math.exp(-x))
    else:
        ex = math.exp(x)
        sp = tau * math.log1p(ex)
        sig = ex / (1.0 + ex)
    return rt0 * sp, sig * math.exp(-a) / sp


@_jit
def _prior(u, d, const, g):
    """The prior of beta (lambda0 integrated out) and of lambda on log lambda, with the
    Jacobian (``noise_aware._log_prior``, ``noise_aware.Prior``); writes its gradient into
    ``g``, returns its value. ``const`` = ``noise_aware.prior_params(d)``."""
    s = 0.0
    for i in range(d):
        s += u[i] * u[i]
    sh, rt, sh0 = const[1], const[2], const[3]
    kk = sh0 + 0.5 * d
    c, dlc = _lam0_rate(u[d], const)
    den = c + 0.5 * s
    lam = math.exp(u[d])
    for i in range(d):
        g[i] = -kk * u[i] / den
    g[d] = dlc * (sh0 - kk * c / den) + sh - rt * lam
    return const[0] + sh0 * math.log(c) - kk * math.log(den) + sh * u[d] - rt * lam


@_jit
def _prior_value(u, d, const):
    s = 0.0
    for i in range(d):
        s += u[i] * u[i]
    sh, rt, sh0 = const[1], const[2], const[3]
    c, _ = _lam0_rate(u[d], const)
    return (const[0] + sh0 * math.log(c) - (sh0 + 0.5 * d) * math.log(c + 0.5 * s)
            + sh * u[d] - rt * math.exp(u[d]))


@_jit
def _exact_logp_grad(u, xtx, xty, yty, n, const, g):
    """``noise_aware.log_posterior_exact``: value, gradient into ``g``."""
    d = xty.shape[0]
    val = _prior(u, d, const, g)
    lam = math.exp(u[d])
    quad = yty
    for i in range(d):
        sb = 0.0
        for j in range(d):
            sb += xtx[i, j] * u[j]
        quad += u[i] * sb - 2.0 * u[i] * xty[i]
        g[i] += -lam * (sb - xty[i])
    val += 0.5 * n * (u[d] - _LOG_2PI) - 0.5 * lam * quad
    g[d] += 0.5 * n - 0.5 * lam * quad
    return val


@_jit
def _na_scratch(d):
    """The work arrays ``_na_parts`` fills and ``_cholesky`` factors into, for d features:
    (r, c, low, ab, rb, cu), allocated once per call of the value functions (once per batch
    in ``_na_logp_batch_basis``, reused row after row)."""
    k = d + 1
    return (np.empty(k), np.empty((k, k)), np.empty((k, k)), np.empty(d), np.empty(d),
            np.empty(k))


@_jit
def _na_parts(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc, r, c, ab, rb, cu):
    """Residual ``r`` and the lower triangle of the covariance ``c`` of the noise-aware
    likelihood at u (``noise_aware._likelihood_parts``); also fills Abar beta, Rxx beta and
    the count's vector u (``cu``, d + 1). ``vmat``: the design's per-entry variances, a
    (d, d) matrix (then ``vxx`` is not read), or None for the one variance ``vxx``.
    Returns |beta|^2."""
    d = rxy.shape[0]
    rho = math.exp(-u[d])
    s = 0.0
    s4 = 0.0
    for i in range(d):
        b2 = u[i] * u[i]
        s += b2
        s4 += b2 * b2
    bab = 0.0
    brb = 0.0
    for i in range(d):
        ai = abar[i]
        xi = rxx[i]
        sa = 0.0
        sr = 0.0
        for j in range(d):
            sa += ai[j] * u[j]
            sr += xi[j] * u[j]
        ab[i] = sa
        rb[i] = sr
        bab += u[i] * sa
        brb += u[i] * sr
    # The lower triangle only: _cholesky reads no more (C is symmetric).
    if vmat is None:
        for i in range(d):
            bi = u[i]
            ci = c[i]
            ai = abar[i]
            for j in range(i):
                ci[j] = rho * ai[j] + vxx * (bi * u[j])
            ci[i] = rho * ai[i] + vxy + vxx * s
            c[d, i] = 2.0 * rho * ab[i] + vxx * bi * (2.0 * s - bi * bi)
            r[i] = rxy[i] - rb[i]
        c[d, d] = 4.0 * rho * bab + 2.0 * n * rho * rho + vyy + vxx * (2.0 * s * s - s4)
    else:
        # Per-entry variances p = vmat (``noise_aware.design_error_terms``): C11 = rho Abar +
        # p o beta beta^T with diagonal rho Abar_ii + v_xy + (p beta^2)_i, C12_i = 2 rho
        # (Abar beta)_i + beta_i (2 (p beta^2)_i - p_ii beta_i^2), C22's design part the sum
        # of beta_i^2 (2 (p beta^2)_i - p_ii beta_i^2).
        c22 = 0.0
        for i in range(d):
            bi = u[i]
            ci = c[i]
            ai = abar[i]
            pi = vmat[i]
            pb2 = 0.0
            for j in range(d):
                pb2 += pi[j] * (u[j] * u[j])
            for j in range(i):
                ci[j] = rho * ai[j] + pi[j] * (bi * u[j])
            ci[i] = rho * ai[i] + vxy + pb2
            t = bi * (2.0 * pb2 - pi[i] * (bi * bi))
            c[d, i] = 2.0 * rho * ab[i] + t
            c22 += bi * t
            r[i] = rxy[i] - rb[i]
        c[d, d] = 4.0 * rho * bab + 2.0 * n * rho * rho + vyy + c22
    r[d] = ryy - brb - n * rho
    # The count's noise: v_n u u^T, u = (Mc beta, beta^T Mc beta + rho)
    # (``NoiseAwareInputs.count_vector``; Mc = 0 leaves v_n rho^2 in C22). u1 into ``cu``.
    u2 = rho
    for i in range(d):
        mi = mc[i]
        t = 0.0
        for j in range(d):
            t += mi[j] * u[j]
        cu[i] = t
        u2 += u[i] * t
    cu[d] = u2
    if vn != 0.0:
        for i in range(d):
            ci = c[i]
            vui = vn * cu[i]
            for j in range(i + 1):
                ci[j] += vui * cu[j]
            c[d, i] += vui * u2
        c[d, d] += vn * u2 * u2
    return s


@_jit
def _rotate_in(u, rot, out):
    """(beta, log lambda) -> (U^T beta, log lambda) into ``out`` (``noise_aware.rotate_in``)."""
    d = rot.shape[0]
    for j in range(d):
        t = 0.0
        for i in range(d):
            t += rot[i, j] * u[i]
        out[j] = t
    out[d] = u[d]


@_jit
def _na_logp_grad(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                  pxx, pxy, pyy, pn, rot, const, g):
    """``noise_aware.log_posterior_noise_aware``: value, gradient into ``g``; -inf and a zero
    gradient where the covariance is not positive definite. ``rot``: U of
    ``NoiseAwareInputs.wishart`` (the other arguments are its inputs in U's basis; the density
    is evaluated at U^T beta and its gradient turned back, d/dbeta = U d/dbeta'), or None for
    inputs in the original basis."""
    if rot is None:
        return _na_logp_grad_basis(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                                   pxx, pxy, pyy, pn, const, g)
    d = rxy.shape[0]
    ur = np.empty(d + 1)
    gr = np.empty(d + 1)
    _rotate_in(u, rot, ur)
    val = _na_logp_grad_basis(ur, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                              pxx, pxy, pyy, pn, const, gr)
    for i in range(d):
        ri = rot[i]
        t = 0.0
        for j in range(d):
            t += ri[j] * gr[j]
        g[i] = t
    g[d] = gr[d]
    return val


@_jit
def _na_logp_grad_basis(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                        pxx, pxy, pyy, pn, const, g):
    """``_na_logp_grad`` in the inputs' own basis."""
    d = rxy.shape[0]
    k = d + 1
    r, c, low, ab, rb, cu = _na_scratch(d)
    s = _na_parts(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc, r, c, ab, rb, cu)
    if not _cholesky(c, low):
        for i in range(k):
            g[i] = 0.0
        return -np.inf
    val = _prior(u, d, const, g)
    rho = math.exp(-u[d])
    # inv = L^-1 (lower), then W = C^-1 = inv^T inv (stored in c), alpha = W r.
    # Row by row, so that the inner loops run along contiguous rows.
    inv = np.zeros((k, k))
    logdet = 0.0
    for i in range(k):
        ri = inv[i]
        li = low[i]
        ri[i] = 1.0
        for p in range(i):
            cp = li[p]
            rp = inv[p]
            for j in range(p + 1):
                ri[j] -= cp * rp[j]
        dinv = 1.0 / li[i]
        for j in range(i + 1):
            ri[j] *= dinv
        logdet += math.log(li[i])
    w = c  # W[i, j] = sum_p inv[p, i] inv[p, j], lower triangle, then mirrored
    for i in range(k):
        wi = w[i]
        for j in range(i + 1):
            wi[j] = 0.0
    for p in range(k):
        rp = inv[p]
        for i in range(p + 1):
            cpi = rp[i]
            wi = w[i]
            for j in range(i + 1):
                wi[j] += cpi * rp[j]
    for i in range(k):
        for j in range(i):
            w[j, i] = w[i, j]
    alpha = np.empty(k)
    quad = 0.0
    for i in range(k):
        wi = w[i]
        t = 0.0
        for j in range(k):
            t += wi[j] * r[j]
        alpha[i] = t
        quad += r[i] * t
    val += -logdet - 0.5 * quad - 0.5 * k * _LOG_2PI
    # G = (alpha alpha^T - W) / 2, blocks g11 (d x d), g12 (d), g22; gradient as in numpy.
    a2 = alpha[d]
    g22 = 0.5 * (a2 * a2 - w[d, d])
    tr11 = 0.0
    g11_abar = 0.0
    g12_ab = 0.0
    g12_b = 0.0
    bab = 0.0
    g12 = np.empty(d)
    for i in range(d):
        g12[i] = 0.5 * (alpha[i] * a2 - w[i, d])
        tr11 += 0.5 * (alpha[i] * alpha[i] - w[i, i])
        g12_ab += g12[i] * ab[i]
        g12_b += g12[i] * u[i]
        bab += u[i] * ab[i]
    grad_a = -a2 * n * rho
    for i in range(d):
        bi = u[i]
        b2i = bi * bi
        ali = alpha[i]
        wi = w[i]
        xi = rxx[i]
        ai = abar[i]
        # mean part: Rxx a1 + 2 a2 Rxx beta
        t_rx = 0.0
        t_g11b = 0.0
        t_ag = 0.0
        for j in range(d):
            gij = 0.5 * (ali * alpha[j] - wi[j])
            t_rx += xi[j] * alpha[j]
            t_g11b += gij * u[j]
            t_ag += ai[j] * g12[j]
            g11_abar += gij * ai[j]
        g11ii = 0.5 * (alpha[i] * alpha[i] - w[i, i])
        gb = t_rx + 2.0 * a2 * rb[i]
        if vmat is not None:
            # d tr(G C_p) / d beta_i with per-entry variances p (``log_posterior_noise_aware``'s
            # matrix branch): 2 ((G11 o p) beta)_i - 2 G11_ii p_ii beta_i + 2 beta_i (p
            # diag G11)_i + 2 (G12_i (2 (p b2)_i - 3 p_ii b2_i) + 4 beta_i (p (G12 o beta))_i)
            # + G22 (8 beta_i (p b2)_i - 4 p_ii beta_i b2_i), b2 = beta^2.
            pi = vmat[i]
            t_gpb = 0.0
            t_pdg = 0.0
            t_pgb = 0.0
            t_pb2 = 0.0
            for j in range(d):
                pij = pi[j]
                uj = u[j]
                t_gpb += pij * (0.5 * (ali * alpha[j] - wi[j])) * uj
                t_pdg += pij * (0.5 * (alpha[j] * alpha[j] - w[j, j]))
                t_pgb += pij * (g12[j] * uj)
                t_pb2 += pij * (uj * uj)
            pii = pi[i]
            gb += 4.0 * rho * t_ag + 8.0 * rho * g22 * ab[i]
            gb += 2.0 * t_gpb - 2.0 * g11ii * pii * bi + 2.0 * bi * t_pdg
            gb += 2.0 * (g12[i] * (2.0 * t_pb2 - 3.0 * pii * b2i) + 4.0 * bi * t_pgb)
            gb += g22 * (8.0 * bi * t_pb2 - 4.0 * pii * bi * b2i)
        else:  # the one variance vxx: the same sums as before per-entry variances existed
            gb += vxx * (2.0 * bi * tr11 + 2.0 * t_g11b - 2.0 * bi * g11ii)
            gb += 4.0 * rho * t_ag + 2.0 * vxx * (4.0 * bi * g12_b
                                                  + g12[i] * (2.0 * s - 3.0 * b2i))
            gb += g22 * (8.0 * rho * ab[i] + vxx * (8.0 * s * bi - 4.0 * bi * b2i))
        g[i] += gb
    grad_a += (-rho * g11_abar - 4.0 * rho * g12_ab
               + g22 * (-4.0 * rho * bab - 4.0 * n * rho * rho))
    # The count's rank-one term: 2 v_n h^T du, h = G u (``noise_aware``).
    if vn != 0.0:
        u2 = cu[d]
        h2 = g22 * u2
        for i in range(d):
            h2 += g12[i] * cu[i]
        h1 = np.empty(d)
        for i in range(d):
            ali = alpha[i]
            wi = w[i]
            t = g12[i] * u2
            for j in range(d):
                t += 0.5 * (ali * alpha[j] - wi[j]) * cu[j]
            h1[i] = t
        for i in range(d):
            mi = mc[i]
            t = 0.0
            for j in range(d):
                t += mi[j] * h1[j]
            g[i] += 2.0 * vn * (t + 2.0 * h2 * cu[i])
        grad_a += -2.0 * vn * rho * h2
    g[d] += grad_a
    if pn > 0.0:
        val += _public_loglik_grad(u, pxx, pxy, pyy, pn, g)
    return val


@_jit
def _public_loglik_grad(u, pxx, pxy, pyy, pn, g):
    """The exact likelihood of the public statistics (``noise_aware._public_loglik``): adds
    its gradient into ``g``, returns its value."""
    d = pxy.shape[0]
    lam = math.exp(u[d])
    quad = pyy
    for i in range(d):
        sb = 0.0
        pi = pxx[i]
        for j in range(d):
            sb += pi[j] * u[j]
        quad += u[i] * sb - 2.0 * u[i] * pxy[i]
        g[i] += -lam * (sb - pxy[i])
    g[d] += 0.5 * pn - 0.5 * lam * quad
    return 0.5 * pn * (u[d] - _LOG_2PI) - 0.5 * lam * quad


@_jit
def _public_loglik_value(u, pxx, pxy, pyy, pn):
    d = pxy.shape[0]
    quad = pyy
    for i in range(d):
        sb = 0.0
        pi = pxx[i]
        for j in range(d):
            sb += pi[j] * u[j]
        quad += u[i] * sb - 2.0 * u[i] * pxy[i]
    return 0.5 * pn * (u[d] - _LOG_2PI) - 0.5 * math.exp(u[d]) * quad


@_jit
def _na_logp_batch(us, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                   pxx, pxy, pyy, pn, rot, const, out):
    """``noise_aware.log_posterior_noise_aware_batch`` into ``out`` (-inf where C is not PD);
    ``vmat`` and ``rot`` as in ``_na_parts`` and ``_na_logp_grad`` (the rows are rotated
    into U's basis first, all at once)."""
    if rot is not None:
        usr = np.empty_like(us)
        for row in range(us.shape[0]):
            _rotate_in(us[row], rot, usr[row])
        us = usr
    _na_logp_batch_basis(us, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                         pxx, pxy, pyy, pn, const, out)


@_jit
def _na_logp_batch_basis(us, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                         pxx, pxy, pyy, pn, const, out):
    """``_na_logp_batch`` in the inputs' own basis."""
    m = us.shape[0]
    d = rxy.shape[0]
    k = d + 1
    r, c, low, ab, rb, cu = _na_scratch(d)
    base = -0.5 * k * _LOG_2PI
    for row in range(m):
        u = us[row]
        _na_parts(u, rxx, rxy, ryy, n, abar, vxx, vmat, vxy, vyy, vn, mc, r, c, ab, rb, cu)
        if not _cholesky(c, low):
            out[row] = -np.inf
            continue
        # z = L^-1 r (forward substitution), |z|^2 = r^T C^-1 r.
        # log det / 2 = log prod L_ii, the product taken in pieces that cannot overflow.
        logdet = 0.0
        prod = 1.0
        zz = 0.0
        for i in range(k):
            li = low[i]
            t = r[i]
            for p in range(i):
                t -= li[p] * r[p]
            t /= li[i]
            r[i] = t
            zz += t * t
            prod *= li[i]
            if prod > 1e100 or prod < 1e-100:
                logdet += math.log(prod)
                prod = 1.0
        logdet += math.log(prod)
        out[row] = _prior_value(u, d, const) - logdet - 0.5 * zz + base
        if pn > 0.0:
            out[row] += _public_loglik_value(u, pxx, pxy, pyy, pn)


@_jit
def _exact_logp_batch(us, xtx, xty, yty, n, const, out):
    """``noise_aware.log_posterior_exact_batch`` into ``out``."""
    m = us.shape[0]
    d = xty.shape[0]
    for row in range(m):
        u = us[row]
        quad = yty
        for i in range(d):
            xi = xtx[i]
            sb = 0.0
            for j in range(d):
                sb += xi[j] * u[j]
            quad += u[i] * sb - 2.0 * u[i] * xty[i]
        out[row] = (_prior_value(u, d, const) + 0.5 * n * (u[d] - _LOG_2PI)
                    - 0.5 * math.exp(u[d]) * quad)


@_jit
def _logp_grad(kind, u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
               pxx, pxy, pyy, pn, rot, const, g):
    if kind == EXACT:
        return _exact_logp_grad(u, a, b, c0, n, const, g)
    return _na_logp_grad(u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                         pxx, pxy, pyy, pn, rot, const, g)


@_jit
def _logp_batch(kind, us, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                pxx, pxy, pyy, pn, rot, const, out):
    if kind == EXACT:
        _exact_logp_batch(us, a, b, c0, n, const, out)
    else:
        _na_logp_batch(us, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                       pxx, pxy, pyy, pn, rot, const, out)


@_jit
def _neg_hessian(kind, u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                 pxx, pxy, pyy, pn, rot, const, step, central, g_u, h):
    """Minus the Hessian at u by differences of the gradient, symmetrised, into ``h``:
    central differences with steps ``step * max(1, |u_i|)`` (``posterior.laplace.hessian``,
    2k gradients) or, with ``central=False``, forward differences from ``g_u`` (the gradient
    at u; k gradients, for Newton steps). False when a gradient was not finite."""
    k = u.shape[0]
    up = u.copy()
    gp = np.empty(k)
    gm = np.empty(k)
    for i in range(k):
        e = step * max(1.0, abs(u[i]))
        up[i] = u[i] + e
        vp = _logp_grad(kind, up, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                        pxx, pxy, pyy, pn, rot, const, gp)
        if central:
            up[i] = u[i] - e
            vm = _logp_grad(kind, up, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                            pxx, pxy, pyy, pn, rot, const, gm)
            if not (math.isfinite(vp) and math.isfinite(vm)):
                return False
            for j in range(k):
                h[i, j] = -(gp[j] - gm[j]) / (2.0 * e)
        else:
            if not math.isfinite(vp):
                return False
            for j in range(k):
                h[i, j] = -(gp[j] - g_u[j]) / e
        up[i] = u[i]
    for i in range(k):
        for j in range(i):
            t = 0.5 * (h[i, j] + h[j, i])
            h[i, j] = t
            h[j, i] = t
    return True


@_jit
def _newton(kind, u0, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
            pxx, pxy, pyy, pn, rot, const, tol, max_iterations,
            max_step, step, mode, grad, prec):
    """Mode of the log density by Newton's method with Levenberg damping and a backtracking
    (Armijo) line search, from ``u0``. Stops when max |gradient| <= ``tol``.

    Each step solves (H + mu I) p = g, H = minus the forward-difference Hessian, mu = 0 when H
    is positive definite and otherwise the smallest of 1e-8, 1e-7, ... times max |H_ii| that
    makes it so; p is shortened to at most ``max_step`` per coordinate; then halved until
    f(u + t p) >= f(u) + 1e-4 t g^T p. Writes the last point into ``mode``, its gradient into
    ``grad`` and minus the central-difference Hessian there into ``prec``.

    Returns (status, value, iterations): status 0 converged, 1 iteration limit, 2 line search
    found no increase (at the limit of floating point, or a bad direction), 3 the density or
    a Hessian was not finite, 4 no damping made H positive definite.
    """
    k = u0.shape[0]
    u = mode
    for i in range(k):
        u[i] = u0[i]
    g = grad
    f = _logp_grad(kind, u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                   pxx, pxy, pyy, pn, rot, const, g)
    if not math.isfinite(f):
        return 3, f, 0
    h = np.empty((k, k))
    m = np.empty((k, k))
    low = np.empty((k, k))
    p = np.empty(k)
    un = np.empty(k)
    gn = np.empty(k)
    it = 0
    status = 1
    while it < max_iterations:
        gmax = 0.0
        for i in range(k):
            gmax = max(gmax, abs(g[i]))
        if gmax <= tol:
            status = 0
            break
        it += 1
        if not _neg_hessian(kind, u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                            pxx, pxy, pyy, pn, rot, const, step,
                            False, g, h):
            status = 3
            break
        hscale = 0.0
        for i in range(k):
            hscale = max(hscale, abs(h[i, i]))
        hscale = max(hscale, 1e-300)
        mu = 0.0
        ok = False
        while mu <= 1e8 * hscale:
            for i in range(k):
                for j in range(k):
                    m[i, j] = h[i, j]
                m[i, i] += mu
            if _cholesky(m, low):
                ok = True
                break
            mu = 1e-8 * hscale if mu == 0.0 else 10.0 * mu
        if not ok:
            status = 4
            break
        # p = (L L^T)^-1 g
        for i in range(k):
            t = g[i]
            for q in range(i):
                t -= low[i, q] * p[q]
            p[i] = t / low[i, i]
        for i in range(k - 1, -1, -1):
            t = p[i]
            for q in range(i + 1, k):
                t -= low[q, i] * p[q]
            p[i] = t / low[i, i]
        pmax = 0.0
        for i in range(k):
            pmax = max(pmax, abs(p[i]))
        if pmax > max_step:
            for i in range(k):
                p[i] *= max_step / pmax
        slope = 0.0
        for i in range(k):
            slope += g[i] * p[i]
        t = 1.0
        accepted = False
        for _ in range(60):
            for i in range(k):
                un[i] = u[i] + t * p[i]
            fn = _logp_grad(kind, un, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                            pxx, pxy, pyy, pn, rot, const, gn)
            if math.isfinite(fn) and fn >= f + 1e-4 * t * slope:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            status = 2
            break
        for i in range(k):
            u[i] = un[i]
            g[i] = gn[i]
        f = fn
    if not _neg_hessian(kind, u, a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc,
                        pxx, pxy, pyy, pn, rot, const, step, True, g,
                        prec):
        for i in range(k):
            for j in range(k):
                prec[i, j] = np.nan
        if status == 0:
            status = 3
    return status, f, it


@dataclass(frozen=True)
class Target:
    """One model's log density on u = (beta, log lambda), compiled: its arguments packed once.

    ``logp_grad(u)`` -> (value, gradient), ``logp_batch(us)`` -> values at the rows of ``us``,
    ``neg_hessian(u)`` (central differences, as ``posterior.laplace.hessian``), ``newton``.
    """

    kind: int
    args: tuple  # (a, b, c0, n, abar, vxx, vmat, vxy, vyy, vn, mc, pxx, pxy, pyy, pn, rot, const)

    @property
    def dim(self) -> int:
        return self.args[1].shape[0] + 1

    def logp_grad(self, u: np.ndarray) -> tuple[float, np.ndarray]:
        u = np.ascontiguousarray(u, dtype=np.float64)
        g = np.empty(u.shape[0])
        return float(_logp_grad(self.kind, u, *self.args, g)), g

    def logp_batch(self, us: np.ndarray) -> np.ndarray:
        us = np.ascontiguousarray(us, dtype=np.float64)
        out = np.empty(us.shape[0])
        _logp_batch(self.kind, us, *self.args, out)
        return out

    def neg_hessian(self, u: np.ndarray, step: float = 1e-5) -> np.ndarray:
        u = np.ascontiguousarray(u, dtype=np.float64)
        h = np.empty((u.shape[0], u.shape[0]))
        if not _neg_hessian(self.kind, u, *self.args, step, True, u, h):
            h[:] = np.nan
        return h

    def newton(self, u0: np.ndarray, *, tol: float, max_iterations: int = 100,
               max_step: float = 10.0, step: float = 1e-5):
        """``_newton`` from u0: (status, mode, value, gradient, minus Hessian, iterations)."""
        u0 = np.ascontiguousarray(u0, dtype=np.float64)
        k = u0.shape[0]
        mode, grad, prec = np.empty(k), np.empty(k), np.empty((k, k))
        status, val, it = _newton(self.kind, u0, *self.args, float(tol), int(max_iterations),
                                  float(max_step), float(step), mode, grad, prec)
        return int(status), mode, float(val), grad, prec, int(it)


def _const(d: int) -> np.ndarray:
    """The prior's parameters (``noise_aware.prior_params``), read when the target is built."""
    return _f64(na.prior_params(d))


def _count_matrix(inp) -> np.ndarray:
    """Mc of ``NoiseAwareInputs`` (zeros when the count enters through n rho only)."""
    return _f64(inp.mc) if inp.mc is not None else np.zeros((inp.dim, inp.dim))


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def target_for(model: str, stats: Statistics,
               inp: "na.NoiseAwareInputs | None" = None) -> Target:
    """The compiled ``Target`` of ``model`` ("exact": ``stats``; "noise-aware": ``inp``).

    With the Wishart-shaped design (``inp.wishart = (U, inner)``) the target packs ``inner``
    (U's basis, per-entry variances ``inner.v_xx``) and U: its functions take and return
    points, gradients, Hessians and modes in the original basis, as the numpy densities."""
    d = stats.dim
    if model == "noise-aware":
        if inp is None:
            raise ValueError("the noise-aware target needs its NoiseAwareInputs")
        rot = None
        if inp.wishart is not None:
            rot, inp = _f64(inp.wishart[0]), inp.wishart[1]
            if rot.shape != (d, d):
                raise ValueError(f"the Wishart rotation is {rot.shape}, not ({d}, {d})")
        vxx, vmat = _design_variances(inp.v_xx, d)
        pxx, pxy, pyy, pn = inp.public_parts()
        return Target(NOISE_AWARE, (_f64(inp.rxx), _f64(inp.rxy), float(inp.ryy), float(inp.n),
                                    _f64(inp.abar), vxx, vmat, float(inp.v_xy),
                                    float(inp.v_yy), float(inp.v_n), _count_matrix(inp),
                                    _f64(pxx), _f64(pxy),
                                    float(pyy), float(pn), rot, _const(d)))
    xtx = _f64(stats.xtx)
    return Target(EXACT, (xtx, _f64(stats.xty), float(stats.yty), float(stats.n), xtx, 0.0,
                          None, 0.0, 0.0, 0.0, np.zeros((d, d)), xtx, _f64(stats.xty), 0.0,
                          0.0, None, _const(d)))


# "No per-entry variances" and "no rotation" are None, not empty arrays: Numba then compiles
# a specialisation of its own with the other branch pruned, so that the one-variance path runs
# the code it ran before the Wishart-shaped design (at d = 10: Newton within 1-3%, one
# gradient call +5% from passing two more arguments; an empty-array flag cost Newton 5-9%).
def _design_variances(v_xx, d: int) -> tuple[float, np.ndarray | None]:
    """(vxx, vmat) of the compiled functions from ``NoiseAwareInputs.v_xx``: a scalar gives
    (v, None), a (d, d) matrix of per-entry variances (0.0, the matrix). The matrix must be
    symmetric (the entries of a symmetric error; ``noise_aware.design_error_terms``), finite
    and non-negative: the compiled sums read it by rows where the numpy code reads columns."""
    if np.ndim(v_xx) == 0:
        return float(v_xx), None
    p = _f64(v_xx)
    if p.shape != (d, d):
        raise ValueError(f"per-entry design variances of shape {p.shape}, not ({d}, {d})")
    if not (np.all(np.isfinite(p)) and np.all(p >= 0.0) and np.array_equal(p, p.T)):
        raise ValueError("per-entry design variances must be finite, >= 0 and symmetric")
    return 0.0, p


def warm_up() -> None:
    """Compile (or load from the disk cache) every entry point, on a tiny problem."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 2))
    s = Statistics(x.T @ x, x.T @ x[:, 0], float(x[:, 0] @ x[:, 0]), 20)
    inp = na.NoiseAwareInputs(s.xtx, s.xty, s.yty, 20.0, s.xtx, 0.1, 0.1, 0.1, 0.1)
    inp_pub = na.NoiseAwareInputs(s.xtx, s.xty, s.yty, 20.0, s.xtx, 0.1, 0.1, 0.1, 0.1,
                                  s.xtx, s.xty, s.yty, 20.0)
    # The Wishart-shaped design's specialisation (per-entry variances, rotation U).
    rot = np.array([[0.6, -0.8], [0.8, 0.6]])
    inp_w = dataclasses.replace(inp_pub, wishart=(rot, dataclasses.replace(
        inp_pub, v_xx=np.full((2, 2), 0.1))))
    for t in (target_for("exact", s), target_for("noise-aware", s, inp),
              target_for("noise-aware", s, inp_pub), target_for("noise-aware", s, inp_w)):
        u = np.zeros(3)
        t.logp_grad(u)
        t.logp_batch(u[None, :])
        t.neg_hessian(u)
        t.newton(u, tol=1e-6)
