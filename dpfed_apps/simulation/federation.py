"""A federation on one machine: its files (site data, keys, configs) and its processes.

``LocalFederation`` starts ``dpfed aggregator serve`` and K ``dpfed site serve`` processes
talking real gRPC on loopback and always stops them (a context manager). Every channel is
mutual TLS with a CA and kits made by dpfed_apps.ca, as in a deployment.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dpfed.tomlwriter import to_toml
from dpfed_apps.simulation.problem import Problem, Split, site_ids

COORDINATOR_ID = "coordinator"
#: What ``dpfed site serve`` imports before it dials (dpfed_apps.commands.site.cmd_serve): a
#: site process imports them while the aggregator starts (``launch_command``).
SITE_MODULES = ("dpfed_apps.cli", "site_node.client", "site_node.node", "site_node.ledger",
                "dpfed.audit", "dpfed.identity", "dpfed.transport")
#: What ``dpfed aggregator serve`` imports before it listens (dpfed_apps.commands.aggregator):
#: the aggregator process imports them while its CA, kit and config are written.
AGGREGATOR_MODULES = ("dpfed_apps.cli", "aggregator.config", "aggregator.server",
                      "aggregator.audit", "dpfed.identity", "dpfed.transport")
# The round's split: the add/remove default of dpfed.sensitivity (Sxx, Sxy, Syy, n).
from dpfed.sensitivity import DEFAULT_SPLIT_ADD_REMOVE as DEFAULT_BUDGET_SPLIT  # noqa: E402

Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"[simulate] {message}", file=sys.stderr, flush=True)


def write_rows_csv(path: Path, problem: Problem, rows: np.ndarray, incomplete=()) -> None:
    """``id, features..., target`` for ``rows``; floats written with repr so they read back
    bit for bit (the public means computed from the file then equal ours exactly). Then the
    rows ``incomplete`` (indices into ``problem.incomplete``) as they were read: the site's
    row-wise rules leave them out."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([problem.id_column, *problem.feature_names, problem.target])
        for r in rows:
            w.writerow([problem.ids[r], *(repr(float(v)) for v in problem.x[r]),
                        repr(float(problem.y[r]))])
        for r in incomplete:
            w.writerow(problem.incomplete[r])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


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
    def pki(self) -> Path:
        """The CA and one kit per party (dpfed_apps.ca layout)."""
        return self.root / "pki"

    def kit(self, name: str) -> Path:
        """The kit folder of a site, the coordinator or the aggregator."""
        from dpfed_apps.ca import AGGREGATOR, COORDINATOR, SITE, kit_dir
        kind = (AGGREGATOR if name == AGGREGATOR else
                COORDINATOR if name == COORDINATOR_ID else SITE)
        return kit_dir(self.pki, kind, name)

    def signing_key(self, name: str) -> Path:
        return self.kit(name) / "keys" / f"{name}.key"

    @property
    def site_keys(self) -> Path:
        """The CA's record of every issued site's public signing key (<site_id>.pub): the
        coordinator's source of a secure round's key pins (coordinator.client.load_site_keys)."""
        from dpfed_apps.ca import SITE, public_dir
        return public_dir(self.pki, SITE)

    @property
    def aggregator_key(self) -> Path:
        """The CA's record of the aggregator's public identity key: the coordinator's source
        of a secure round's aggregator_key_id (coordinator.client.load_aggregator_key)."""
        from dpfed_apps.ca import aggregator_key_path
        return aggregator_key_path(self.pki)

    def tls(self, name: str):
        """The TlsFiles (dpfed.transport) of a party's kit."""
        from dpfed_apps.ca import kit_tls
        return kit_tls(self.kit(name), name)

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
        for p in (self.data, self.state, self.logs):
            p.mkdir(parents=True, exist_ok=True)


def write_aggregator(layout: FederationLayout, names: list[str], *, port: int) -> None:
    """Everything the aggregator needs to start, none of it from the data: the CA and a kit
    for it, the coordinator and each site in ``names`` (dpfed_apps.ca), and aggregator.toml
    (docs/interfaces.md) with its [tls] table. ``run_simulation`` writes them first and starts
    the aggregator while it reads the data and chooses the bounds (``write_sites`` then)."""
    from dpfed_apps.ca import Project, provision

    layout.make()
    address = f"127.0.0.1:{port}"
    provision(Project(federation="dpfed-simulate", aggregator_address=address, listen=address,
                      sites=tuple(names), coordinators=(COORDINATOR_ID,)), layout.pki)
    agg_keys = layout.kit("aggregator") / "keys"
    layout.aggregator_config.write_text(to_toml({
        "listen": address,
        "state_db": str(layout.aggregator_db),
        "max_clock_skew_s": 300,
        # Its kit's identity key: signs every secure-aggregation message it sends.
        "signing_key": str(layout.signing_key("aggregator")),
        "tls": _tls_table(layout, "aggregator"),
        "sites": [{"site_id": n, "public_key": str(agg_keys / f"{n}.pub")} for n in names],
        "coordinators": [{"coordinator_id": COORDINATOR_ID,
                          "public_key": str(agg_keys / f"{COORDINATOR_ID}.pub")}],
    }))


def write_federation(layout: FederationLayout, problem: Problem, split: Split, *, port: int,
                     epsilon: float, total_epsilon: float | None = None,
                     incomplete: tuple[np.ndarray, ...] | None = None,
                     aggregator_written: bool = False) -> list[str]:
    """CA and kits (dpfed_apps.ca), per-site CSVs, site.toml files and aggregator.toml
    (docs/interfaces.md) with [tls] tables. Returns the site ids. ``incomplete``: per site,
    the rows of ``problem.incomplete`` (rows with gaps) its file also holds
    (problem.split_incomplete). ``aggregator_written``: ``write_aggregator`` already wrote the
    CA, the kits and aggregator.toml for these sites and this port (only the sites' files and
    the public lines are written)."""
    names = site_ids(len(split.sites))
    if not aggregator_written:
        write_aggregator(layout, names, port=port)
    address = f"127.0.0.1:{port}"
    gaps = incomplete or tuple(() for _ in names)
    for name, rows, gap_rows in zip(names, split.sites, gaps):
        write_rows_csv(layout.site_csv(name), problem, rows, gap_rows)
        layout.site_config(name).write_text(to_toml({
            "site_id": name,
            "aggregator": address,
            "state_db": str(layout.site_db(name)),
            "signing_key": str(layout.signing_key(name)),
            "tls": _tls_table(layout, name),
            "data": {"path": str(layout.site_csv(name)), "format": "csv",
                     "id_column": problem.id_column},
            "policy": {"trusted_coordinators": [str(layout.kit(name) / "keys" /
                                                    f"{COORDINATOR_ID}.pub")],
                       "max_epsilon_per_round": float(epsilon),
                       "total_epsilon": float(total_epsilon or 5 * epsilon),
                       "min_n": 20, "allowed_targets": ["*"], "allowed_features": ["*"],
                       # secure rounds: these simulated sites accept any T up to K
                       "max_noise_threshold": len(names)},
        }))
    write_rows_csv(layout.public_csv, problem, split.public)
    return names


def _tls_table(layout: FederationLayout, name: str) -> dict:
    tls = layout.tls(name)
    return {"ca_cert": str(tls.ca_cert), "cert": str(tls.cert), "key": str(tls.key)}


def round_config(problem: Problem, *, epsilon: float, x_bound: float, y_bound: float,
                 quorum: int, public_csv: Path, fit_method: str, fit_draws: int, fit_seed: int,
                 deadline_s: int = 600, budget_split=DEFAULT_BUDGET_SPLIT,
                 aggregation: str = "independent", noise_threshold: int = 0,
                 max_site_rows: int = 0) -> dict:
    """The round.toml content (docs/interfaces.md) as a dict (secure: with T and the rows
    bound)."""
    secure = {} if aggregation != "secure" else {
        "aggregation": "secure", "noise_threshold": int(noise_threshold),
        "max_site_rows": int(max_site_rows)}
    return {**secure,
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


class FederationFailed(RuntimeError):
    """A process died, never became ready, or the round failed."""


def child_environment() -> dict[str, str]:
    """The environment of the child processes: ours, plus the source tree on PYTHONPATH when
    dpfed runs from a checkout (the coordinator package may not be in the installed set)."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
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


def launch_command(modules, log_level: str, *args: str) -> list[str]:
    """``dpfed ARGS`` in a process that imports ``modules`` first and then waits for ``go``
    (dpfed_apps.launch)."""
    return [sys.executable, "-m", "dpfed_apps.launch", ",".join(modules), "--",
            "--log-level", log_level, *args]


def go(child: "ChildProcess") -> None:
    """Let a gated child (``launch_command``) run its command; closes its stdin. A child that
    already died is left to ``check_alive``."""
    try:
        child.popen.stdin.write(b"go\n")
        child.popen.stdin.close()
    except (BrokenPipeError, OSError):
        pass


@dataclass
class ChildProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path
    gated: bool = False         # waits for ``go`` (a ``launch_command``)

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

    def _spawn(self, name: str, command: list[str], env: dict | None = None, *,
               gated: bool = False) -> ChildProcess:
        """``gated``: stdin is a pipe; the command (a ``launch_command``) waits for a line
        on it (``go``) before it runs."""
        log_path = self.layout.logs / f"{name}.log"
        log = log_path.open("ab")
        try:
            # New session: a Ctrl-C in the terminal reaches only us; we stop the children
            # ourselves, in order, instead of racing their own interrupt handling.
            popen = subprocess.Popen(
                command,
                stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                cwd=self.layout.root, env={**child_environment(), **(env or {})},
                start_new_session=True)
        finally:
            log.close()
        child = ChildProcess(name, popen, log_path, gated)
        self.children.append(child)
        return child

    def start(self, *, timeout_s: float = 60.0, stop_after_keys=()) -> None:
        """Start the aggregator and the sites (their files written) and wait until the
        aggregator serves and the sites were told to dial it: ``launch``, ``go_aggregator``,
        ``ready``."""
        self.launch(stop_after_keys=stop_after_keys)
        self.go_aggregator()
        self.ready(timeout_s)

    def launch(self, *, stop_after_keys=()) -> None:
        """Start the aggregator and the site processes; do not wait for them. Each imports
        its modules (dpfed_apps.launch) and runs its command only when told to (``go``): the
        aggregator by ``go_aggregator`` once aggregator.toml and its kit are written, the
        sites by ``ready`` once it serves; their site.toml and data may be written until then.
        ``stop_after_keys``: sites that stop (SIGKILL themselves, the DPFED_TEST_CRASH_AT
        fault hook) right after their key shares were taken in a secure round: they drop out
        after key agreement, before releasing."""
        self.progress(f"starting aggregator and {len(self.site_names)} site processes on "
                      f"{self.address}")
        self._spawn("aggregator", launch_command(
            AGGREGATOR_MODULES, self.log_level, "aggregator", "serve", "--config",
            str(self.layout.aggregator_config)), gated=True)
        for name in self.site_names:
            env = {"DPFED_TEST_CRASH_AT": "after_share_keys"} if name in stop_after_keys else None
            self._spawn(name, launch_command(
                SITE_MODULES, self.log_level, "site", "serve", "--config",
                str(self.layout.site_config(name))), env, gated=True)

    def go_aggregator(self) -> None:
        """Let the aggregator run ``dpfed aggregator serve`` (its kit and config written)."""
        go(self.children[0])

    def ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the aggregator answers its health check, then tell every site to run
        (``go``): each dials a listening aggregator at once."""
        self.wait_aggregator_healthy(timeout_s)
        for child in self.children[1:]:
            go(child)
        self.progress(f"aggregator ready; {len(self.site_names)} sites dialling it")

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise FederationFailed(f"{child.name} exited with code {child.popen.returncode}")

    def wait_aggregator_healthy(self, timeout_s: float) -> None:
        """Standard gRPC health check (grpc.health.v1) until SERVING."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from dpfed.transport import client_channel

        deadline = time.monotonic() + timeout_s
        # First until its port accepts connections (every 20 ms, cheap): a gRPC channel whose
        # first connection is refused waits out gRPC's reconnect backoff (1 s, then 1.6 s...)
        # before it tries again, however soon the aggregator listens.
        while not port_open(self.port):
            self.check_alive()
            if time.monotonic() > deadline:
                raise FederationFailed(f"aggregator not listening after {timeout_s:.0f} s")
            time.sleep(0.02)
        # Over mutual TLS with the coordinator's certificate: the aggregator admits no other.
        with client_channel(self.address, self.layout.tls(COORDINATOR_ID)) as channel:
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
                time.sleep(0.05)

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
            time.sleep(0.05)

    def terminate(self) -> None:
        """SIGTERM every child still running, sites first (the aggregator sees their streams
        close); does not wait: each stops cleanly on its own (a site finishes a call in flight,
        the aggregator closes its store and audit log). ``stop`` waits for them."""
        for child in reversed(self.children):
            if child.alive():
                child.popen.terminate()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child (``terminate``), wait for each, then SIGKILL what is left
        after ``grace_s``."""
        self.terminate()
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
