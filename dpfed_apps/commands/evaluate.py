"""dpfed evaluate: the paper's experiment (Honkela et al. 2018, section 4.5) on bundled GDSC data."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from dpfed import exitcodes, jsonsafe

EPILOG = """\
examples:
  dpfed evaluate --quick --out results/quick
      3 drugs (1047, 1036, 1373), 3 repeats, private n in {0, 100, 400}, every method, eps 1 and 2, K 1/3/10
      (a few minutes on 2 cores); writes results.csv, summary.md, spearman_eps*.png
  dpfed evaluate --out results/full
      the full protocol: 262 drugs x 50 repeats x n in {0,...,800} x eps {1,2}, all methods
  dpfed evaluate --drug 1047 --drug 1373 --repeats 10 --methods robust_private,nonprivate --json
  dpfed evaluate --executor dask --workers 8      (dask.distributed LocalCluster; dpfed[evaluate])
  dpfed evaluate --out results/full --resume
      after a stop (Ctrl-C, reboot): every finished task is in results/full/tasks.jsonl;
      only the rest runs (the settings must be the same)

Progress (tasks done/total, rate, ETA) goes to stderr. --json prints one object:
  {"results": [{"method", "epsilon", "n_private", "sites", "aggregation", "spearman_mean",
                "spearman_sd", "drugs", "repeats"}, ...], "wall_s": ..., "out": ...}
--aggregation independent,secure (default: both): robust_private with K >= 2 sites as K
  independent releases (K noise draws) and as a secure aggregate (one distributed draw, T = K);
  K = 1 is always independent.
exit codes: 0 ok, 1 every cell failed or internal error, 2 bad arguments,
            6 a needed extra (dask, matplotlib) is not installed, 130 interrupted
"""

# Drugs of --quick: ones with a known marker (data README) and enough lines for n = 400.
QUICK_DRUGS = (1047, 1036, 1373)  # Nutlin-3a (TP53), PLX4720 and Dabrafenib (BRAF)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _aggregations(text: str) -> tuple[str, ...]:
    from dpfed_apps.evaluation.protocol import AGGREGATIONS

    names = _names(text)
    bad = [v for v in names if v not in AGGREGATIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(AGGREGATIONS)}, got {text!r}")
    return names


class _Progress:
    """done/total, rate and ETA on stderr, at most every ``every_s`` seconds."""

    def __init__(self, enabled: bool = True, every_s: float = 2.0, already_done: int = 0):
        self.t0 = time.monotonic()
        self.last = 0.0
        self.enabled = enabled
        self.every_s = every_s
        self.already_done = already_done  # tasks read back from the journal (--resume)

    def __call__(self, done, total, result) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every_s and done < total):
            return
        self.last = now
        elapsed = now - self.t0
        rate = (done - self.already_done) / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"[evaluate] {done}/{total} tasks ({100 * done / total:.0f} %), "
              f"{rate * 60:.1f} tasks/min, elapsed {elapsed:.0f} s, ETA {eta:.0f} s",
              file=sys.stderr, flush=True)


def evaluate(args) -> int:
    # Hundreds of thousands of d ~ 10 fits: the compiled densities (2-3 ms a fit against
    # ~10-40 ms for the numpy default) repay their one-time Numba compile many times over.
    # Set before posterior is imported here and inherited by local worker processes; an
    # explicit DPFED_POSTERIOR_BACKEND wins, and the caller's environment is restored after.
    # Same model and algorithm either way (tests/test_noise_aware_jit.py).
    import os

    chosen = os.environ.get("DPFED_POSTERIOR_BACKEND")
    os.environ["DPFED_POSTERIOR_BACKEND"] = chosen or "numba"
    try:
        return _evaluate(args)
    finally:
        if chosen is None:
            os.environ.pop("DPFED_POSTERIOR_BACKEND", None)


def _evaluate(args) -> int:
    from dpfed_apps.cli import require

    require("scipy", "aggregator")
    require("opendp", "site")
    if args.executor == "dask":
        require("dask.distributed", "evaluate")
    from dpfed_apps.evaluation.executor import make_executor
    from dpfed_apps.evaluation.protocol import QUICK, ProtocolConfig, bounds_table, eligible_drugs
    from dpfed_apps.evaluation.runner import DEFAULT_METHODS, plan_tasks, run_grid

    t0 = time.monotonic()
    options = {}
    if args.quick:
        options.update(QUICK)
    if args.sizes:
        options["sizes"] = args.sizes
    if args.repeats:
        options["repeats"] = args.repeats
    options["epsilons"] = args.epsilons
    options["sites"] = args.sites
    options["aggregations"] = args.aggregation
    options["seed"] = args.seed
    options["neighbouring"] = args.neighbouring
    options["xtx_sensitivity"] = args.xtx_sensitivity
    try:
        config = ProtocolConfig(**options)
        methods = args.methods or DEFAULT_METHODS
        from dpfed_apps.evaluation.methods import get_method
        for name in methods:
            get_method(name)
    except ValueError as exc:
        print(f"dpfed evaluate: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    eligible = eligible_drugs(config.min_lines)
    if args.drug:
        unknown = [d for d in args.drug if d not in eligible]
        if unknown:
            print(f"dpfed evaluate: drug(s) {unknown} not in GDSC v17 or with fewer than "
                  f"{config.min_lines} measured lines", file=sys.stderr)
            return exitcodes.USAGE
        drugs = list(args.drug)
    else:
        if args.drugs is not None and args.drugs < 1:
            print("dpfed evaluate: --drugs must be >= 1", file=sys.stderr)
            return exitcodes.USAGE
        if args.quick and args.drugs is None:
            drugs = [d for d in QUICK_DRUGS if d in eligible]
        else:
            drugs = eligible[:args.drugs or len(eligible)]
    out = Path(args.out)
    say = (lambda m: print(f"[evaluate] {m}", file=sys.stderr, flush=True))
    d = len(config.features)
    say(f"{len(drugs)} drugs x {config.repeats} repeats, n {list(config.sizes)}, "
        f"eps {list(config.epsilons)}, K {list(config.sites)} "
        f"({'/'.join(config.aggregations)} for K >= 2), methods {', '.join(methods)}")
    # The Gaussian search serves every method but nonprivate (no bounds) and robust_private
    # under public-shaped bounds (chosen per repeat in the workers, dpfed_apps.evaluation.protocol).
    gaussian = [m for m in methods
                if m != "nonprivate" and not (m == "robust_private" and config.bounds == "public")]
    bounds = {}
    if gaussian:
        say("choosing bounds on synthetic data (cached in the output folder)")
        bounds = bounds_table(config, d, cache_dir=out / "bounds-cache")
    tasks = plan_tasks(drugs, config, methods, bounds, repeats_per_task=args.repeats_per_task,
                       cache_dir=out / "bounds-cache")
    from dpfed_apps.evaluation.checkpoint import JournalMismatch, TaskJournal, fingerprint

    journal = TaskJournal(out, fingerprint(config, methods, tasks))
    try:
        journal.open(resume=args.resume)
    except JournalMismatch as exc:
        print(f"dpfed evaluate: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    already = len(journal.done)  # the fingerprint holds the task list: all of them are ours
    say(f"{len(tasks)} tasks on {args.executor} executor"
        + (f" ({already} already done, read from {journal.path})" if args.resume else ""))
    executor = make_executor(args.executor, args.workers,
                             **({"address": args.dask_address} if args.dask_address else {}))
    with journal, executor:
        rows = run_grid(tasks, executor,
                        _Progress(enabled=not args.no_progress, already_done=already),
                        journal=journal)
    wall_s = time.monotonic() - t0
    require("matplotlib", "all")
    from dpfed_apps.evaluation.report import write_report

    command = "dpfed evaluate " + " ".join(shlex.quote(a) for a in (args.argv or []))
    summary = write_report(rows, out, wall_s=wall_s, command=command)
    if args.json:
        keys = ("method", "epsilon", "n_private", "sites", "aggregation", "spearman_mean",
                "spearman_sd", "drugs", "repeats")
        results = [{k: (None if isinstance(s[k], float) and s[k] != s[k] else s[k]) for k in keys}
                   for s in summary]
        print(jsonsafe.dumps({"results": results, "wall_s": wall_s, "out": str(out),
                          "cells": len(rows),
                          "errors": sum(1 for r in rows if r.get("error"))}))
    else:
        print((out / "summary.md").read_text())
        print(f"results in {out}/ (results.csv, summary.md, spearman_eps*.png); "
              f"wall {wall_s:.1f} s")
    defined = sum(1 for r in rows if r["spearman"] == r["spearman"])
    return exitcodes.OK if defined else exitcodes.ERROR


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="the paper's experiment on GDSC data",
                              description=__doc__.split(": ", 1)[1], epilog=EPILOG)
    p.add_argument("--quick", action="store_true",
                   help="a small grid: 3 known-marker drugs, 3 repeats, n in {0, 100, 400}")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--drugs", type=int, metavar="N",
                       help="the first N eligible drugs (file order; default: all 262)")
    which.add_argument("--drug", type=int, action="append", metavar="ID",
                       help="a GDSC drug id (repeatable), e.g. 1047")
    p.add_argument("--repeats", type=int, metavar="R", help="Monte Carlo repeats (default 50)")
    p.add_argument("--sizes", type=_ints, metavar="N,N,...",
                   help="private training sizes (default 0,100,...,800)")
    p.add_argument("--methods", type=_names, metavar="M,M,...",
                   help="comparison methods (default: all seven)")
    p.add_argument("--sites", type=_ints, default=(1, 3, 10), metavar="K,K,...",
                   help="site counts K for robust_private (default 1,3,10)")
    p.add_argument("--aggregation", type=_aggregations, default=("independent", "secure"),
                   metavar="A,A,...",
                   help="how robust_private combines K >= 2 sites: independent (K noise draws "
                        "on the sum), secure (secure aggregation, one distributed draw, T = K); "
                        "default both; K = 1 is always independent")
    p.add_argument("--epsilons", type=_floats, default=(1.0, 2.0), metavar="E,E,...",
                   help="privacy budgets per site (default 1,2)")
    p.add_argument("--neighbouring", choices=("add_remove", "replace_one"), default="add_remove",
                   help="neighbouring relation of the releases (default add_remove; "
                        "replace_one is the paper's, for comparison with its figures: eps "
                        "under add/remove implies 2 eps under replace-one)")
    p.add_argument("--xtx-sensitivity", choices=("exact", "paper"), default="exact",
                   help="Sxx sensitivity rule (default exact; paper: twice the noise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the splits and fits (default 0)")
    p.add_argument("--out", default="results/evaluate", help="output folder")
    p.add_argument("--executor", choices=("local", "dask", "serial"), default="local",
                   help="local process pool (default), dask LocalCluster, or serial")
    p.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    p.add_argument("--dask-address", help="an existing Dask scheduler (with --executor dask)")
    p.add_argument("--repeats-per-task", type=int, default=5,
                   help="repeats of one drug per task (default 5)")
    p.add_argument("--resume", action="store_true",
                   help="keep the tasks already finished in OUT/tasks.jsonl (a stopped run "
                        "with the same settings) and run only the rest")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_entry)


def _entry(args) -> int:
    args.argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "evaluate" else None
    if args.repeats is not None and args.repeats < 1:
        print("dpfed evaluate: --repeats must be >= 1", file=sys.stderr)
        return exitcodes.USAGE
    if args.workers is not None and args.workers < 1:
        print("dpfed evaluate: --workers must be >= 1", file=sys.stderr)
        return exitcodes.USAGE
    return evaluate(args)
