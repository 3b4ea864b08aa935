"""Running the evaluation grid: tasks of (drug, a few repeats), rows of Spearman results.

One *task* is one drug and a chunk of its repeats (``plan_tasks``); ``run_task`` is a pure
function of the task (plus OpenDP's unseeded DP noise) that returns one row per
(drug, repeat, method, epsilon, n_private, sites, aggregation) cell:

    drug, repeat, method, epsilon, n_private, sites, neighbouring, spearman, converged, error,
    aggregation, noise_threshold, fit

``epsilon`` is None for ``nonprivate`` (it does not depend on eps); ``sites`` is K for
``robust_private`` and 1 for everything else. ``aggregation`` is "secure" for robust_private's
secure-aggregation rows (K >= 2, issue 10; ``noise_threshold`` T = K, every site honest, so the
sum carries one noise draw) and "independent" for every other row (K independent releases;
K = 1 and the single-site methods are always independent; ``noise_threshold`` empty).
``fit`` says which posterior fit ran ("laplace", or "nuts (after laplace refused)": the fast
path refused and the reference sampler took over). ``converged`` is the ADVI convergence flag
of the cell's Gamma-prior fit (None for methods that do not end in one); ``error`` is the
message of a method that raised on this cell (its spearman is NaN): one failing cell does not
end an
hour-long run, and the report counts them.

Every method is called through ``method.fit``. The methods that end in the Gamma-prior
posterior (robust_private for every K, nonprivate, nonprivate_robust, private_unclipped) fit
it with ``posterior.fit_posterior``, the aggregator's own code: noise-aware on releases,
exact on exact statistics (method.md sections 1 and 8). ``converged`` is True for them (a fit
that does not converge raises, and the cell gets an ``error``) and None for the others.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from dpfed.statistics import Statistics, exact_statistics
from dpfed_apps.evaluation.protocol import (ProtocolConfig, RepeatData, bounds_size, federations,
                                            table_cell, load_problem, prepare_repeat, site_size)
from dpfed.metrics import TestRanks

__all__ = ["Task", "TaskResult", "ROW_FIELDS", "plan_tasks", "run_task", "run_grid",
           "DEFAULT_METHODS"]

ROW_FIELDS = ("drug", "repeat", "method", "epsilon", "n_private", "sites", "neighbouring",
              "spearman",
              "converged", "error", "aggregation", "noise_threshold", "fit")

DEFAULT_METHODS = ("robust_private", "nonprivate", "nonprivate_robust", "private_unclipped",
                   "output_perturbation", "functional_mechanism", "adassp")

# Methods whose statistics do not depend on eps or the bounds: fitted once per (repeat, n).
_EPS_FREE = ("nonprivate",)


@dataclass(frozen=True)
class Task:
    drug: int
    repeats: tuple[int, ...]
    config: ProtocolConfig
    methods: tuple[str, ...]
    bounds: dict  # (n_site, eps) -> (omega_x, omega_y), from protocol.bounds_table
    # Where robust_private's per-repeat public-shaped bounds are cached (config.bounds ==
    # "public"; protocol.repeat_bounds), or None (computed, not stored).
    cache_dir: str | None = None


@dataclass
class TaskResult:
    drug: int
    repeats: tuple[int, ...]
    rows: list[dict]
    seconds: float
    fits: int = 0
    fit_seconds: float = 0.0
    timings: dict = field(default_factory=dict)


def plan_tasks(drugs: Sequence[int], config: ProtocolConfig, methods: Sequence[str],
               bounds: dict, repeats_per_task: int = 5, cache_dir=None) -> list[Task]:
    """Tasks of ``repeats_per_task`` repeats of one drug (more per task: bigger ADVI batches,
    coarser progress and load balance). ``cache_dir``: where the per-repeat public-shaped
    bounds are cached (the output folder's bounds-cache)."""
    tasks = []
    for drug in drugs:
        for start in range(0, config.repeats, repeats_per_task):
            reps = tuple(range(start, min(config.repeats, start + repeats_per_task)))
            tasks.append(Task(int(drug), reps, config, tuple(methods), dict(bounds),
                              None if cache_dir is None else str(cache_dir)))
    return tasks


def _row(data: RepeatData, method: str, eps, n: int, k: int, neighbouring: str,
         aggregation: str = "independent", **kw) -> dict:
    row = dict(drug=data.drug, repeat=data.repeat, method=method,
               epsilon=None if eps is None else float(eps), n_private=int(n), sites=int(k),
               neighbouring=neighbouring, spearman=float("nan"), converged=None,
               error=None, aggregation=aggregation,
               noise_threshold=int(k) if aggregation == "secure" else None, fit=None)
    row.update(kw)
    return row


def run_task(task: Task) -> TaskResult:
    """Every cell of ``task`` (module docstring)."""
    from dpfed_apps.evaluation.methods import get_method
    from dpfed_apps.evaluation.methods.base import PrivacySetting, TrainingData
    from dpfed_apps.evaluation.methods.posterior_fit import FIT_LOG, posterior_beta
    from dpfed_apps.evaluation.protocol import repeat_bounds
    from dpfed.sensitivity import row_norm_bound

    t0 = time.perf_counter()
    cfg = task.config
    problem = load_problem(task.drug, cfg)
    methods = {name: get_method(name) for name in task.methods}
    rows: list[dict] = []
    timings: dict[str, float] = {}
    fits, fit_s = 0, 0.0

    def timed(name, fn, *args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t

    for rep in task.repeats:
        data = prepare_repeat(problem, cfg, task.drug, rep)
        scorer = TestRanks(data.y_test)  # y_test ranked once per repeat
        # robust_private's bounds, split and ridge for every (n, K, eps) of this repeat, from
        # its public lines only (protocol.repeat_bounds); the other methods use task.bounds.
        public_table = {}
        if cfg.bounds == "public" and "robust_private" in methods:
            public_table = timed("_bounds", repeat_bounds, data, cfg, cache_dir=task.cache_dir)
        seed_seq = np.random.SeedSequence([cfg.seed, task.drug, rep, 1])
        fit_seeds = iter(seed_seq.generate_state(10_000))
        # n = 0: public only, the same Gamma-prior posterior of the public lines for every
        # method (no private data: nothing to protect), fitted once, reported for each.
        if 0 in cfg.sizes:
            row = _row(data, "_public_only", None, 0, 1, cfg.neighbouring)
            try:
                t_fit = time.perf_counter()
                beta = timed("_public_only", posterior_beta,
                             exact_statistics(data.x_public, data.y_public),
                             posterior="laplace", draws=1000, seed=int(next(fit_seeds)))
                fits += 1
                fit_s += time.perf_counter() - t_fit
                row["spearman"] = scorer.spearman(data.x_test @ beta)
                row["converged"] = True
            except Exception as exc:  # one failing cell must not end the run
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.extend(_public_only_rows(row, task.methods, cfg))
        for n in cfg.sizes:
            if n == 0 or n > data.pool_size:
                continue
            training = TrainingData(data.x_pool[:n], data.y_pool[:n], data.x_public, data.y_public)
            for i_eps, eps in enumerate(cfg.epsilons):
                for name, method in methods.items():
                    if name in _EPS_FREE and i_eps > 0:
                        continue
                    for k, agg in federations(cfg, name):
                        m = site_size(n, k)
                        key = (bounds_size(n, k, agg), float(eps))
                        row = _row(data, name, None if name in _EPS_FREE else eps, n, k,
                                   cfg.neighbouring, agg)
                        if name == "robust_private" and cfg.bounds == "public":
                            choice = public_table.get(table_cell(n, k, agg) + (float(eps),))
                            if m < 2 or choice is None:
                                continue
                            setting = PrivacySetting(
                                eps, choice.omega_x * data.sigma_x,
                                choice.omega_y * data.sigma_y,
                                budget_split=choice.budget_split, n_sites=k,
                                y_range=data.y_range, neighbouring=cfg.neighbouring,
                                xtx_sensitivity=cfg.xtx_sensitivity, aggregation=agg,
                                x_norm_bound=row_norm_bound(data.preprocessing.normalize_rows))
                        else:
                            if m < 2 or (key not in task.bounds and name not in _EPS_FREE):
                                continue  # fewer than 2 rows per site: no release to make
                            # nonprivate ignores the bounds (it clips nothing).
                            om_x, om_y = task.bounds.get(key, (1.0, 1.0))
                            setting = PrivacySetting(eps, om_x * data.sigma_x,
                                                     om_y * data.sigma_y,
                                                     budget_split=cfg.budget_split, n_sites=k,
                                                     y_range=data.y_range,
                                                     neighbouring=cfg.neighbouring,
                                                     xtx_sensitivity=cfg.xtx_sensitivity,
                                                     aggregation=agg)
                        try:
                            t_fit = time.perf_counter()
                            log = []
                            token = FIT_LOG.set(log)
                            try:
                                beta = timed(name, method.fit, training, setting,
                                             seed=int(next(fit_seeds)))
                            finally:
                                FIT_LOG.reset(token)
                            row["fit"] = "; ".join(log) or None
                            if getattr(method, "posterior", None) is not None:
                                fits += 1
                                fit_s += time.perf_counter() - t_fit
                                row["converged"] = True
                            row["spearman"] = scorer.spearman(data.x_test @ np.asarray(beta))
                        except Exception as exc:  # one failing cell must not end the run
                            row["error"] = f"{type(exc).__name__}: {exc}"
                        rows.append(row)
    return TaskResult(task.drug, task.repeats, rows, time.perf_counter() - t0, fits, fit_s,
                      timings)


def _public_only_rows(row: dict, methods: Sequence[str], cfg: ProtocolConfig) -> list[dict]:
    out = []
    for name in methods:
        epsilons = (None,) if name in _EPS_FREE else cfg.epsilons
        for eps in epsilons:
            for k, agg in federations(cfg, name):
                out.append({**row, "method": name,
                            "epsilon": None if eps is None else float(eps), "sites": int(k),
                            "aggregation": agg,
                            "noise_threshold": int(k) if agg == "secure" else None})
    return out


Progress = Callable[[int, int, TaskResult], None]


def run_grid(tasks: Sequence[Task], executor, progress: Progress | None = None,
             journal=None) -> list[dict]:
    """Run every task on ``executor`` (``dpfed_apps.evaluation.executor``); rows in completion
    order.

    ``journal`` (``dpfed_apps.evaluation.checkpoint.TaskJournal``, opened): tasks it already holds
    are not run again (their rows come first), and every finished task is recorded in it before
    the next result is taken, so a stopped run loses at most the tasks in flight."""
    rows: list[dict] = []
    total = len(tasks)
    todo = list(tasks)
    if journal is not None:
        from dpfed_apps.evaluation.checkpoint import task_key

        todo = [t for t in tasks if task_key(t.drug, t.repeats) not in journal.done]
        wanted = {task_key(t.drug, t.repeats) for t in tasks}
        for key, saved in journal.done.items():
            if key in wanted:
                rows.extend(saved)
    skipped = total - len(todo)
    for done, result in enumerate(executor.map_unordered(run_task, todo), start=skipped + 1):
        if journal is not None:
            journal.record(result.drug, result.repeats, result.rows)
        rows.extend(result.rows)
        if progress is not None:
            progress(done, total, result)
    return rows
