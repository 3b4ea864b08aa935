"""The fit of a joint round: one posterior per target from the summed joint release
(docs/protocol.md "Joint rounds"; method.md section 13).

For target j the fit sees ``dpfed.joint_targets.target_statistics(sum, j)`` (Sxx scaled to
the rows with response j under the missing-completely-at-random model, with the sampling
variance of that step added to its noise description; everything it uses is released or
public) plus the target's exact public statistics, and is the same call the single-target
round makes (aggregator.aggregate.fit -> posterior.fit_posterior with public=, x_bound=,
y_unit=y_bound, and the information statement against the public rows alone). Responses
are standardised per target, so every coefficient is in units of that target's public
y_scale (the summary gives y_mean and y_scale to convert back).

A target whose fit refuses or fails gets an entry saying so; the others are still reported
(the round is DONE if at least one target fitted: ``fit_joint`` raises otherwise). The
"auto" fit of a target has no NUTS fallback: where importance sampling and HMC refuse, the
single round falls back to NUTS (seconds to minutes), which for hundreds of targets would
hold the round for hours (a target whose noisy count n_j was clamped to 0 took > 4 minutes);
such a target is reported as refused instead.

From ``joint_prior.MIN_TARGETS`` targets on, every target's prior is centred at the
across-target mean m0 estimated from the release itself (``aggregator.joint_prior``: the
pooled fit, post-processing; an empirical-Bayes prior, docs/method.md section 13); each
entry carries m0 as ``prior_mean``. The information statement compares the shifted-back
draws with the public rows alone, as before.

Cost (docs/benchmarks.md "Fitting a joint round"): each target is fitted with at most
``JOINT_FIT_DRAWS`` posterior draws (the production default fit, fewer draws: its fixed cost
dominates), and at most ``result_draws`` of them are stored per target so that the result
of 262 targets stays well inside one gRPC message (16 MB; dpfed.transport). Many targets are
fitted in a process pool (``workers``): the fits are independent and CPU-bound.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from dpfed.intervals import credible_interval
from dpfed.jsonsafe import jsonable
from dpfed.v1 import dpfed_pb2 as pb

log = logging.getLogger(__name__)

# Posterior draws per target: the production fit (Laplace + importance sampling) with fewer
# draws than a single-target round's 5000 (its cost is mostly fixed; benchmarks).
JOINT_FIT_DRAWS = 500
# The stored draws of all targets together stay within this many bytes (m x draws x d x 8).
JOINT_RESULT_BYTES = 8 * 1024 * 1024
MIN_RESULT_DRAWS = 1   # m x d near the limits (1024 x 512) leaves room for a few draws only
# A process pool is used from this many targets on (below it, its start costs more).
POOL_MIN_TARGETS = 24
# Targets per task sent to a worker (fewer round trips; still balances the workers).
CHUNK = 8


class JointFitError(RuntimeError):
    """No target of a joint round could be fitted."""


def fit_draws(spec: pb.RoundSpec) -> int:
    """Posterior draws per target of a joint round's fit."""
    return int(min(spec.fit_draws or 5000, JOINT_FIT_DRAWS))


def result_draws(spec: pb.RoundSpec) -> int:
    """Draws stored per target (the first ones of each fit's draws)."""
    m, d = max(1, len(spec.targets)), max(1, len(spec.feature_names))
    return int(max(MIN_RESULT_DRAWS, min(fit_draws(spec), JOINT_RESULT_BYTES // (m * d * 8))))


def workers(m: int) -> int:
    """Processes fitting targets: DPFED_FIT_WORKERS if set (1 = in this process), else the
    CPUs (at most 4), and 1 below POOL_MIN_TARGETS targets."""
    env = os.environ.get("DPFED_FIT_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            log.warning("DPFED_FIT_WORKERS=%r is not an integer: fitting in one process", env)
            return 1
    if m < POOL_MIN_TARGETS:
        return 1
    return max(1, min(4, os.cpu_count() or 1))


def target_inputs(spec: pb.RoundSpec, private_sum) -> list[tuple]:
    """Per target j: (view_j + public_j, public_j) where view_j is what the fit of target j
    sees of the private sum (dpfed.joint_targets.target_statistics; the public second
    moments bound its sampling variance) and public_j the target's exact public statistics
    (None without public rows)."""
    from dpfed.joint_targets import target_statistics
    from dpfed.sensitivity import row_norm_bound

    from aggregator.joint_round import public_targets
    publics = public_targets(spec)
    norm = row_norm_bound(spec.preprocessing.normalize_rows)
    out = []
    for j, public in enumerate(publics):
        moments = (public.xtx / public.n) if public is not None and public.n >= 1 else None
        view = target_statistics(private_sum, j, x_bound=spec.x_bound, x_norm_bound=norm,
                                 second_moments=moments)
        out.append((view + public if public is not None else view, public))
    return out


def prior_mean(spec: pb.RoundSpec, private_sum, inputs: list[tuple]) -> np.ndarray | None:
    """The across-target prior mean m0 of a joint round (aggregator.joint_prior: the pooled
    fit of every target's view + public statistics; post-processing), or None: fewer than
    ``joint_prior.MIN_TARGETS`` targets, or a pooled fit that fails (logged; the targets are
    then fitted around 0 as before)."""
    from aggregator.joint_prior import MIN_TARGETS, pooled_mean

    if len(inputs) < MIN_TARGETS:
        return None
    try:
        return pooled_mean(private_sum, inputs, x_bound=spec.x_bound)
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
        log.warning("joint fit: no across-target prior mean (%s)", exc)
        return None


def _fit_one(j: int, total, public, method: str, draws: int, seed, x_bound: float,
             y_bound: float, keep: int, m0: np.ndarray | None = None):
    """(j, entry, kept draws or None): target j's posterior summary, or why it failed.
    ``m0``: the across-target prior mean (aggregator.joint_prior: the statistics are shifted
    by it and the draws shifted back), None for a prior centred at 0."""
    from posterior import PosteriorError, fit_method_options, fit_posterior

    from aggregator import aggregate
    from aggregator.joint_prior import shift
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        # aggregate.fit's call, without the NUTS fallback (module docstring).
        fit_total = total if m0 is None else shift(total, m0)
        fit_public = public if m0 is None or public is None else shift(public, m0)
        post = fit_posterior(fit_total, **fit_method_options(method), draws=draws, seed=seed,
                             public=fit_public, x_bound=x_bound, y_unit=y_bound, fallback=None)
        beta_mean = np.asarray(post.beta_mean, dtype=np.float64)
        beta_draws = np.asarray(post.beta_draws, dtype=np.float64)
        if m0 is not None:
            beta_mean, beta_draws = beta_mean + m0, beta_draws + m0
        diag = dict(post.diagnostics)
        diag["model"] = post.model
        diag["information"] = aggregate.information(beta_draws, public, total.dim, seed,
                                                    y_unit=y_bound,
                                                    min_reference_draws=draws)
    except (PosteriorError, ValueError, ArithmeticError) as exc:
        # Fit errors name the failed check, never a data value.
        return j, {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                   "fit_s": time.perf_counter() - t0,
                   "fit_cpu_s": time.process_time() - c0}, None
    ci = credible_interval(beta_draws, 0.9)
    entry = {
        "status": "fitted",
        "beta_mean": [float(b) for b in beta_mean],
        "beta_sd": [float(s) for s in beta_draws.std(axis=0)],
        "beta_ci90": [[float(lo), float(hi)] for lo, hi in ci],
        "model": diag.get("model", ""),
        "information": diag.get("information", {}),
        # The single round's diagnostics without the copy of "information" (above): 265
        # targets' summary is ~1 MB beside ~8 MB of draws, in one 16 MB message.
        "diagnostics": {k: v for k, v in diag.items() if k != "information"},
        "fit_s": time.perf_counter() - t0,
        "fit_cpu_s": time.process_time() - c0,
    }
    return j, entry, np.ascontiguousarray(beta_draws[:keep], dtype=np.float64)


def _fit_chunk(tasks: list[tuple]) -> list[tuple]:
    """Fit several targets (a worker's task)."""
    return [_fit_one(*t) for t in tasks]


def _init_worker() -> None:
    """A pool worker: one BLAS thread (the workers are the parallelism; threadpoolctl is a
    base dependency)."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=1)


_pool_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_pool_size = 0


def _executor(n: int) -> ProcessPoolExecutor:
    """The module's process pool of ``n`` workers (kept between rounds: a worker starts in
    about a second). forkserver: a fork of the aggregator itself would copy its gRPC and
    store threads' locks; the fork server is a fresh process that imports the fit once."""
    global _pool, _pool_size
    import multiprocessing
    with _pool_lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["aggregator.joint_fit", "posterior.fit",
                                        "aggregator.aggregate"])
            _pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init_worker)
            _pool_size = n
        return _pool


def prestart(m: int) -> None:
    """Start the pool's workers for a joint round of ``m`` targets now, on a daemon thread
    (called when such a round starts: the fork server imports the fit and the workers start
    during the consent and release phases, not in FITTING; 18-24 s at load 6-8, ~1-2 s on an
    idle machine). Nothing when the round would be fitted in this process."""
    n = workers(m)
    if n <= 1:
        return

    def start() -> None:
        try:
            pool = _executor(n)
            list(pool.map(abs, range(n)))
        except Exception as exc:  # noqa: BLE001 - the fit falls back to this process
            log.warning("joint fit: the process pool did not start (%s)", exc)

    threading.Thread(target=start, name="joint-fit-pool", daemon=True).start()


def shutdown_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None


atexit.register(shutdown_pool)


def _run(tasks: list[tuple], n_workers: int) -> list[tuple]:
    if n_workers <= 1 or len(tasks) < 2:
        return _fit_chunk(tasks)
    chunks = [tasks[i:i + CHUNK] for i in range(0, len(tasks), CHUNK)]
    try:
        pool = _executor(n_workers)
        return [r for rs in pool.map(_fit_chunk, chunks) for r in rs]
    except (BrokenProcessPool, OSError) as exc:
        log.warning("joint fit: the process pool failed (%s); fitting in this process", exc)
        shutdown_pool()
        return _fit_chunk(tasks)


def fit_joint(spec: pb.RoundSpec, private_sum, *, skip_fit: bool = False,
              n_workers: int | None = None) -> tuple[list[dict], np.ndarray, int]:
    """(per-target entries in spec order, stored draws (m * keep x d; NaN blocks for targets
    that did not fit), keep) of a joint round whose releases sum to ``private_sum`` (a
    JointStatistics carrying the sum's noise). Raises JointFitError if no target fitted."""
    m, d = len(spec.targets), len(spec.feature_names)
    keep = result_draws(spec)
    inputs = target_inputs(spec, private_sum)
    base = [{"target": t.name, "y_mean": t.y_mean, "y_scale": t.y_scale,
             "n": int(total.n - (public.n if public is not None else 0)),
             "n_public": int(public.n) if public is not None else 0,
             "noise": total.noise.summary() if total.noise is not None else "unknown"}
            for t, (total, public) in zip(spec.targets, inputs)]
    draws = np.full((m, keep, d), np.nan)
    if skip_fit:
        return [{**b, "status": "skipped"} for b in base], draws.reshape(m * keep, d), keep
    seed = spec.fit_seed or None
    m0 = prior_mean(spec, private_sum, inputs)
    if m0 is not None:
        base = [{**b, "prior_mean": [float(v) for v in m0]} for b in base]
    tasks = [(j, total, public, spec.fit_method, fit_draws(spec),
              None if seed is None else seed + j, spec.x_bound, spec.y_bound, keep, m0)
             for j, (total, public) in enumerate(inputs)]
    results = _run(tasks, workers(m) if n_workers is None else n_workers)
    entries = list(base)
    for j, entry, kept in results:
        entries[j] = jsonable({**base[j], **entry})
        if kept is not None:
            draws[j, :len(kept)] = kept
    if not any(e.get("status") == "fitted" for e in entries):
        reasons = sorted({e.get("error", "?") for e in entries})
        raise JointFitError(f"no target of the {m} could be fitted: " + "; ".join(reasons[:3]))
    return entries, draws.reshape(m * keep, d), keep
