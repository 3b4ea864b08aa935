"""The aggregator process: the gRPC server with the dpfed.v1.Aggregator and health services
over a RoundManager, and graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpfed import faults
from dpfed.transport import SERVER_OPTIONS, add_server_port

from aggregator.audit import AuditTrail
from aggregator.config import AggregatorConfig, load_config, stream_limit
from aggregator.registry import Registry
from aggregator.rounds import RoundManager
from aggregator.service import AggregatorServicer, add_to_server
from aggregator.store import RoundStore

log = logging.getLogger(__name__)

SERVICE_NAME = "dpfed.v1.Aggregator"


def pending_call_options(cfg: AggregatorConfig) -> list[tuple[str, int]]:
    """gRPC core's queue of calls that arrived but that the Python server has not yet taken
    (it takes them one at a time on one thread). Past 1000 such calls (gRPC's default soft
    limit, hard limit 3000) the core drops new ones at random and their clients see CANCELLED
    with no message: the "GOAWAY / CANCELLED at 5000 sites" of docs/benchmarks.md "Load".
    Sized to ``max_concurrent_rpcs`` instead, so overload is shed by one documented rule,
    RESOURCE_EXHAUSTED past max_concurrent_rpcs (tests/test_load.py)."""
    return [("grpc.server.max_pending_requests", cfg.max_concurrent_rpcs),
            ("grpc.server.max_pending_requests_hard_limit", 2 * cfg.max_concurrent_rpcs)]


def load_signing_key(config: AggregatorConfig):
    """The aggregator's identity key (aggregator.toml ``signing_key``), or None without one
    (then it runs no secure round). ConfigError when the file is not an Ed25519 private key."""
    if config.signing_key is None:
        return None
    from aggregator.config import ConfigError
    from dpfed.wire.signing import SigningKey
    try:
        return SigningKey.load(config.signing_key)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"signing_key {str(config.signing_key)!r}: not an Ed25519 private "
                          f"key ({exc})") from None


class AggregatorServer:
    """The aggregator's gRPC server on grpc.aio, driven from ordinary threads: ``start``,
    ``stop`` and ``wait`` block like the thread-pool server's, while the asyncio event loop
    runs on its own thread ("aggregator-loop"). The round manager's methods behind every RPC
    but Contribute run on a pool of ``max_workers`` threads; Contribute is checked on the loop
    and committed by the store's writer thread (aggregator.service)."""

    def __init__(self, config: AggregatorConfig, *, interceptors=()):
        self.config = config
        # grpc.aio.ServerInterceptor (tests/test_shutdown.py)
        self.interceptors = tuple(interceptors)
        self.registry = Registry.from_config(config)
        self.signing_key = load_signing_key(config)
        self.store: RoundStore | None = None
        self.audit: AuditTrail | None = None
        self.manager: RoundManager | None = None
        self.server: grpc.aio.Server | None = None
        self.health: health.aio.HealthServicer | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._executor: futures.ThreadPoolExecutor | None = None

    def _run(self, coro, timeout: float | None = None):
        """Run ``coro`` on the server's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> int:
        """Open the store, reload rounds, bind and start; returns the bound port."""
        cfg = self.config
        self.revocation = None
        if cfg.crl is not None and cfg.tls is not None:
            from aggregator.config import ConfigError
            from aggregator.identity import RevocationList
            from dpfed.identity import IdentityError
            try:
                self.revocation = RevocationList(cfg.crl, cfg.tls.ca_cert)
            except IdentityError as exc:    # fail closed: no start with a list we cannot read
                raise ConfigError(f"tls.crl: {exc}") from None
        Path(cfg.state_db).parent.mkdir(parents=True, exist_ok=True)
        if self.signing_key is not None:
            # Its writer process starts while the store opens and the rounds are recovered.
            self.audit = AuditTrail(cfg.audit_path, signing_key=cfg.signing_key)
        try:
            self.store = RoundStore(cfg.state_db)
            self.manager = RoundManager(self.store, self.registry,
                                        max_clock_skew_s=cfg.max_clock_skew_s,
                                        skip_fit=cfg.skip_fit, signing_key=self.signing_key)
            self.manager.recover()
            if self.audit is not None:
                self.audit.ready()      # fail closed: no start without a writable audit log
        except BaseException:
            if self.audit is not None:
                self.audit.close()
                self.audit = None
            if self.store is not None:
                self.store.close()
            raise
        self._executor = futures.ThreadPoolExecutor(max_workers=cfg.max_workers,
                                                    thread_name_prefix="grpc")
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                             name="aggregator-loop", daemon=True)
        self._loop_thread.start()
        try:
            self.port = self._run(self._start())
        except BaseException:
            self._close_loop()
            self.store.close()
            if self.audit is not None:
                self.audit.close()
            raise
        log.info("aggregator listening on port %d with %d site(s) and %d coordinator(s) "
                 "registered; state in %s; %s", self.port, len(self.registry.sites),
                 len(self.registry.coordinator_keys), cfg.state_db,
                 f"signs secure-aggregation messages and its audit log {cfg.audit_path} with key "
                 f"{self.signing_key.key_id}" if self.signing_key is not None else
                 "no signing_key: secure rounds are refused and no audit log is kept")
        return self.port

    async def _start(self) -> int:
        cfg = self.config
        self.server = grpc.aio.server(options=SERVER_OPTIONS + pending_call_options(cfg),
                                      interceptors=self.interceptors,
                                      # Past this many running + queued calls gRPC answers
                                      # RESOURCE_EXHAUSTED itself (aggregator/config.py).
                                      maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
        servicer = AggregatorServicer(self.manager, self._executor,
                                      max_streams=stream_limit(cfg),
                                      require_identity=not cfg.insecure)
        servicer.revocation = self.revocation     # [tls] crl (aggregator.identity)
        servicer.audit = self.audit               # aggregator.audit (None: no signing_key)
        add_to_server(servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = add_server_port(self.server, cfg.listen, None if cfg.insecure else cfg.tls)
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return port

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let running ones finish for ``grace`` seconds, close the
        store. Rounds stay in the store and resume on the next start.

        New calls are refused (UNAVAILABLE) from the first step on; a Contribute already
        running is stored and answered if it finishes within ``grace``, else it is cancelled
        and the site resends it after the restart (tests/test_shutdown.py)."""
        if self.server is None:
            return
        self._run(self._stop(self.config.grace_s if grace is None else grace))
        self._close_loop()
        self.store.close()
        if self.audit is not None:
            self.audit.close()      # what was queued is committed first
        # The joint fit's process pool (its fork server and workers) ends with the server:
        # `dpfed aggregator serve` leaves by os._exit (dpfed_apps.cli.exit_at_once), which
        # skips the pool's atexit handler, and they would outlive it as orphans.
        joint_fit = sys.modules.get("aggregator.joint_fit")
        if joint_fit is not None:
            joint_fit.shutdown_pool()
        self.server = None
        log.info("aggregator stopped")

    async def _stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        # server.stop refuses new calls at once; the Subscribe streams (which would otherwise
        # run to the end of the grace period) and the deadline timers are ended next, while
        # calls already running get ``grace`` seconds to finish.
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)
        self.manager.close()
        await stopping

    def _close_loop(self) -> None:
        if self._executor is not None:
            # A call the server gave up on may still be committing: let it finish, so the
            # store is closed under no one.
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(30)
            self._loop.close()
            self._loop = None

    def wait(self) -> None:
        self._run(self.server.wait_for_termination())


#: The full name of the Contribute method (what dpfed.faults' shutdown-test hook holds).
CONTRIBUTE_METHOD = f"/{SERVICE_NAME}/Contribute"


def warm_up_fit() -> None:
    """Import what a round's fit needs (posterior and SciPy, about 1 CPU-s) on a background
    thread of a serving aggregator, while sites connect, instead of at start (before it
    listens) or in the first fit; with the Numba backend also load its compiled code. A
    failure only means the fit does it later, as before."""
    import importlib

    # What the default fit imports when it runs (posterior.fit imports them lazily).
    for name in ("posterior", "posterior.noise_aware", "posterior.hmc", "posterior.laplace",
                 "posterior.quality"):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the fit reports its own errors
            log.debug("fit warm-up skipped: %s", exc)
    # Compiled code only when the fit uses it (DPFED_POSTERIOR_BACKEND=numba; the default
    # numpy backend has none, and then no Numba is loaded and no cache written).
    try:
        from posterior import targets
        if getattr(targets, "LAPLACE_BACKEND", "numpy") == "numba":
            from posterior import noise_aware_jit
            noise_aware_jit.warm_up()
    except Exception as exc:  # noqa: BLE001
        log.debug("fit warm-up skipped: %s", exc)


def serve(config_path: str | Path, *, insecure: bool = False) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully. ``insecure``: plaintext gRPC
    (the command line's --insecure)."""
    server = AggregatorServer(load_config(config_path, insecure=insecure),
                              interceptors=faults.hold_interceptors(CONTRIBUTE_METHOD))
    server.start()
    # The fit's modules are imported while sites connect, not before listening or in a fit.
    threading.Thread(target=warm_up_fit, name="fit-warm-up", daemon=True).start()
    stopping = threading.Event()

    def on_signal(signum, _frame):
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    stopping.wait()
    server.stop()
    return 0
