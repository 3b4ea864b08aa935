"""The log densities of ``posterior.noise_aware`` and their gradients, vectorised over many
points at once with numpy (pure functions; no compilation).

Samplers that move many points together (the importance proposals of ``posterior.laplace``,
the parallel chains of ``posterior.elliptical``, the finite-difference Hessian of the mode
search) call these instead of the one-point reference functions: one call evaluates a stack
of S points, so numpy's per-call overhead is paid once per stack and the (d + 1) x (d + 1)
factorisations run in LAPACK (``np.linalg.cholesky``/``inv`` on stacks). The formulas are the
reference ones (``posterior.noise_aware`` module docstring), written over a leading axis;
tests/test_fit_scaling.py checks them against the reference to ~1e-10 relative.

Why not compiled code: the Numba twins (``posterior.noise_aware_jit``) cost 6-20 s of
compilation on a machine whose cache is empty (the first ``dpfed simulate`` of a new
install), more than the whole command may take; these need none. Per point they are slower at
d = 10 (a few us against ~1 us) and faster from d ~ 40 (LAPACK's blocked factorisations
against hand-written loops).

Points outside the density's range (|log lambda| > 60, a covariance that is not positive
definite: a guard) get -inf and a zero gradient.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular
from scipy.linalg.lapack import dpotrf as _potrf, dpotri as _potri

from posterior import noise_aware as na

__all__ = ["noise_aware_logp", "noise_aware_logp_grad", "exact_logp", "exact_logp_grad"]

_LOG_2PI = float(np.log(2 * np.pi))
_MAX_LOG_LAMBDA = 60.0
# From this matrix size on, the triangular solve and potri of the Cholesky factor beat
# numpy's LU-based solve and inv (measured per matrix: k = 129, 58 against 250 us and 470
# against 1040 us; at k = 11 numpy's are 5-10 x faster, Python's loop over potri dominating).
_LARGE = 64


def _prior(us: np.ndarray, d: int, grad: bool):
    """The prior of beta (lambda0 integrated out) and of lambda on log lambda
    (``na._log_prior``, ``na.Prior``)."""
    val, gr = na.prior_value(us[:, :d], us[:, d], na.prior_params(d), grad=grad)
    if not grad:
        return val, None
    g = np.empty_like(us)
    g[:, :d] = gr[0]
    g[:, d] = gr[1]
    return val, g


def _gaussian_loglik(us, xx, xy, yy, n, grad: bool):
    """Exact likelihood of statistics (Sxx, Sxy, Syy, n) (method.md section 1), no prior."""
    d = xy.shape[0]
    beta, a = us[:, :d], us[:, d]
    lam = np.exp(a)
    xb = beta @ xx
    quad = np.einsum("ij,ij->i", beta, xb) - 2.0 * (beta @ xy) + yy
    val = 0.5 * n * (a - _LOG_2PI) - 0.5 * lam * quad
    if not grad:
        return val, None
    g = np.empty_like(us)
    g[:, :d] = -lam[:, None] * (xb - xy)
    g[:, d] = 0.5 * n - 0.5 * lam * quad
    return val, g


def _inverse_from_cholesky(chol: np.ndarray) -> np.ndarray:
    """C^-1 from the lower Cholesky factors of a stack (LAPACK potri, one matrix at a time:
    a third of the flops of ``np.linalg.inv``'s LU, and no per-matrix copy for a stack)."""
    m, k, _ = chol.shape
    w = np.empty_like(chol)
    for i in range(m):
        inv, info = _potri(chol[i], lower=1)
        if info != 0:
            w[i] = np.linalg.inv(chol[i] @ chol[i].T)
            continue
        low = np.tril(inv)
        w[i] = low + np.tril(inv, -1).T
    return w


# The bordered factorisation (``noise_aware_logp_grad``, value only): the lower Cholesky factor
# of [[C, r], [r^T, t]] is [[L, 0], [z^T, sqrt(t - z^T z)]] with z = L^-1 r, so r^T C^-1 r =
# z^T z = t - (its last diagonal entry)^2. C >= min(v_xy, v_yy) I (its other terms are
# positive semidefinite: module docstring of posterior.noise_aware), so
# t = 2 |r|^2 / min(v_xy, v_yy) + 1 > r^T C^-1 r keeps the bordered matrix positive definite;
# the quadratic form loses ~ cond(C) x 1e-16 of its value (relative 2e-15 measured at d = 64).
# The bordered matrices are built and factorised _CHUNK points at a time in one reused buffer,
# each factorised in place by LAPACK potrf (its Fortran-order lower triangle is the C-order
# upper one of a symmetric matrix, so no copy): a chunk stays in the 1 MB L2 cache, where the
# whole stack's 28 MB (800 points at d = 64) and numpy's per-matrix copies in and out of its
# batched cholesky did not. 800 points, process CPU time, one BLAS thread, idle machine:
# d = 64 75 -> 34 ms, d = 128 214 -> ~100 ms (benchmarks/bench_fit.py, docs/benchmarks.md).
_CHUNK = 16


def _clean(us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    us = np.ascontiguousarray(np.atleast_2d(us), dtype=np.float64)
    d = us.shape[1] - 1
    ok = np.all(np.isfinite(us), axis=1) & (np.abs(us[:, d]) <= _MAX_LOG_LAMBDA)
    return us, ok


def exact_logp(us: np.ndarray, stats) -> np.ndarray:
    """``na.log_posterior_exact`` at every row of ``us`` (S, d + 1)."""
    return exact_logp_grad(us, stats, grad=False)[0]


def exact_logp_grad(us: np.ndarray, stats, grad: bool = True):
    """(values, gradients) of ``na.log_posterior_exact`` at the rows of ``us``."""
    us, ok = _clean(us)
    d = us.shape[1] - 1
    safe = np.where(ok[:, None], us, 0.0)
    pv, pg = _prior(safe, d, grad)
    lv, lg = _gaussian_loglik(safe, np.asarray(stats.xtx, float), np.asarray(stats.xty, float),
                              float(stats.yty), float(stats.n), grad)
    val = np.where(ok, pv + lv, -np.inf)
    if not grad:
        return val, None
    g = np.where(ok[:, None], pg + lg, 0.0)
    return val, g


def _covariance_parts(beta, rho, s, b2, ab, bab, inp, u1, u2):
    """The noise-aware covariance C (``posterior.noise_aware`` module docstring) apart from
    C11's rho Abar + v_xx beta beta^T + v_n u1 u1^T: C11's diagonal addition v_xy + v_xx
    (|b|^2 - b_i^2), C12 and C22 with the count's rank-one term (u1, u2:
    ``NoiseAwareInputs.count_vector``), per point."""
    # The design's error (one variance, or per entry: ``na.NoiseAwareInputs.wishart``).
    dg, c12v, c22v = na.design_error_terms(beta, inp.v_xx)
    c11_diag = inp.v_xy + dg
    c12 = 2.0 * rho[:, None] * ab + c12v + inp.v_n * u1 * u2[:, None]
    c22 = 4.0 * rho * bab + 2.0 * inp.n * rho * rho + inp.v_n * u2 * u2 + inp.v_yy + c22v
    return c11_diag, c12, c22


def _bordered_logdet_quad(beta, rho, s, b2, ab, bab, r, inp, u1, u2):
    """(log det C, r^T C^-1 r, positive definite) per point from the lower Cholesky factor of
    C bordered by r and t (comment above), _CHUNK points at a time, potrf in place."""
    m, d = beta.shape
    k = d + 1
    vxx = inp.v_xx if np.ndim(inp.v_xx) else float(inp.v_xx)
    t = 2.0 * np.einsum("ij,ij->i", r, r) / min(inp.v_xy, inp.v_yy) + 1.0
    c11_diag, c12, c22 = _covariance_parts(beta, rho, s, b2, ab, bab, inp, u1, u2)
    count = inp.mc is not None and inp.v_n != 0.0
    diag = np.empty((m, k + 1))
    pd = np.ones(m, dtype=bool)
    buf = np.empty((min(_CHUNK, m), k + 1, k + 1))
    idx = np.arange(d)
    for lo in range(0, m, _CHUNK):
        hi = min(lo + _CHUNK, m)
        c = buf[:hi - lo]
        c11 = c[:, :d, :d]
        np.multiply(rho[lo:hi, None, None], inp.abar, out=c11)
        if np.ndim(vxx):
            c11 += vxx * (beta[lo:hi, :, None] * beta[lo:hi, None, :])
        elif vxx != 0.0:
            c11 += beta[lo:hi, :, None] * (vxx * beta[lo:hi])[:, None, :]
        if count:
            c11 += u1[lo:hi, :, None] * (inp.v_n * u1[lo:hi])[:, None, :]
        c[:, idx, idx] += c11_diag[lo:hi]
        c[:, :d, d] = c12[lo:hi]
        c[:, d, :d] = c12[lo:hi]
        c[:, d, d] = c22[lo:hi]
        c[:, :k, k] = r[lo:hi]
        c[:, k, :k] = r[lo:hi]
        c[:, k, k] = t[lo:hi]
        for j in range(hi - lo):
            # c[j].T is Fortran-ordered: potrf factorises it in place (its lower triangle is
            # c[j]'s upper one, the same numbers); the factor's diagonal is c[j]'s diagonal.
            _, info = _potrf(c[j].T, lower=1, overwrite_a=1, clean=0)
            if info != 0:
                pd[lo + j] = False
                c[j] = np.eye(k + 1)
        diag[lo:hi] = np.diagonal(c, axis1=1, axis2=2)
    quad = t - diag[:, k] ** 2
    logdet = 2.0 * np.sum(np.log(diag[:, :k]), axis=1)
    return logdet, quad, pd


def noise_aware_logp(us: np.ndarray, inp: "na.NoiseAwareInputs") -> np.ndarray:
    """``na.log_posterior_noise_aware`` (value only) at every row of ``us`` (S, d + 1)."""
    return noise_aware_logp_grad(us, inp, grad=False)[0]


def noise_aware_logp_grad(us: np.ndarray, inp: "na.NoiseAwareInputs", grad: bool = True):
    """(values, gradients) of ``na.log_posterior_noise_aware`` at the rows of ``us``; the
    gradient is None with ``grad=False`` (then only a Cholesky factor per point is needed, no
    inverse)."""
    if inp.wishart is not None:
        rot, inner = inp.wishart
        us, _ = _clean(us)
        val, g = noise_aware_logp_grad(na.rotate_in(us, rot), inner, grad)
        return val, (None if g is None else na.rotate_gradient_out(g, rot))
    us, ok = _clean(us)
    m, k = us.shape
    d = k - 1
    safe = np.where(ok[:, None], us, 0.0)
    beta, a = safe[:, :d], safe[:, d]
    rho = np.exp(-a)
    s = np.einsum("ij,ij->i", beta, beta)
    b2 = beta * beta
    ab = beta @ inp.abar
    rb = beta @ inp.rxx
    bab = np.einsum("ij,ij->i", beta, ab)
    r = np.empty((m, k))
    r[:, :d] = inp.rxy - rb
    r[:, d] = inp.ryy - np.einsum("ij,ij->i", beta, rb) - inp.n * rho
    vxx = inp.v_xx
    u1, u2 = inp.count_vector(beta, rho)
    count = inp.mc is not None and inp.v_n != 0.0
    prior_v, prior_g = _prior(safe, d, grad)
    if inp.pxx is not None:
        pub_v, pub_g = _gaussian_loglik(safe, inp.pxx, inp.pxy, float(inp.pyy), float(inp.pn),
                                        grad)
    else:
        pub_v, pub_g = 0.0, 0.0
    if not grad and k >= _LARGE and min(inp.v_xy, inp.v_yy) > 0:
        # Value only, large k, v_xy and v_yy > 0: C bordered by r and t (comment above), one
        # Cholesky factor for the log determinant and the quadratic form, no triangular solve.
        logdet, quad, pd = _bordered_logdet_quad(beta, rho, s, b2, ab, bab, r, inp, u1, u2)
        val = prior_v + pub_v - 0.5 * logdet - 0.5 * quad - 0.5 * k * _LOG_2PI
        return np.where(ok & pd, val, -np.inf), None
    c = np.empty((m, k, k))
    np.multiply(rho[:, None, None], inp.abar, out=c[:, :d, :d])
    if np.ndim(vxx) or vxx != 0.0:
        c[:, :d, :d] += vxx * (beta[:, :, None] * beta[:, None, :])
    if count:
        c[:, :d, :d] += inp.v_n * (u1[:, :, None] * u1[:, None, :])
    idx = np.arange(d)
    c11_diag, c12, c22 = _covariance_parts(beta, rho, s, b2, ab, bab, inp, u1, u2)
    c[:, idx, idx] += c11_diag
    c[:, :d, d] = c12
    c[:, d, :d] = c12
    c[:, d, d] = c22
    try:
        chol = np.linalg.cholesky(c)
        pd = np.ones(m, dtype=bool)
    except np.linalg.LinAlgError:
        # Some stack member is not PD (a guard; cannot happen with a positive variance).
        chol = np.zeros_like(c)
        pd = np.zeros(m, dtype=bool)
        for i in range(m):
            try:
                chol[i] = np.linalg.cholesky(c[i])
                pd[i] = True
            except np.linalg.LinAlgError:
                c[i] = np.eye(c.shape[1])
                chol[i] = np.eye(c.shape[1])
    ok &= pd
    logdet = 2.0 * np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    if not grad:
        if k >= _LARGE:
            z = solve_triangular(chol, r[:, :, None], lower=True)[:, :, 0]
        else:
            z = np.linalg.solve(chol, r[:, :, None])[:, :, 0]
        val = prior_v + pub_v - 0.5 * logdet - 0.5 * np.sum(z * z, axis=1) \
            - 0.5 * k * _LOG_2PI
        return np.where(ok, val, -np.inf), None
    w = _inverse_from_cholesky(chol) if k > _LARGE else np.linalg.inv(c)
    alpha = np.einsum("mij,mj->mi", w, r)
    val = prior_v + pub_v - 0.5 * logdet - 0.5 * np.einsum("ij,ij->i", r, alpha) \
        - 0.5 * k * _LOG_2PI
    # Reference gradient (na.log_posterior_noise_aware) with G = (alpha alpha^T - W) / 2.
    a1, a2 = alpha[:, :d], alpha[:, d]
    w11 = w[:, :d, :d]
    w12 = w[:, :d, d]
    w22 = w[:, d, d]
    g12 = 0.5 * (a1 * a2[:, None] - w12)
    g22 = 0.5 * (a2 * a2 - w22)
    a1_b = np.einsum("ij,ij->i", a1, beta)
    g11b = 0.5 * (a1 * a1_b[:, None] - np.einsum("mij,mj->mi", w11, beta))
    tr_g11 = 0.5 * (np.einsum("ij,ij->i", a1, a1) - np.einsum("mii->m", w11))
    diag_g11 = 0.5 * (a1 * a1 - np.einsum("mii->mi", w11))
    a1_abar = a1 @ inp.abar
    sum_g11_abar = 0.5 * (np.einsum("ij,ij->i", a1_abar, a1)
                          - np.einsum("mij,ij->m", w11, inp.abar))
    grad_b = a1 @ inp.rxx + 2.0 * a2[:, None] * rb
    grad_a = -a2 * inp.n * rho
    grad_a += (-rho * sum_g11_abar - 4.0 * rho * np.einsum("ij,ij->i", g12, ab)
               + g22 * (-4.0 * rho * bab - 4.0 * inp.n * rho * rho))
    grad_b += 4.0 * rho[:, None] * (g12 @ inp.abar) + 8.0 * (g22 * rho)[:, None] * ab
    if np.ndim(vxx) == 0:
        grad_b += vxx * (2.0 * beta * tr_g11[:, None] + 2.0 * g11b - 2.0 * beta * diag_g11)
        g12_b = np.einsum("ij,ij->i", g12, beta)
        grad_b += 2.0 * vxx * (4.0 * beta * g12_b[:, None] + g12 * (2.0 * s[:, None] - 3.0 * b2))
        grad_b += g22[:, None] * vxx * (8.0 * s[:, None] * beta - 4.0 * beta * b2)
    else:
        # Per-entry variances p (na.log_posterior_noise_aware's matrix branch); (G11 o p) beta
        # with G11 = (a1 a1^T - W11) / 2.
        p, pd = vxx, np.diag(vxx)
        pb2 = b2 @ p
        gpb = 0.5 * (a1 * ((a1 * beta) @ p) - np.einsum("mij,ij,mj->mi", w11, p, beta))
        grad_b += 2.0 * gpb - 2.0 * diag_g11 * pd * beta + 2.0 * beta * (diag_g11 @ p)
        grad_b += 2.0 * (g12 * (2.0 * pb2 - 3.0 * pd * b2) + 4.0 * beta * ((g12 * beta) @ p))
        grad_b += g22[:, None] * (8.0 * beta * pb2 - 4.0 * pd * beta * b2)
    # The count's rank-one term (na.log_posterior_noise_aware): 2 v_n h^T du, h = G u.
    if count:
        a1_u1 = np.einsum("ij,ij->i", a1, u1)
        h1 = (0.5 * (a1 * a1_u1[:, None] - np.einsum("mij,mj->mi", w11, u1))
              + g12 * u2[:, None])
        h2 = np.einsum("ij,ij->i", g12, u1) + g22 * u2
        grad_b += 2.0 * inp.v_n * (h1 @ inp.mc + 2.0 * h2[:, None] * u1)
    else:
        h2 = g22 * u2
    grad_a += -2.0 * inp.v_n * rho * h2
    g = prior_g + pub_g
    g[:, :d] += grad_b
    g[:, d] += grad_a
    return np.where(ok, val, -np.inf), np.where(ok[:, None], g, 0.0)
