"""The whole simulation: split, public bounds, one federated round, scores against baselines."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from dpfed_apps.simulation.federation import (COORDINATOR_ID, FederationFailed, FederationLayout,
                                              LocalFederation, Progress, _stderr_progress,
                                              free_port, round_config, to_toml, write_aggregator,
                                              write_federation)
from dpfed.preprocess import public_sigmas
from dpfed_apps.simulation.problem import (Problem, csv_problem, gdsc_problem, site_ids,
                                           split_incomplete, split_rows)
from dpfed_apps.simulation.public import public_preprocessing, round_choice
from dpfed_apps.simulation.scoring import (baseline_models, feature_table, model_from_result,
                                      test_spearman)

DEFAULT_SITES = 3
DEFAULT_EPSILON = 2.0
DEFAULT_PUBLIC = 10
DEFAULT_TEST = 100


@dataclass(frozen=True)
class SimulationOptions:
    n_sites: int = DEFAULT_SITES
    epsilon: float = DEFAULT_EPSILON
    drug: int = 1047
    features: tuple[str, ...] | None = None
    data: Path | None = None          # CSV instead of GDSC
    id_column: str | None = None
    target: str | None = None
    n_public: int = DEFAULT_PUBLIC
    n_test: int = DEFAULT_TEST
    seed: int = 0
    fit_method: str = "auto"
    fit_draws: int = 5000
    workdir: Path | None = None       # kept if given; a temporary folder otherwise
    round_timeout_s: float = 600.0
    startup_timeout_s: float = 60.0
    log_level: str = "INFO"
    # "secure" or "independent"; None: secure for 2 sites or more, independent for one.
    aggregation: str | None = None
    # Secure only: sites that stop right after key agreement (before releasing anything).
    dropouts: int = 0


# A secure round with dropouts waits for them until its release step's deadline: a short
# round deadline keeps the simulation quick (docs/protocol.md, "Secure rounds").
DROPOUT_DEADLINE_S = 20


def secure_plan(n_sites: int, dropouts: int) -> tuple[int, list[int]]:
    """(T, indices of the sites that drop out) for a secure simulation: T = the sites that
    release, K - N, so their shares make exactly one noise draw; the last N sites drop.
    ValueError when N sites cannot drop: the Shamir threshold t of K sites needs K - N >= t."""
    from dpfed.secagg.graph import choose_graph_parameters
    if n_sites < 2:
        raise ValueError("secure aggregation needs at least 2 sites (--aggregation independent "
                         "for one)")
    t = choose_graph_parameters(n_sites).threshold
    if not 0 <= dropouts <= n_sites - t:
        raise ValueError(f"--dropouts {dropouts}: with {n_sites} sites the key-share threshold "
                         f"is t = {t}, so at most {n_sites - t} site(s) may drop out after key "
                         f"agreement")
    return n_sites - dropouts, list(range(n_sites - dropouts, n_sites))


def load_problem(options: SimulationOptions) -> Problem:
    if options.data is not None:
        return csv_problem(options.data, id_column=options.id_column, target=options.target,
                           feature_names=options.features, keep_incomplete=True)
    return gdsc_problem(options.drug, options.features)


def site_left_out(layout: FederationLayout, site: str, problem: Problem) -> dict:
    """The rows of ``site``'s data file that its row-wise rules leave out of the round, by
    reason and column (site_node.gaps, the code ``dpfed site check`` runs). The simulating
    researcher holds every site's file: this is local information, printed in the report;
    a real site never sends it (docs/method.md, "Which rows are used")."""
    from site_node.config import DataConfig
    from site_node.gaps import file_audit

    audit = file_audit(DataConfig(path=layout.site_csv(site), format="csv",
                                  id_column=problem.id_column),
                       target=problem.target, features=list(problem.feature_names),
                       name_columns=True)
    return {"rows_in_file": audit["rows"], "usable_rows": audit["usable_rows"],
            "rows": audit["left_out_rows"], "reasons": audit["left_out"]}


def _import_coordinator():
    try:
        from coordinator.client import Coordinator
        from coordinator.roundspec import build_round_spec
    except ModuleNotFoundError as exc:
        raise FederationFailed(f"the coordinator package is not available ({exc})") from None
    return Coordinator, build_round_spec


def warm_up_fits() -> None:
    """Import what the baselines' fit needs (posterior and SciPy; with the Numba backend also
    its compiled code) on a background thread. A failure only means the baselines do it
    themselves, as before."""
    import importlib

    # What the default fit imports when it runs (posterior.fit imports them lazily).
    for name in ("posterior", "posterior.noise_aware", "posterior.hmc", "posterior.laplace",
                 "posterior.quality"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the fit reports its own errors
            pass
    # Compiled code only when the fit uses it (DPFED_POSTERIOR_BACKEND=numba; the default
    # numpy backend has none, and then no Numba is loaded and no cache written).
    try:
        from posterior import targets
        if getattr(targets, "LAPLACE_BACKEND", "numpy") == "numba":
            from posterior import noise_aware_jit
            noise_aware_jit.warm_up()
    except Exception:  # noqa: BLE001
        pass


@dataclass(frozen=True)
class _Data:
    """The data set as the simulation splits it (``_write_sites``)."""

    problem: Problem
    split: object               # problem.Split
    prep: object                # the public pre-processing
    sigmas: tuple[float, float]
    names: list[str]            # the site ids


@dataclass(frozen=True)
class _Plan:
    """The round chosen from public inputs only (``_plan_round``)."""

    draws: int                  # noise draws the bounds were chosen for
    choice: dict                # dpfed_apps.simulation.public.round_choice
    forecast: dict              # dpfed_apps.forecast.forecast_round
    config: dict                # round.toml


def _write_sites(options: SimulationOptions, layout: FederationLayout, port: int,
                 progress: Progress) -> _Data:
    """The data set, its split and the public pre-processing; then each site's data file and
    site.toml and the public lines' file: what the sites need before "go". Made while the
    aggregator and the sites start."""
    problem = load_problem(options)
    split = split_rows(problem.n, n_sites=options.n_sites, n_public=options.n_public,
                       n_test=options.n_test, seed=options.seed)
    prep = public_preprocessing(problem, split)
    sigmas = public_sigmas(problem.x[split.public], problem.y[split.public], prep)
    progress(f"{problem.label}: {problem.n} lines, d={problem.dim}; sites {split.site_sizes}, "
             f"{split.public.size} public, {split.test.size} test"
             + (f"; {len(problem.incomplete)} rows with gaps go to the sites, which leave them "
                f"out" if problem.incomplete else ""))
    gaps = split_incomplete(len(problem.incomplete), options.n_sites, options.seed)
    names = write_federation(layout, problem, split, port=port, epsilon=options.epsilon,
                             incomplete=gaps, aggregator_written=True)
    return _Data(problem, split, prep, sigmas, names)


def _plan_round(options: SimulationOptions, layout: FederationLayout, data: _Data,
                progress: Progress, *, aggregation: str, noise_threshold: int,
                dropping: list[str]) -> _Plan:
    """The bounds and budget split and the forecast, from public inputs only, and round.toml:
    made while the sites dial the aggregator (the round needs them only when it starts)."""
    problem, split, prep = data.problem, data.split, data.prep
    # One pair of bounds for every site, chosen for the total planned rows and the noise
    # draws their sum holds (one per site; one for a secure round).
    draws = 1 if aggregation == "secure" else len(split.site_sizes)
    progress(f"choosing bounds and split for sites {list(split.site_sizes)}, d={problem.dim}, "
             f"eps={options.epsilon} on auxiliary data shaped like the public lines")
    choice = round_choice(split.site_sizes, problem.dim, options.epsilon,
                          problem.x[split.public], problem.y[split.public], prep,
                          feature_names=problem.feature_names, seed=options.seed,
                          draws=draws)
    x_bound, y_bound = choice["x_bound"], choice["y_bound"]

    # What the round is expected to buy, from public inputs only (dpfed_apps.forecast), computed
    # before any budget is spent and shown beside the realised result.
    from dpfed_apps.forecast import forecast_round

    forecast = forecast_round(x_public=problem.x[split.public], y_public=problem.y[split.public],
                              feature_names=problem.feature_names, preprocessing=prep,
                              n_per_site=list(split.site_sizes), epsilons=[options.epsilon],
                              aggregation=aggregation,
                              bounds=(x_bound, y_bound), budget_split=choice["budget_split"],
                              ridge_c=choice["ridge_c"], seed=options.seed)
    expected = forecast["per_epsilon"][0]["gain"]
    progress(f"forecast gain over the public lines alone: {expected['mean']:+.3f} "
             f"(10-90 %: {expected['q10']:+.3f} to {expected['q90']:+.3f})")
    deadline_s = int(options.round_timeout_s)
    if dropping:
        deadline_s = min(deadline_s, DROPOUT_DEADLINE_S)
    config = round_config(problem, epsilon=options.epsilon, x_bound=x_bound, y_bound=y_bound,
                          quorum=len(data.names) - len(dropping), public_csv=layout.public_csv,
                          fit_method=options.fit_method, fit_draws=options.fit_draws,
                          fit_seed=options.seed, deadline_s=deadline_s,
                          aggregation=aggregation, noise_threshold=noise_threshold,
                          max_site_rows=int(max(split.site_sizes)),
                          budget_split=choice["budget_split"])
    layout.round_config.write_text(to_toml(config))
    return _Plan(draws, choice, forecast, config)


@contextlib.contextmanager
def _round_failure(federation: LocalFederation):
    """Any error inside is the round's failure: FederationFailed (gRPC errors, a coordinator
    bug included) with ``.workdir`` and the processes' last log lines (``.logs``)."""
    try:
        yield
    except FederationFailed as exc:
        exc.workdir = federation.layout.root
        exc.logs = federation.log_tails()
        raise
    except Exception as exc:  # gRPC errors, a coordinator bug: the round failed all the same
        failure = FederationFailed(f"{type(exc).__name__}: {exc}")
        failure.workdir = federation.layout.root
        failure.logs = federation.log_tails()
        raise failure from exc


def _plan_in_background(options: SimulationOptions, layout: FederationLayout, data: _Data,
                        progress: Progress, **round_kind) -> Future:
    """``_plan_round`` on a thread (its Future), and the baselines' fit code imported on
    another (``warm_up_fits``): the round needs the plan only once every site is connected,
    the baselines the fit code only after the round; this process mostly waits meanwhile."""
    threading.Thread(target=warm_up_fits, name="fit-warm-up", daemon=True).start()
    planning: Future = Future()

    def plan() -> None:
        try:
            planning.set_result(_plan_round(options, layout, data, progress, **round_kind))
        except BaseException as exc:  # noqa: BLE001 - re-raised by planning.result()
            planning.set_exception(exc)

    threading.Thread(target=plan, name="plan", daemon=True).start()
    return planning


def _run_round(options: SimulationOptions, federation: LocalFederation, data: _Data,
               plan: _Plan, progress: Progress, *, aggregation: str, noise_threshold: int,
               dropping: list[str], hold=None):
    """Connect as the coordinator once every site is, start the round and wait for it;
    (the sites' left-out rows, round_id, final status, RoundResult). FederationFailed if it
    did not end DONE."""
    layout, problem, config = federation.layout, data.problem, plan.config
    Coordinator, build_round_spec = _import_coordinator()
    coordinator = connected_coordinator(options, federation, Coordinator)
    spec = build_round_spec(config, base_dir=layout.root)
    progress(f"starting round: target {problem.target}, eps {options.epsilon} per site, "
             f"bounds x {config['x_bound']:.3g}, y {config['y_bound']:.3g}, fit "
             f"{options.fit_method}, {aggregation} aggregation"
             + (f" (T = {noise_threshold})" if aggregation == "secure" else "")
             + (f"; {', '.join(dropping)} stop after key agreement" if dropping else ""))
    status = coordinator.start_round(spec)
    round_id = status.round_id
    # What each site's row-wise rules leave out, counted here from the files this machine
    # wrote, with the sites' own code (local to the simulation, never on the wire), while the
    # round runs.
    left_out = {name: site_left_out(layout, name, problem) for name in data.names}
    # Polled every 50 ms (GetRound is a read): the round and fit take a few tenths.
    status = coordinator.wait(round_id, options.round_timeout_s, poll_s=0.05)
    result = round_result(coordinator, round_id, status, progress)
    if hold is not None:
        hold(federation, coordinator, round_id, plan.forecast)
    return left_out, round_id, status, result


def connected_coordinator(options: SimulationOptions, federation: LocalFederation,
                          Coordinator):
    """The coordinator's client (``Coordinator``: coordinator.client's class) with the
    federation's coordinator key and TLS identity, once every site is connected (a plain or a
    joint simulated round)."""
    from dpfed.wire.signing import SigningKey

    layout = federation.layout
    # site_keys, aggregator_key: the CA's record of the sites' and the aggregator's
    # identity keys, which a secure round's spec pins (never the aggregator's word).
    coordinator = Coordinator(federation.address,
                              SigningKey.load(layout.signing_key(COORDINATOR_ID)),
                              COORDINATOR_ID, layout.tls(COORDINATOR_ID),
                              site_keys=layout.site_keys,
                              aggregator_key=layout.aggregator_key)
    federation.wait_sites_connected(coordinator, options.startup_timeout_s)
    return coordinator


def round_result(coordinator, round_id: str, status, progress: Progress):
    """The RoundResult of round ``round_id``, whose final status is ``status`` (its round
    time and fit time go to ``progress``); FederationFailed if it did not end DONE."""
    from dpfed.v1 import dpfed_pb2 as pb

    if status.state != pb.RoundStatus.DONE:
        state = pb.RoundStatus.State.Name(status.state)
        raise FederationFailed(f"round {round_id} ended {state}: {status.message}")
    result = coordinator.result(round_id)
    progress(f"round {round_id} done in {status.round_seconds:.2f} s "
             f"(+ fit {status.fit_seconds:.1f} s)")
    return result


def _scores(options: SimulationOptions, data: _Data, result) -> tuple:
    """The round's model and the two baselines (non-private, public only) fitted here, and
    their held-out Spearman correlations: (summary, private model, baselines, baselines' fit
    seconds, metrics)."""
    problem, split, prep = data.problem, data.split, data.prep
    summary = json.loads(result.summary_json)
    private = model_from_result(result)
    t_fit = time.monotonic()
    baselines = baseline_models(problem, split, prep,
                                method=options.fit_method.removeprefix("plug-in-"),
                                draws=options.fit_draws, seed=options.seed)
    baseline_fit_s = time.monotonic() - t_fit
    metrics = {
        "spearman_private": test_spearman(private, problem, split, prep),
        "spearman_nonprivate": test_spearman(baselines["nonprivate"], problem, split, prep),
        "spearman_public_only": test_spearman(baselines["public_only"], problem, split, prep),
    }
    return summary, private, baselines, baseline_fit_s, metrics


def run_simulation(options: SimulationOptions, progress: Progress = _stderr_progress, *,
                   hold=None) -> dict:
    """Run the whole federation once; returns the result dict (see ``format_report``).
    ``hold(federation, coordinator, round_id, forecast)``, if given, is called once the round
    is done, with every process still running (``dpfed simulate --console`` serves until
    Ctrl-C there).

    Raises FederationFailed (with ``.workdir`` and ``.logs`` attributes) if a process or the
    round fails. The child processes are stopped on every exit path, Ctrl-C included.
    """
    t_start = time.monotonic()
    aggregation = options.aggregation or ("secure" if options.n_sites >= 2 else "independent")
    if options.dropouts and aggregation != "secure":
        raise ValueError("--dropouts needs --aggregation secure")
    noise_threshold, drop_index = (secure_plan(options.n_sites, options.dropouts)
                                   if aggregation == "secure" else (0, []))
    keep = options.workdir is not None
    root = Path(options.workdir) if keep else Path(tempfile.mkdtemp(prefix="dpfed-simulate-"))
    root.mkdir(parents=True, exist_ok=True)
    layout = FederationLayout(root.resolve())
    layout.make()
    port = free_port()
    names = site_ids(options.n_sites)
    dropping = [names[i] for i in drop_index]
    federation = LocalFederation(layout, names, port, progress, options.log_level)
    failed = False
    try:
        with federation:
            # The processes start first and import their modules (about 1 CPU-s each,
            # docs/benchmarks.md "Start") while the CA, the kits and aggregator.toml are
            # written; then the aggregator starts (it needs neither the data nor the bounds)
            # while the data is read and the sites' files written.
            federation.launch(stop_after_keys=dropping)
            write_aggregator(layout, names, port=port)
            federation.go_aggregator()
            data = _write_sites(options, layout, port, progress)
            # The bounds and the forecast while the aggregator finishes its start and the
            # sites dial; bad data raises here (ValueError: exit 2), before the round.
            planning = _plan_in_background(options, layout, data, progress,
                                           aggregation=aggregation,
                                           noise_threshold=noise_threshold, dropping=dropping)
            failed = True
            with _round_failure(federation):
                federation.ready(timeout_s=options.startup_timeout_s)
            failed = False
            plan = planning.result()
            failed = True
            with _round_failure(federation):
                left_out, round_id, status, result = _run_round(
                    options, federation, data, plan, progress, aggregation=aggregation,
                    noise_threshold=noise_threshold, dropping=dropping, hold=hold)
            failed = False
            # The round is over: the children stop now (SIGTERM; each flushes its state) while
            # this process fits the baselines; leaving the block waits for every one of them,
            # so the report is only printed once all have stopped.
            federation.terminate()
            progress(f"fitting baselines ({options.fit_method}) on exact statistics")
            scores = _scores(options, data, result)
    finally:
        # Kept when the round failed (its logs explain it) or the user named the folder;
        # removed after a round that worked and after bad options or data (nothing ran).
        if not keep and not failed:
            shutil.rmtree(layout.root, ignore_errors=True)
    problem, split, choice, forecast = data.problem, data.split, plan.choice, plan.forecast
    x_bound, y_bound, draws = choice["x_bound"], choice["y_bound"], plan.draws
    sigma_x, sigma_y = data.sigmas
    expected = forecast["per_epsilon"][0]["gain"]
    summary, private, baselines, baseline_fit_s, metrics = scores
    by_site = {c.site_id: c for c in status.contributions}
    secure = aggregation == "secure"
    return {
        "round_id": round_id,
        "data": problem.label,
        "target": problem.target,
        "features": list(problem.feature_names),
        # Secure: a site's n is never released on its own (it is inside the masked sum).
        # left_out: counted on this machine from the site's file (site_left_out), never sent.
        "sites": [{"site_id": n, "n": int(by_site[n].n) if n in by_site and not secure else None,
                   "n_planned": int(rows.size),
                   "epsilon": float(by_site[n].epsilon_spent) if n in by_site else 0.0,
                   "left_out": left_out[n]}
                  for n, rows in zip(names, split.sites)],
        "n_public": int(split.public.size),
        "n_test": int(split.test.size),
        "epsilon": float(options.epsilon),
        "bounds": {"x_bound": x_bound, "y_bound": y_bound, "sigma_x": sigma_x,
                   "sigma_y": sigma_y, "chosen_for_n": int(sum(split.site_sizes)),
                   "chosen_for_draws": int(draws),
                   "budget_split": [float(v) for v in choice["budget_split"]]},
        "fit_method": options.fit_method,
        "metrics": metrics,
        "timings": {"round_s": float(status.round_seconds), "fit_s": float(status.fit_seconds),
                    "baselines_s": baseline_fit_s, "total_s": time.monotonic() - t_start},
        # The round's phases (consent, release, fitting) and how long each took; sites that
        # consented but never released.
        # How the sites' statistics were combined; secure: T, and the sites that stopped after
        # key agreement (asked for) and that the round lists as dropped.
        "aggregation": aggregation,
        "noise_threshold": noise_threshold if secure else None,
        "dropouts": dropping,
        "phases": [{"phase": p.phase, "seconds": float(p.seconds)} for p in status.phases],
        "dropped": list(status.dropped),
        "n_total": summary.get("n_total"),
        "beta_mean": [float(v) for v in private.beta_mean],
        "top_features": feature_table(private, problem.feature_names),
        "nonprivate_beta_mean": [float(v) for v in baselines["nonprivate"].beta_mean],
        "diagnostics": summary.get("diagnostics", {}),
        "model": summary.get("model", ""),
        "noise": summary.get("noise", ""),
        "information": summary.get("information", {}),
        "forecast": {"gain": expected, "fit": forecast["fit"],
                     "spearman_public_only": forecast["per_epsilon"][0]["spearman_public_only"],
                     "spearman_private_public":
                         forecast["per_epsilon"][0]["spearman_private_public"]},
        "workdir": str(layout.root) if keep else None,
    }
