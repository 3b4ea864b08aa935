"""A rotation-invariant envelope of the noise-aware density, O(d) per point after one rotation
(pure functions; issue 21 item 4: a fit that scales with d).

The noise-aware likelihood (``posterior.noise_aware``, module docstring) is a (d+1)-variate
normal whose covariance depends on the point (beta, log lambda); evaluating it needs a
Cholesky factor per point, O(d^3): ~50-200 us at d = 64, so the thousands of points that
importance sampling or HMC need cost seconds. Almost all of that covariance is diagonal in
one fixed basis: with R_xx's eigendecomposition A_post = Q diag(l) Q^T (Abar = Q diag(lbar)
Q^T shares it: ``psd_estimate`` only floors eigenvalues) and b = Q^T beta,

    r1 = Q^T R_xy - l * b,          r2 = R_yy - sum(l b^2) - n rho
    C11 = diag(rho lbar + v_xy + v |b|^2) + v b b^T                               (E1)
    C12 = 2 (rho lbar + v |b|^2) * b
    C22 = 4 rho sum(lbar b^2) + (2 n + v_n) rho^2 + v_yy + 2 v |b|^4

(``*``: entrywise; v = v_xx). The one term that is not, -v diag(beta^2) in C11 (with its
-v beta^3 in C12 and -v sum beta^4 in C22), is left out: (E1) is the covariance the
errors-in-variables term E_xx beta would have if the diagonal entries of the symmetric noise
E_xx had variance 2 v instead of v (the rotation-invariant, "GOE" law: E = (G + G^T)/sqrt(2)
for G with iid entries of variance v); it is E_xx's only law whose covariance is invariant
under beta -> Q^T beta. With (E1), C11 is diagonal plus rank one, and its inverse,
determinant and the Schur complement of C22 follow by Sherman-Morrison and the block
formulas in O(d) per point; rotating the points (one matrix product for a stack) is the
only O(d^2) step. The difference from the exact density is the extra variance v beta_i^2 on
the i-th diagonal entry, at most v |beta|^2 in all against the v |beta|^2 on every entry
that both carry: its log density differs from the exact one by O(1) at most and by O(1/d)
typically. Two more terms of the exact model are left out of the envelope: the released
count's rank-one term v_n u u^T (``na.COUNT_IN_LIKELIHOOD``; v_n rho^2 stays in C22), and
the Wishart-shaped design's per-entry variances (``na.NoiseAwareInputs.wishart``), for which
it takes their mean v (the inputs' scalar ``v_xx``).

So the envelope is not the model: ``posterior.fit`` uses it as the *proposal* from which
the exact noise-aware posterior is importance sampled (``envelope_importance``): the mode and
an adapted proposal are found on the envelope (cheap), and the exact density is evaluated
only on the final proposals, whose weights (exact / proposal) are checked by their Pareto
k-hat as every importance sample is. The fit's target, and so its intervals, stay those of
the exact noise-aware model.

Gradient: d log N(r; 0, C) = -alpha^T dr + tr(G dC) with alpha = C^-1 r and
G = (alpha alpha^T - C^-1) / 2 (as in ``posterior.noise_aware``), with every trace and
product of G taken through the rank-one and block structure above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posterior import batched
from posterior import noise_aware as na

__all__ = ["Envelope", "envelope", "envelope_logp_grad", "envelope_logp"]

_LOG_2PI = float(np.log(2 * np.pi))


@dataclass(frozen=True)
class Envelope:
    """The noise-aware inputs in the eigenbasis of the design's release (module docstring)."""

    q: np.ndarray            # eigenvectors of A_post (columns)
    ell: np.ndarray          # eigenvalues of A_post (R_xx's posterior mean; may be < 0)
    lbar: np.ndarray         # eigenvalues of Abar (floored)
    yr: np.ndarray           # Q^T R_xy
    inp: na.NoiseAwareInputs


def envelope(inp: na.NoiseAwareInputs) -> Envelope:
    """Rotate ``inp`` into the eigenbasis of its design release. Abar must be A_post with
    its eigenvalues floored (``na.psd_estimate``); checked."""
    ell, q = np.linalg.eigh(np.asarray(inp.rxx, dtype=np.float64))
    lbar_full = q.T @ np.asarray(inp.abar, dtype=np.float64) @ q
    lbar = np.diag(lbar_full).copy()
    off = lbar_full - np.diag(lbar)
    scale = max(float(np.max(np.abs(lbar))), 1e-300)
    if float(np.max(np.abs(off))) > 1e-8 * scale:
        raise ValueError("Abar does not share A_post's eigenvectors (not its PSD projection)")
    return Envelope(q, ell, lbar, q.T @ np.asarray(inp.rxy, dtype=np.float64), inp)


def envelope_logp(us: np.ndarray, env: Envelope) -> np.ndarray:
    """The envelope's log posterior density (value only) at the rows of ``us`` (S, d + 1)."""
    return envelope_logp_grad(us, env, grad=False)[0]


def envelope_logp_grad(us: np.ndarray, env: Envelope, grad: bool = True):
    """(values, gradients) of the envelope log posterior at the rows of ``us`` = (beta,
    log lambda): the likelihood (E1) of the module docstring, plus the prior and the public
    rows' exact likelihood of ``posterior.noise_aware`` (unchanged). Points outside the
    density's range get -inf and a zero gradient, as in ``posterior.batched``."""
    inp = env.inp
    us, ok = batched._clean(us)
    m, k = us.shape
    d = k - 1
    safe = np.where(ok[:, None], us, 0.0)
    beta, a = safe[:, :d], safe[:, d]
    rho = np.exp(-a)
    v, vxy = float(inp.v_xx), float(inp.v_xy)
    n, vn, vyy = float(inp.n), float(inp.v_n), float(inp.v_yy)
    ell, lbar = env.ell, env.lbar
    b = beta @ env.q
    b2 = b * b
    s = b2.sum(axis=1)
    r1 = env.yr - ell * b
    r2 = float(inp.ryy) - b2 @ ell - n * rho
    lb2 = b2 @ lbar
    gam = rho[:, None] * lbar + (v * s)[:, None]
    delta = gam + vxy
    c = 2.0 * gam * b
    c22 = 4.0 * rho * lb2 + (2.0 * n + vn) * rho * rho + vyy + 2.0 * v * s * s
    with np.errstate(divide="ignore", invalid="ignore"):
        p = b / delta
        bp = np.einsum("ij,ij->i", b, p)
        kap = v / (1.0 + v * bp)

        def c11_inv(x):
            return x / delta - (kap * np.einsum("ij,ij->i", p, x))[:, None] * p

        h = c11_inv(c)
        schur = c22 - np.einsum("ij,ij->i", c, h)
        ok &= np.all(delta > 0, axis=1) & (schur > 0) & (1.0 + v * bp > 0)
        z1 = c11_inv(r1)
        hr1 = np.einsum("ij,ij->i", h, r1)
        alpha2 = (r2 - hr1) / schur
        alpha1 = z1 - h * alpha2[:, None]
        quad = np.einsum("ij,ij->i", r1, z1) + alpha2 * (r2 - hr1)
        logdet = np.sum(np.log(delta), axis=1) + np.log1p(v * bp) + np.log(schur)
    prior_v, prior_g = batched._prior(safe, d, grad)
    if inp.pxx is not None:
        pub_v, pub_g = batched._gaussian_loglik(safe, inp.pxx, inp.pxy, float(inp.pyy),
                                                float(inp.pn), grad)
    else:
        pub_v, pub_g = 0.0, 0.0
    val = prior_v + pub_v - 0.5 * (logdet + quad + k * _LOG_2PI)
    val = np.where(ok, val, -np.inf)
    if not grad:
        return val, None
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_schur = 1.0 / schur
        # W11 = C11^-1 + h h^T / schur: its diagonal, trace and product with b.
        diag_w11 = 1.0 / delta - kap[:, None] * p * p + h * h * inv_schur[:, None]
        tr_w11 = diag_w11.sum(axis=1)
        hb = np.einsum("ij,ij->i", h, b)
        w11_b = p * (1.0 - kap * bp)[:, None] + h * (hb * inv_schur)[:, None]
        a1b = np.einsum("ij,ij->i", alpha1, b)
        g11_b = 0.5 * (alpha1 * a1b[:, None] - w11_b)
        tr_g11 = 0.5 * (np.einsum("ij,ij->i", alpha1, alpha1) - tr_w11)
        diag_g11 = 0.5 * (alpha1 * alpha1 - diag_w11)
        g12 = 0.5 * (alpha1 * alpha2[:, None] + h * inv_schur[:, None])
        g22 = 0.5 * (alpha2 * alpha2 - inv_schur)
        g12_b = np.einsum("ij,ij->i", g12, b)
        grad_b = (ell * alpha1 + 2.0 * alpha2[:, None] * ell * b
                  + 2.0 * v * (b * tr_g11[:, None] + g11_b)
                  + 4.0 * gam * g12 + 8.0 * v * b * g12_b[:, None]
                  + 8.0 * g22[:, None] * (rho[:, None] * lbar + (v * s)[:, None]) * b)
        grad_a = (-alpha2 * n * rho - rho * (diag_g11 @ lbar)
                  - 4.0 * rho * np.einsum("ij,ij->i", g12, lbar * b)
                  + g22 * (-4.0 * rho * lb2 - 2.0 * (2.0 * n + vn) * rho * rho))
    g = prior_g + pub_g
    g[:, :d] += grad_b @ env.q.T
    g[:, d] += grad_a
    g = np.where(ok[:, None] & np.isfinite(g), g, 0.0)
    return val, g
