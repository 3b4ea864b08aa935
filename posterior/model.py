"""The Bayesian linear regression model in PyMC, through sufficient statistics, and its
compiled mean-field ADVI (stateful objects, compiled once per dimension and cached).

Model (Honkela et al. 2018, section 4.1, eq. (4.1); method.md section 1)::

    lambda  ~ Gamma(2, 2)                  (shape, rate)
    lambda0 ~ Gamma(2, 2)
    beta    ~ N(0, I / lambda0)
    log p(y | X, beta, lambda) = n/2 log(lambda / 2 pi) - lambda/2 (beta^T Sxx beta - 2 beta^T Sxy + Syy)

The likelihood enters as a ``pm.Potential``; the statistics are ``pm.Data`` containers.

Mean-field ADVI (Kucukelbir et al. 2017), as in the paper: a diagonal Gaussian q over PyMC's
unconstrained value variables ``(log lambda, log lambda0, beta)`` with standard deviation
``softplus(rho)`` (PyMC's ``MeanField`` parametrisation), fitted by maximising the ELBO with
the reparameterisation trick and Adam. The one-sample ELBO is built from the PyMC model's own
joint log density (``model.logp()``, including the log-Jacobians of the log transforms). So that
a fit does not pay PyMC's per-iteration Python overhead (~100 us per step, i.e. 4 s per 40k
steps) a whole chunk of steps runs inside one compiled ``pytensor.scan``; the data, the
variational parameters, the Adam state and the standard-normal noise are *inputs* of that
function, so it is compiled once (for every d: the length of beta is symbolic) and is pure (no shared state is mutated: the same
inputs give the same outputs, and concurrent fits cannot interfere). The noise is drawn by
the caller from a seeded ``numpy.random.Generator``, so fits are deterministic given a seed.
That noise is Monte Carlo noise of the optimiser, not DP noise.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PRIOR_SHAPE",
    "PRIOR_RATE",
    "build_model",
    "build_noise_aware_model",
    "AdviState",
    "AdviEngine",
    "ChunkSummary",
    "get_advi_engine",
    "clear_cache",
    "DEFAULT_MODE",
]

log = logging.getLogger(__name__)

#: Gamma(a, b) prior of both precisions, shape and rate (paper section 4.5: a=b=a0=b0=2).
PRIOR_SHAPE = 2.0
PRIOR_RATE = 2.0

#: PyTensor backend of the compiled ADVI step. Numba runs a step in ~6 us at d=10 (C: ~60 us)
#: and caches its machine code on disk, so only the very first compile on a machine is slow.
DEFAULT_MODE = "NUMBA"

# Adam constants (Kingma and Ba 2015), as in pm.adam.
_BETA1, _BETA2, _ADAM_EPS = 0.9, 0.999, 1e-8

_DATA_NAMES = ("xtx", "xty", "yty", "n")


def precision_priors(prior):
    """lam and lam0 with the priors of ``prior`` (a ``posterior.noise_aware.Prior``: the
    paper's, the bound's, the scaled normal-gamma one or the total-variance one), inside the
    current PyMC model."""
    import pymc as pm
    import pytensor.tensor as pt

    lam = pm.Gamma("lam", alpha=prior.shape, beta=prior.rate)
    if prior.kind == "total":
        tau = prior.width * prior.total
        rate0 = prior.rate0 * tau * pt.softplus((prior.total - 1.0 / lam) / tau)
    elif prior.kind == "scaled":
        rate0 = prior.rate0 / lam
    else:
        rate0 = prior.rate0
    return lam, pm.Gamma("lam0", alpha=prior.shape0, beta=rate0)


def build_model(d: int | None = None, prior=None):
    """Return ``(model, data)``: the PyMC model of method.md section 1.

    ``data`` maps ``xtx, xty, yty, n`` to the model's ``pm.Data`` containers. Value variables
    are ``lam_log__``, ``lam0_log__`` and ``beta`` (PyMC's log transform of the Gammas). With
    ``d=None`` the length of beta is symbolic (taken from ``xty``), so one compiled graph
    serves every dimension; with an integer ``d`` it is static (used for NUTS).
    """
    import pymc as pm
    import pytensor.tensor as pt

    generic = d is None
    d = 1 if generic else int(d)
    if d < 1:
        raise ValueError(f"dimension must be >= 1, got {d}")
    with pm.Model() as model:
        xtx = pm.Data("xtx", np.eye(d))
        xty = pm.Data("xty", np.zeros(d))
        yty = pm.Data("yty", np.float64(1.0))
        n = pm.Data("n", np.float64(0.0))
        if prior is None:   # the paper's (the ADVI engine's graph, built once)
            lam = pm.Gamma("lam", alpha=PRIOR_SHAPE, beta=PRIOR_RATE)
            lam0 = pm.Gamma("lam0", alpha=PRIOR_SHAPE, beta=PRIOR_RATE)
        else:
            lam, lam0 = precision_priors(prior)
        beta = pm.Normal("beta", mu=0.0, sigma=1.0 / pt.sqrt(lam0),
                         shape=xty.shape if generic else (d,))
        quad = beta @ xtx @ beta - 2.0 * beta @ xty + yty
        pm.Potential("loglik", 0.5 * n * pt.log(lam / (2.0 * np.pi)) - 0.5 * lam * quad)
    return model, {"xtx": xtx, "xty": xty, "yty": yty, "n": n}


@dataclass(frozen=True)
class AdviState:
    """Variational parameters and Adam state after ``t`` steps (flat vectors of length d+2)."""

    mu: np.ndarray
    rho: np.ndarray
    m_mu: np.ndarray
    v_mu: np.ndarray
    m_rho: np.ndarray
    v_rho: np.ndarray
    t: float

    @classmethod
    def start(cls, mu: np.ndarray, rho: np.ndarray) -> "AdviState":
        z = np.zeros_like(mu, dtype=np.float64)
        return cls(np.asarray(mu, float), np.asarray(rho, float), z, z, z, z, 0.0)


@dataclass(frozen=True)
class ChunkSummary:
    """Averages over a chunk of steps: iterates, gradients of the loss, squared gradients."""

    steps: int
    mu: np.ndarray
    rho: np.ndarray
    grad_mu: np.ndarray
    grad_rho: np.ndarray
    grad_mu_sq: np.ndarray
    grad_rho_sq: np.ndarray


class AdviEngine:
    """Mean-field ADVI, compiled once for every dimension; ``run`` executes a chunk of steps.

    The flat unconstrained vector has PyMC's order of value variables: ``lam_log__``,
    ``lam0_log__``, ``beta`` (``slices(d)``). The length of beta is symbolic in the compiled
    graph and Numba specialises on array types, not shapes, so one compilation serves all d.
    """

    def __init__(self, mode: str = DEFAULT_MODE):
        import pytensor
        import pytensor.tensor as pt
        from pytensor.graph.replace import graph_replace

        t0 = time.perf_counter()
        self.mode = mode
        model, data = build_model(None)
        self.model = model
        value_vars = model.value_vars
        self.names = [v.name for v in value_vars]
        if self.names != ["lam_log__", "lam0_log__", "beta"]:  # pragma: no cover - PyMC change
            raise RuntimeError(f"unexpected value variables {self.names}")

        # The model's joint log density, rewritten in terms of one flat vector z and explicit
        # data inputs instead of the shared pm.Data containers.
        z = pt.dvector("z")
        in_xtx, in_xty = pt.dmatrix("xtx"), pt.dvector("xty")
        in_yty, in_n = pt.dscalar("yty"), pt.dscalar("n")
        repl = dict(zip(value_vars, (z[0], z[1], z[2:])))
        repl.update({data["xtx"]: in_xtx, data["xty"]: in_xty, data["yty"]: in_yty, data["n"]: in_n})
        logp = graph_replace(model.logp(jacobian=True), repl, strict=False)

        eps_seq = pt.dmatrix("eps")        # (steps, size) standard normal noise
        lr = pt.dscalar("lr")
        mu0, rho0 = pt.dvector("mu0"), pt.dvector("rho0")
        mm0, vm0, mr0, vr0 = (pt.dvector(n) for n in ("m_mu0", "v_mu0", "m_rho0", "v_rho0"))
        t_in = pt.dscalar("t0")

        def step(eps_t, t, mu, rho, m_mu, v_mu, m_rho, v_rho, lr_):
            sd = pt.softplus(rho)
            zt = mu + sd * eps_t
            lp = pytensor.clone_replace(logp, {z: zt})
            # One-sample negative ELBO; the Gaussian entropy is exact.
            loss = -(lp + pt.sum(pt.log(sd)) + 0.5 * zt.shape[0] * (1.0 + np.log(2.0 * np.pi)))
            g_mu, g_rho = pytensor.grad(loss, [mu, rho])
            t1 = t + 1.0
            m_mu1 = _BETA1 * m_mu + (1 - _BETA1) * g_mu
            v_mu1 = _BETA2 * v_mu + (1 - _BETA2) * g_mu ** 2
            m_rho1 = _BETA1 * m_rho + (1 - _BETA1) * g_rho
            v_rho1 = _BETA2 * v_rho + (1 - _BETA2) * g_rho ** 2
            a = lr_ * pt.sqrt(1 - _BETA2 ** t1) / (1 - _BETA1 ** t1)
            mu1 = mu - a * m_mu1 / (pt.sqrt(v_mu1) + _ADAM_EPS)
            rho1 = rho - a * m_rho1 / (pt.sqrt(v_rho1) + _ADAM_EPS)
            return t1, mu1, rho1, m_mu1, v_mu1, m_rho1, v_rho1, loss, g_mu, g_rho

        outs, _ = pytensor.scan(
            step, sequences=[eps_seq],
            outputs_info=[t_in, mu0, rho0, mm0, vm0, mr0, vr0, None, None, None],
            non_sequences=[lr], strict=False)
        t_out, mu_s, rho_s, mm_s, vm_s, mr_s, vr_s, loss_s, gmu_s, grho_s = outs
        outputs = [t_out[-1], mu_s[-1], rho_s[-1], mm_s[-1], vm_s[-1], mr_s[-1], vr_s[-1],
                   loss_s, mu_s.mean(axis=0), rho_s.mean(axis=0),
                   gmu_s.mean(axis=0), grho_s.mean(axis=0),
                   (gmu_s ** 2).mean(axis=0), (grho_s ** 2).mean(axis=0)]
        inputs = [eps_seq, t_in, mu0, rho0, mm0, vm0, mr0, vr0, lr,
                  in_xtx, in_xty, in_yty, in_n]
        self._lock = threading.Lock()
        # Numba compiles lazily on the first call: make that call now, on harmless dummy
        # inputs, so that construction is the whole cold cost and every fit is warm.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self._fn = pytensor.function(inputs, outputs, mode=mode)
                self._warm_up()
            except Exception as exc:  # pragma: no cover - backend missing or broken
                if mode == "FAST_RUN":
                    raise
                log.warning("ADVI: mode %s unavailable (%s); using the C backend", mode, exc)
                self.mode = "FAST_RUN"
                self._fn = pytensor.function(inputs, outputs, mode="FAST_RUN")
                self._warm_up()
        self.compile_seconds = time.perf_counter() - t0

    def run(self, state: AdviState, eps: np.ndarray, lr: float, stats) -> tuple[AdviState, np.ndarray, "ChunkSummary"]:
        """Run ``len(eps)`` Adam steps from ``state`` on ``stats``.

        Returns ``(new_state, losses, summary)``: the per-step one-sample negative ELBO and
        the averages over the chunk of the iterates (for Polyak-Ruppert averaging) and of the
        stochastic gradients and their squares (for the stationarity test).
        """
        size = stats.dim + 2
        eps = np.asarray(eps, dtype=np.float64)
        if eps.ndim != 2 or eps.shape[1] != size or eps.shape[0] < 1:
            raise ValueError(f"eps must have shape (steps, {size})")
        if state.mu.shape != (size,):
            raise ValueError(f"state has size {state.mu.shape}, statistics need {size}")
        return self._call(eps, state, lr, stats.xtx, stats.xty, stats.yty, stats.n)

    def _call(self, eps, state, lr, xtx, xty, yty, n):
        # Fresh writable C-contiguous float64 arrays: Numba types read-only arrays (as in
        # Statistics) differently and would compile a second specialisation.
        arr = lambda a: np.array(a, dtype=np.float64, order="C", copy=True)  # noqa: E731
        args = (arr(eps), np.float64(state.t), arr(state.mu), arr(state.rho), arr(state.m_mu),
                arr(state.v_mu), arr(state.m_rho), arr(state.v_rho), np.float64(lr), arr(xtx),
                arr(xty), np.float64(yty), np.float64(n))
        with self._lock:  # a compiled pytensor function is not re-entrant
            out = self._fn(*args)
        t, mu, rho, m_mu, v_mu, m_rho, v_rho, losses, *rest = (np.array(o) for o in out)
        return (AdviState(mu, rho, m_mu, v_mu, m_rho, v_rho, float(t)), losses,
                ChunkSummary(eps.shape[0], *rest))


    def _warm_up(self) -> None:
        z0 = np.zeros(3)
        self._call(np.zeros((1, 3)), AdviState.start(z0, z0), 1e-3, np.eye(1), np.zeros(1),
                   1.0, 1.0)

    @staticmethod
    def slices(d: int) -> dict[str, slice]:
        """Where each value variable sits in the flat vector of length d + 2."""
        return {"lam_log__": slice(0, 1), "lam0_log__": slice(1, 2), "beta": slice(2, 2 + d)}


_CACHE: dict[str, AdviEngine] = {}
_CACHE_LOCK = threading.Lock()


def get_advi_engine(mode: str = DEFAULT_MODE) -> tuple[AdviEngine, bool]:
    """The cached engine for ``mode`` (compiled on first use); returns (engine, was_cached).

    One engine serves every dimension (see ``AdviEngine``)."""
    key = str(mode)
    with _CACHE_LOCK:
        eng = _CACHE.get(key)
        if eng is not None:
            return eng, True
        eng = AdviEngine(mode)
        _CACHE[key] = eng
        return eng, False


def clear_cache() -> None:
    """Forget every compiled engine (the next fit of each d compiles again)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def build_noise_aware_model(inp):
    """The noise-aware model of ``posterior.noise_aware`` in PyMC (the definition NUTS
    samples; the fast path's density equals its marginal over lambda0 up to a constant).

    ``inp`` is a ``NoiseAwareInputs``; its values enter as constants (one model per fit, for
    the reference sampler only). Value variables: ``lam_log__``, ``lam0_log__``, ``beta``.
    With the Wishart-shaped design (``inp.wishart``) the likelihood is written in its basis,
    at beta' = U^T beta (the prior of beta is isotropic), with per-entry design variances.
    """
    import pymc as pm
    import pytensor.tensor as pt

    from posterior.noise_aware import active_prior

    d = inp.dim
    with pm.Model() as model:
        lam, lam0 = precision_priors(active_prior())
        beta_x = pm.Normal("beta", mu=0.0, sigma=1.0 / pt.sqrt(lam0), shape=(d,))
        beta = beta_x
        if inp.wishart is not None:
            rot, inp = inp.wishart
            beta = pt.dot(pt.as_tensor(rot.T), beta_x)
        rho = 1.0 / lam
        rxx, abar = pt.as_tensor(inp.rxx), pt.as_tensor(inp.abar)
        s = pt.sum(beta ** 2)
        b2 = beta ** 2
        ab = pt.dot(abar, beta)
        rb = pt.dot(rxx, beta)
        r = pt.concatenate([inp.rxy - rb, pt.stack([inp.ryy - pt.dot(beta, rb) - inp.n * rho])])
        if np.ndim(inp.v_xx) == 0:
            c11 = (rho * abar + inp.v_xx * (pt.outer(beta, beta) - pt.diag(b2))
                   + pt.eye(d) * (inp.v_xy + inp.v_xx * s))
            c12 = 2 * rho * ab + inp.v_xx * beta * (2 * s - b2)
            c22 = (4 * rho * pt.dot(beta, ab) + 2 * inp.n * rho ** 2 + inp.v_yy
                   + inp.v_xx * (2 * s ** 2 - pt.sum(b2 ** 2)))
        else:
            # Per-entry design variances p (``noise_aware.design_error_terms``).
            p = pt.as_tensor(inp.v_xx)
            pdg = pt.as_tensor(np.diag(inp.v_xx))
            pb2 = pt.dot(p, b2)
            c11 = (rho * abar + p * pt.outer(beta, beta)
                   + pt.diag(inp.v_xy + pb2 - pdg * b2))
            c12 = 2 * rho * ab + beta * (2 * pb2 - pdg * b2)
            c22 = (4 * rho * pt.dot(beta, ab) + 2 * inp.n * rho ** 2 + inp.v_yy
                   + 2 * pt.dot(b2, pb2) - pt.sum(pdg * b2 ** 2))
        cov = pt.concatenate([pt.concatenate([c11, c12[:, None]], axis=1),
                              pt.concatenate([c12[None, :], pt.reshape(c22, (1, 1))], axis=1)],
                             axis=0)
        # The count's noise, one rank-one term (``NoiseAwareInputs.count_vector``).
        mc = pt.as_tensor(inp.mc if inp.mc is not None else np.zeros((d, d)))
        u1 = pt.dot(mc, beta)
        u = pt.concatenate([u1, pt.stack([pt.dot(beta, u1) + rho])])
        cov = cov + inp.v_n * pt.outer(u, u)
        pm.Potential("loglik", pm.logp(pm.MvNormal.dist(mu=pt.zeros(d + 1), cov=cov), r))
        if inp.pxx is not None:
            # The exact public statistics: their own likelihood (method.md section 1).
            pxx, pxy, pyy, pn = inp.public_parts()
            quad = pt.dot(beta, pt.dot(pt.as_tensor(pxx), beta)) - 2 * pt.dot(beta, pxy) + pyy
            pm.Potential("public_loglik", 0.5 * pn * (pt.log(lam) - np.log(2 * np.pi))
                         - 0.5 * lam * quad)
    return model
