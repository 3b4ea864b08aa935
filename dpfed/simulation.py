"""A whole federation on one machine: an aggregator and K site nodes as separate processes.

``run_simulation`` splits a data set (by default the bundled GDSC v17 responses of one drug)
into held-out test lines, a few public lines and K private site data sets; writes each site
its own CSV, signing key and ``site.toml``; starts ``dpfed aggregator serve`` and K
``dpfed site serve`` processes talking real gRPC on loopback; runs one round through the
coordinator client; and scores the private model against two baselines on the test lines:

- non-private: the same model fitted on the exact statistics of every training row (all sites
  plus the public lines), same public pre-processing, no clipping, no noise;
- public only: the model fitted on the public lines alone (what a site-less coordinator has).

The in-process parts (loading, splitting, public pre-processing and bounds, baselines,
scoring, the report) are pure functions so they can be tested without processes.
Everything the coordinator uses (means, sigmas, bounds) comes from the public lines or from
public sizes n (bounded DP: n is public), never from the sites' private rows.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dpfed.preprocess import Preprocessing
from dpfed.statistics import Statistics, exact_statistics

DEFAULT_SITES = 3
DEFAULT_EPSILON = 2.0
DEFAULT_PUBLIC = 10
DEFAULT_TEST = 100
DEFAULT_BUDGET_SPLIT = (0.35, 0.60, 0.05)
COORDINATOR_ID = "coordinator"
ID_COLUMN = "COSMIC_ID"

Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"[simulate] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The problem: rows with an id, named features and a target
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """A regression data set: one row per individual (cell line)."""

    ids: np.ndarray                 # row identifiers (COSMIC ids for GDSC)
    x: np.ndarray                   # (n x d) raw features
    y: np.ndarray                   # (n,) raw target (ln IC50 for GDSC)
    feature_names: tuple[str, ...]
    target: str                     # column name of the target, e.g. "Drug_1047_IC50"
    label: str                      # human-readable description
    id_column: str = ID_COLUMN

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    @property
    def dim(self) -> int:
        return len(self.feature_names)


def gdsc_problem(drug_id: int, feature_names: Sequence[str] | None = None) -> Problem:
    """Lines with a measured response to ``drug_id``; default features by the public rule."""
    from dpfed import datasets

    names = tuple(feature_names) if feature_names else datasets.default_feature_names()
    ids, x, y = datasets.drug_dataset(drug_id, names)
    return Problem(ids, x, y, names, datasets.target_column(drug_id),
                   f"GDSC v17 {datasets.drug_label(drug_id)}, ln IC50")


def csv_problem(path: str | Path, *, id_column: str | None = None, target: str | None = None,
                feature_names: Sequence[str] | None = None) -> Problem:
    """A CSV with a header: an id column (default: the first), a target (default: the last
    column) and features (default: every other column). Rows with an empty or non-numeric
    target are dropped (like the sites do); a missing feature value is an error."""
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [row for row in reader if row]
    id_column = id_column or header[0]
    target = target or header[-1]
    for name in (id_column, target):
        if name not in header:
            raise ValueError(f"{path}: no column {name!r} (columns: {', '.join(header)})")
    names = tuple(feature_names) if feature_names else tuple(
        h for h in header if h not in (id_column, target))
    missing = [f for f in names if f not in header]
    if missing:
        raise ValueError(f"{path}: no feature column(s) {', '.join(missing)}")
    col = {h: j for j, h in enumerate(header)}
    ids, xs, ys = [], [], []
    for line, row in enumerate(rows, start=2):
        try:
            yv = float(row[col[target]])
        except ValueError:
            continue
        if not math.isfinite(yv):
            continue
        try:
            xs.append([float(row[col[f]]) for f in names])
        except ValueError:
            raise ValueError(f"{path}, line {line}: a feature value is not a number") from None
        ids.append(row[col[id_column]])
        ys.append(yv)
    return Problem(np.array(ids), np.array(xs, dtype=np.float64).reshape(len(ys), len(names)),
                   np.array(ys, dtype=np.float64), names, target, f"{path.name}, target {target}",
                   id_column)


# ---------------------------------------------------------------------------------------------
# Splitting rows into test, public and per-site private sets
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Split:
    """Row indices of the held-out test lines, the public lines and each site's lines."""

    test: np.ndarray
    public: np.ndarray
    sites: tuple[np.ndarray, ...]

    @property
    def site_sizes(self) -> tuple[int, ...]:
        return tuple(int(s.size) for s in self.sites)

    @property
    def training(self) -> np.ndarray:
        """Every row a model may learn from: the sites' and the public lines."""
        return np.concatenate([*self.sites, self.public])


def split_rows(n_rows: int, *, n_sites: int, n_public: int, n_test: int, seed: int) -> Split:
    """Disjoint random test / public / site sets; the sites share the rest (sizes within 1).

    One permutation from ``seed`` decides everything, so a seed reproduces a split exactly.
    """
    if n_sites < 1:
        raise ValueError("need at least one site")
    if n_public < 0 or n_test < 1:
        raise ValueError("need n_public >= 0 and n_test >= 1")
    n_private = n_rows - n_public - n_test
    if n_private < n_sites:
        raise ValueError(f"{n_rows} rows cannot make {n_test} test, {n_public} public lines "
                         f"and {n_sites} non-empty sites")
    order = np.random.default_rng(seed).permutation(n_rows)
    test, public, private = np.split(order, [n_test, n_test + n_public])
    return Split(np.sort(test), np.sort(public),
                 tuple(np.sort(s) for s in np.array_split(private, n_sites)))


def site_ids(n_sites: int) -> list[str]:
    return [f"site-{k + 1}" for k in range(n_sites)]


# ---------------------------------------------------------------------------------------------
# Public quantities of the round: pre-processing, sigmas, bounds
# ---------------------------------------------------------------------------------------------

def public_preprocessing(problem: Problem, split: Split) -> Preprocessing:
    """Centring means from the public lines only (method.md section 4: never the sites')."""
    if split.public.size == 0:
        raise ValueError("the round needs public lines for its pre-processing means")
    return Preprocessing.from_public_data(problem.x[split.public], problem.y[split.public])


def public_sigmas(preprocessing: Preprocessing, x_public: np.ndarray,
                  y_public: np.ndarray) -> tuple[float, float]:
    """``(sigma_x, sigma_y)``: scales of the pre-processed features and target, public lines only.

    After row normalisation every row has unit norm, so the entries' root mean square is about
    1/sqrt(d); that is the fallback when the public lines cannot say (all rows at the mean).
    sigma_y falls back to 1 with fewer than two public lines.
    """
    d = preprocessing.dim
    z, yc = preprocessing.apply(x_public, y_public)
    sigma_x = float(np.std(z)) if z.size else 0.0
    if not (math.isfinite(sigma_x) and sigma_x > 0):
        sigma_x = 1.0 / math.sqrt(d)
    sigma_y = float(np.std(yc, ddof=1)) if yc.size >= 2 else 1.0
    if not (math.isfinite(sigma_y) and sigma_y > 0):
        sigma_y = 1.0
    return sigma_x, sigma_y


def round_bounds(n_per_site: int, d: int, epsilon: float, sigma_x: float,
                 sigma_y: float) -> tuple[float, float]:
    """Clipping bounds from ``dpfed.bounds.choose_bounds`` (synthetic data of the same n, d,
    eps; method.md section 4) scaled by the public sigmas. Uses only public numbers."""
    from dpfed.bounds import choose_bounds

    x_bound, y_bound = choose_bounds(int(n_per_site), int(d), float(epsilon)).bounds(sigma_x, sigma_y)
    return float(x_bound), float(y_bound)


# ---------------------------------------------------------------------------------------------
# Models, baselines and scores (in process)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FittedModel:
    """Posterior summary of beta: mean and (optionally) draws, in feature order."""

    beta_mean: np.ndarray
    beta_draws: np.ndarray | None = None
    method: str = "fixed"

    def predict(self, z: np.ndarray) -> np.ndarray:
        """Predicted centred target for pre-processed features ``z``: the average of
        z^T beta^(k) over the draws, which equals z^T (mean of the draws) (method.md 1)."""
        return np.asarray(z, dtype=np.float64) @ self.beta_mean

    def credible_intervals(self, level: float = 0.95) -> np.ndarray | None:
        if self.beta_draws is None or self.beta_draws.shape[0] < 2:
            return None
        tail = (1.0 - level) / 2.0
        return np.quantile(self.beta_draws, [tail, 1.0 - tail], axis=0).T


def fit_model(stats: Statistics, *, method: str, draws: int, seed: int) -> FittedModel:
    """The aggregator's own posterior fit (``aggregator.aggregate.fit``) on ``stats``, so the
    baselines use exactly the model of the private round, including its fallback to the
    fixed-precision closed form when PyMC is not installed."""
    from aggregator.aggregate import fit

    beta_mean, beta_draws, diagnostics = fit(stats, method, draws, seed)
    beta_draws = np.asarray(beta_draws, dtype=np.float64)
    return FittedModel(np.asarray(beta_mean, dtype=np.float64),
                       beta_draws if beta_draws.size else None,
                       str(diagnostics.get("method", method)))


def training_statistics(problem: Problem, rows: np.ndarray, preprocessing: Preprocessing) -> Statistics:
    """Exact (no clipping, no noise) statistics of ``rows`` after the public pre-processing."""
    z, yc = preprocessing.apply(problem.x[rows], problem.y[rows])
    return exact_statistics(z, yc)


def test_spearman(model: FittedModel, problem: Problem, split: Split,
                  preprocessing: Preprocessing) -> float:
    from dpfed.metrics import spearman

    z = preprocessing.transform_x(problem.x[split.test])
    return spearman(model.predict(z), problem.y[split.test])


def baseline_models(problem: Problem, split: Split, preprocessing: Preprocessing, *,
                    method: str, draws: int, seed: int) -> dict[str, FittedModel]:
    """``{"nonprivate": ..., "public_only": ...}`` (see the module docstring)."""
    return {
        "nonprivate": fit_model(training_statistics(problem, split.training, preprocessing),
                                method=method, draws=draws, seed=seed),
        "public_only": fit_model(training_statistics(problem, split.public, preprocessing),
                                 method=method, draws=draws, seed=seed),
    }


def model_from_result(result) -> FittedModel:
    """A ``FittedModel`` from a ``pb.RoundResult`` (summary_json + beta_draws bytes)."""
    summary = json.loads(result.summary_json)
    draws = None
    if result.draws and result.dim and result.beta_draws:
        draws = np.frombuffer(result.beta_draws, dtype="<f8").astype(np.float64)
        draws = draws.reshape(int(result.draws), int(result.dim))
    if summary.get("beta_mean") is not None:
        mean = np.asarray(summary["beta_mean"], dtype=np.float64)
    elif draws is not None:
        mean = draws.mean(axis=0)
    else:
        raise ValueError("round result has neither beta_mean nor draws")
    return FittedModel(mean, draws, str(summary.get("diagnostics", {}).get("method", "")))


def feature_table(model: FittedModel, feature_names: Sequence[str], top: int = 10) -> list[dict]:
    """Features ranked by |posterior mean| with their 95 % credible intervals (if draws)."""
    ci = model.credible_intervals()
    order = np.argsort(-np.abs(model.beta_mean), kind="stable")[:top]
    rows = []
    for j in order:
        row = {"feature": feature_names[j], "mean": float(model.beta_mean[j])}
        if ci is not None:
            row["ci95"] = [float(ci[j, 0]), float(ci[j, 1])]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Files of the federation: site data, keys, configs (TOML written by hand: no writer in stdlib)
# ---------------------------------------------------------------------------------------------

def write_rows_csv(path: Path, problem: Problem, rows: np.ndarray) -> None:
    """``id, features..., target`` for ``rows``; floats written with repr so they read back
    bit for bit (the public means computed from the file then equal ours exactly)."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([problem.id_column, *problem.feature_names, problem.target])
        for r in rows:
            w.writerow([problem.ids[r], *(repr(float(v)) for v in problem.x[r]),
                        repr(float(problem.y[r]))])


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(config: dict) -> str:
    """TOML for a config of scalars, lists, tables and arrays of tables (one level deep)."""
    lines, tables = [], []
    for key, value in config.items():
        if isinstance(value, dict):
            tables.append((f"[{key}]", value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.extend((f"[[{key}]]", v) for v in value)
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for head, table in tables:
        lines += ["", head] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port free on loopback right now (the aggregator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FederationLayout:
    """Paths of everything the simulation writes in its work folder."""

    root: Path

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def site_config(self, site_id: str) -> Path:
        return self.root / f"{site_id}.toml"

    def site_db(self, site_id: str) -> Path:
        return self.state / f"{site_id}.sqlite"

    def site_csv(self, site_id: str) -> Path:
        return self.data / f"{site_id}.csv"

    @property
    def aggregator_config(self) -> Path:
        return self.root / "aggregator.toml"

    @property
    def aggregator_db(self) -> Path:
        return self.state / "aggregator.sqlite"

    @property
    def public_csv(self) -> Path:
        return self.data / "public.csv"

    @property
    def round_config(self) -> Path:
        return self.root / "round.toml"

    def make(self) -> None:
        for p in (self.keys, self.data, self.state, self.logs):
            p.mkdir(parents=True, exist_ok=True)


def write_federation(layout: FederationLayout, problem: Problem, split: Split, *, port: int,
                     epsilon: float, total_epsilon: float | None = None) -> list[str]:
    """Keys, per-site CSVs, site.toml files and aggregator.toml (docs/interfaces.md).
    Returns the site ids."""
    from dpfed.wire.signing import SigningKey

    layout.make()
    names = site_ids(len(split.sites))
    for name in [*names, COORDINATOR_ID]:
        SigningKey.generate().save(layout.keys / f"{name}.key", layout.keys / f"{name}.pub")
    address = f"127.0.0.1:{port}"
    for name, rows in zip(names, split.sites):
        write_rows_csv(layout.site_csv(name), problem, rows)
        layout.site_config(name).write_text(to_toml({
            "site_id": name,
            "aggregator": address,
            "state_db": str(layout.site_db(name)),
            "signing_key": str(layout.keys / f"{name}.key"),
            "insecure": True,
            "data": {"path": str(layout.site_csv(name)), "format": "csv",
                     "id_column": problem.id_column},
            "policy": {"trusted_coordinators": [str(layout.keys / f"{COORDINATOR_ID}.pub")],
                       "max_epsilon_per_round": float(epsilon),
                       "total_epsilon": float(total_epsilon or 5 * epsilon),
                       "min_n": 20, "allowed_targets": ["*"], "allowed_features": ["*"]},
        }))
    write_rows_csv(layout.public_csv, problem, split.public)
    layout.aggregator_config.write_text(to_toml({
        "listen": address,
        "state_db": str(layout.aggregator_db),
        "insecure": True,
        "max_clock_skew_s": 300,
        "sites": [{"site_id": n, "public_key": str(layout.keys / f"{n}.pub")} for n in names],
        "coordinators": [{"coordinator_id": COORDINATOR_ID,
                          "public_key": str(layout.keys / f"{COORDINATOR_ID}.pub")}],
    }))
    return names


def round_config(problem: Problem, *, epsilon: float, x_bound: float, y_bound: float,
                 quorum: int, public_csv: Path, fit_method: str, fit_draws: int, fit_seed: int,
                 deadline_s: int = 600, budget_split=DEFAULT_BUDGET_SPLIT) -> dict:
    """The round.toml content (docs/interfaces.md) as a dict."""
    return {
        "target": problem.target,
        "features": list(problem.feature_names),
        "epsilon": float(epsilon),
        "x_bound": float(x_bound),
        "y_bound": float(y_bound),
        "budget_split": [float(p) for p in budget_split],
        "quorum": int(quorum),
        "deadline_s": int(deadline_s),
        "sites": [],
        "public": {"path": str(public_csv)},
        "fit": {"method": fit_method, "draws": int(fit_draws), "seed": int(fit_seed)},
    }


# ---------------------------------------------------------------------------------------------
# The processes
# ---------------------------------------------------------------------------------------------

class FederationFailed(RuntimeError):
    """A process died, never became ready, or the round failed."""


def child_environment() -> dict[str, str]:
    """The environment of the child processes: ours, plus the source tree on PYTHONPATH when
    dpfed runs from a checkout (the coordinator package may not be in the installed set)."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    if (root / "dpfed").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def dpfed_command(log_level: str, *args: str) -> list[str]:
    """``python -m dpfed.cli ARGS`` with the interpreter running us (same environment)."""
    return [sys.executable, "-m", "dpfed.cli", "--log-level", log_level, *args]


def aggregator_command(config_path: Path, log_level: str = "INFO") -> list[str]:
    return dpfed_command(log_level, "aggregator", "serve", "--config", str(config_path))


@dataclass
class ChildProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class LocalFederation:
    """Starts and always stops the aggregator and site processes (a context manager)."""

    layout: FederationLayout
    site_names: list[str]
    port: int
    progress: Progress = _stderr_progress
    log_level: str = "INFO"
    children: list[ChildProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, name: str, command: list[str]) -> ChildProcess:
        log_path = self.layout.logs / f"{name}.log"
        log = log_path.open("ab")
        try:
            # New session: a Ctrl-C in the terminal reaches only us; we stop the children
            # ourselves, in order, instead of racing their own interrupt handling.
            popen = subprocess.Popen(
                command,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.layout.root, env=child_environment(), start_new_session=True)
        finally:
            log.close()
        child = ChildProcess(name, popen, log_path)
        self.children.append(child)
        return child

    def start(self, *, timeout_s: float = 60.0) -> None:
        self.progress(f"starting aggregator on {self.address}")
        self._spawn("aggregator", aggregator_command(self.layout.aggregator_config,
                                                     self.log_level))
        self.wait_aggregator_healthy(timeout_s)
        for name in self.site_names:
            self._spawn(name, dpfed_command(self.log_level, "site", "serve", "--config",
                                            str(self.layout.site_config(name))))
        self.progress(f"started {len(self.site_names)} site processes; waiting for them to connect")

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise FederationFailed(f"{child.name} exited with code {child.popen.returncode}")

    def wait_aggregator_healthy(self, timeout_s: float) -> None:
        """Standard gRPC health check (grpc.health.v1) until SERVING."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_alive()
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise FederationFailed(f"aggregator not healthy after {timeout_s:.0f} s")
                time.sleep(0.2)

    def wait_sites_connected(self, coordinator, timeout_s: float = 60.0) -> None:
        """Poll ListSites until every site holds its outbound stream open."""
        deadline = time.monotonic() + timeout_s
        wanted = set(self.site_names)
        while True:
            self.check_alive()
            try:
                connected = {s.site_id for s in coordinator.list_sites() if s.connected}
            except Exception:  # the aggregator may still be settling; the deadline decides
                connected = set()
            if wanted <= connected:
                return
            if time.monotonic() > deadline:
                raise FederationFailed(f"sites not connected after {timeout_s:.0f} s: "
                                       f"{', '.join(sorted(wanted - connected))}")
            time.sleep(0.2)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child, then SIGKILL what is left after ``grace_s``. Sites first,
        so the aggregator sees their streams close."""
        for child in reversed(self.children):
            if child.alive():
                child.popen.terminate()
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            try:
                child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {c.log_path} (last {lines} lines) ---\n{tail(c.log_path, lines)}"
                         for c in self.children)

    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# The whole simulation
# ---------------------------------------------------------------------------------------------

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
    fit_method: str = "advi"
    fit_draws: int = 5000
    workdir: Path | None = None       # kept if given; a temporary folder otherwise
    round_timeout_s: float = 600.0
    startup_timeout_s: float = 60.0
    log_level: str = "INFO"


def load_problem(options: SimulationOptions) -> Problem:
    if options.data is not None:
        return csv_problem(options.data, id_column=options.id_column, target=options.target,
                           feature_names=options.features)
    return gdsc_problem(options.drug, options.features)


def _import_coordinator():
    try:
        from coordinator.client import Coordinator
        from coordinator.roundspec import build_round_spec
    except ModuleNotFoundError as exc:
        raise FederationFailed(f"the coordinator package is not available ({exc})") from None
    return Coordinator, build_round_spec


def run_simulation(options: SimulationOptions, progress: Progress = _stderr_progress) -> dict:
    """Run the whole federation once; returns the result dict (see ``format_report``).

    Raises FederationFailed (with ``.workdir`` and ``.logs`` attributes) if a process or the
    round fails. The child processes are stopped on every exit path, Ctrl-C included.
    """
    from dpfed.wire.signing import SigningKey

    t_start = time.monotonic()
    problem = load_problem(options)
    split = split_rows(problem.n, n_sites=options.n_sites, n_public=options.n_public,
                       n_test=options.n_test, seed=options.seed)
    prep = public_preprocessing(problem, split)
    sigma_x, sigma_y = public_sigmas(prep, problem.x[split.public], problem.y[split.public])
    # One pair of bounds for every site: chosen for the smallest site (n is public under
    # bounded DP), since smaller data sets want tighter clipping.
    n_bounds = min(split.site_sizes)
    progress(f"{problem.label}: {problem.n} lines, d={problem.dim}; sites {split.site_sizes}, "
             f"{split.public.size} public, {split.test.size} test")
    progress(f"choosing bounds for n={n_bounds}, d={problem.dim}, eps={options.epsilon}")
    x_bound, y_bound = round_bounds(n_bounds, problem.dim, options.epsilon, sigma_x, sigma_y)

    keep = options.workdir is not None
    root = Path(options.workdir) if keep else Path(tempfile.mkdtemp(prefix="dpfed-simulate-"))
    root.mkdir(parents=True, exist_ok=True)
    layout = FederationLayout(root.resolve())
    port = free_port()
    names = write_federation(layout, problem, split, port=port, epsilon=options.epsilon)
    config = round_config(problem, epsilon=options.epsilon, x_bound=x_bound, y_bound=y_bound,
                          quorum=len(names), public_csv=layout.public_csv,
                          fit_method=options.fit_method, fit_draws=options.fit_draws,
                          fit_seed=options.seed, deadline_s=int(options.round_timeout_s))
    layout.round_config.write_text(to_toml(config))

    Coordinator, build_round_spec = _import_coordinator()
    federation = LocalFederation(layout, names, port, progress, options.log_level)
    failed = True
    try:
        with federation:
            federation.start(timeout_s=options.startup_timeout_s)
            coordinator = Coordinator(federation.address,
                                      SigningKey.load(layout.keys / f"{COORDINATOR_ID}.key"),
                                      COORDINATOR_ID)
            federation.wait_sites_connected(coordinator, options.startup_timeout_s)
            spec = build_round_spec(config, base_dir=layout.root)
            progress(f"starting round: target {problem.target}, eps {options.epsilon} per site, "
                     f"bounds x {x_bound:.3g}, y {y_bound:.3g}, fit {options.fit_method}")
            status = coordinator.start_round(spec)
            round_id = status.round_id
            status = coordinator.wait(round_id, options.round_timeout_s)
            from dpfed.v1 import dpfed_pb2 as pb

            if status.state != pb.RoundStatus.DONE:
                state = pb.RoundStatus.State.Name(status.state)
                raise FederationFailed(f"round {round_id} ended {state}: {status.message}")
            result = coordinator.result(round_id)
            progress(f"round {round_id} done in {status.round_seconds:.2f} s "
                     f"(+ fit {status.fit_seconds:.1f} s)")
        failed = False
    except FederationFailed as exc:
        exc.workdir = layout.root
        exc.logs = federation.log_tails()
        raise
    except Exception as exc:  # gRPC errors, a coordinator bug: the round failed all the same
        failure = FederationFailed(f"{type(exc).__name__}: {exc}")
        failure.workdir = layout.root
        failure.logs = federation.log_tails()
        raise failure from exc
    finally:
        if failed or keep:
            pass  # keep the folder: its logs explain the failure, or the user asked for it
        else:
            shutil.rmtree(layout.root, ignore_errors=True)

    summary = json.loads(result.summary_json)
    private = model_from_result(result)
    progress(f"fitting baselines ({options.fit_method}) on exact statistics")
    t_fit = time.monotonic()
    baselines = baseline_models(problem, split, prep, method=options.fit_method,
                                draws=options.fit_draws, seed=options.seed)
    baseline_fit_s = time.monotonic() - t_fit
    by_site = {c.site_id: c for c in status.contributions}
    return {
        "round_id": round_id,
        "data": problem.label,
        "target": problem.target,
        "features": list(problem.feature_names),
        "sites": [{"site_id": n, "n": int(by_site[n].n) if n in by_site else None,
                   "n_planned": int(rows.size),
                   "epsilon": float(by_site[n].epsilon_spent) if n in by_site else 0.0}
                  for n, rows in zip(names, split.sites)],
        "n_public": int(split.public.size),
        "n_test": int(split.test.size),
        "epsilon": float(options.epsilon),
        "bounds": {"x_bound": x_bound, "y_bound": y_bound, "sigma_x": sigma_x,
                   "sigma_y": sigma_y, "chosen_for_n": int(n_bounds)},
        "fit_method": options.fit_method,
        "metrics": {
            "spearman_private": test_spearman(private, problem, split, prep),
            "spearman_nonprivate": test_spearman(baselines["nonprivate"], problem, split, prep),
            "spearman_public_only": test_spearman(baselines["public_only"], problem, split, prep),
        },
        "timings": {"round_s": float(status.round_seconds), "fit_s": float(status.fit_seconds),
                    "baselines_s": baseline_fit_s, "total_s": time.monotonic() - t_start},
        "n_total": summary.get("n_total"),
        "beta_mean": [float(v) for v in private.beta_mean],
        "top_features": feature_table(private, problem.feature_names),
        "nonprivate_beta_mean": [float(v) for v in baselines["nonprivate"].beta_mean],
        "diagnostics": summary.get("diagnostics", {}),
        "workdir": str(layout.root) if keep else None,
    }


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.3f}"


def format_report(result: dict) -> str:
    """The human-readable result of ``run_simulation``."""
    m, t = result["metrics"], result["timings"]
    lines = [
        f"round {result['round_id']}: {result['data']}",
        f"  {len(result['sites'])} sites, {result['n_public']} public lines, "
        f"{result['n_test']} held-out test lines, d = {len(result['features'])}",
        f"  bounds x {result['bounds']['x_bound']:.3g}, y {result['bounds']['y_bound']:.3g} "
        f"(public sigmas {result['bounds']['sigma_x']:.3g}, {result['bounds']['sigma_y']:.3g})",
        "",
        "  site        n   epsilon spent",
    ]
    for s in result["sites"]:
        lines.append(f"  {s['site_id']:<9} {s['n'] if s['n'] is not None else '-':>4}   "
                     f"{s['epsilon']:.3g}")
    lines += [
        "",
        f"  timings: round {t['round_s']:.2f} s, fit {t['fit_s']:.1f} s "
        f"({result['fit_method']}), baselines {t['baselines_s']:.1f} s, total {t['total_s']:.1f} s",
        "",
        "  held-out Spearman correlation (predicted vs measured)",
        f"    private federated model   {_fmt(m['spearman_private'])}",
        f"    non-private (all rows)    {_fmt(m['spearman_nonprivate'])}",
        f"    public lines only         {_fmt(m['spearman_public_only'])}",
        "",
        "  features by |posterior mean| of the private model. The 95 % interval treats the",
        "  noisy statistics as exact (it omits the DP noise); the private model saw clipped",
        "  features, so compare signs and ranks with the non-private means, not magnitudes.",
        f"    {'feature':<24} {'private':>8}  {'95 % interval':<18}  non-private",
    ]
    nonprivate = dict(zip(result["features"], result.get("nonprivate_beta_mean", [])))
    for row in result["top_features"]:
        ci = row.get("ci95")
        ci_text = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
        ref = nonprivate.get(row["feature"])
        ref_text = f"{ref:+.3f}" if ref is not None else ""
        lines.append(f"    {row['feature']:<24} {row['mean']:+8.3f}  {ci_text:<18}  {ref_text}")
    if result.get("workdir"):
        lines += ["", f"  work folder kept: {result['workdir']}"]
    return "\n".join(lines)
