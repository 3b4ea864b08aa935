"""The aggregator process: the gRPC server with the dpfed.v1.Aggregator and health services
over a RoundManager, and graceful shutdown."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpfed.transport import SERVER_OPTIONS, add_server_port
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc

from aggregator.config import AggregatorConfig, load_config, stream_limit
from aggregator.registry import Registry
from aggregator.rounds import RoundManager
from aggregator.service import AggregatorServicer
from aggregator.store import RoundStore

log = logging.getLogger(__name__)

SERVICE_NAME = "dpfed.v1.Aggregator"


class AggregatorServer:
    def __init__(self, config: AggregatorConfig):
        self.config = config
        self.registry = Registry.from_config(config)
        self.store: RoundStore | None = None
        self.manager: RoundManager | None = None
        self.server: grpc.Server | None = None
        self.health: health.HealthServicer | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Open the store, reload rounds, bind and start; returns the bound port."""
        cfg = self.config
        Path(cfg.state_db).parent.mkdir(parents=True, exist_ok=True)
        self.store = RoundStore(cfg.state_db)
        self.manager = RoundManager(self.store, self.registry, max_clock_skew_s=cfg.max_clock_skew_s,
                                    skip_fit=cfg.skip_fit)
        self.manager.recover()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.max_workers,
                                                             thread_name_prefix="grpc"),
                                  options=SERVER_OPTIONS,
                                  # Past this many running + queued calls gRPC answers
                                  # RESOURCE_EXHAUSTED itself (aggregator/config.py).
                                  maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
        pb_grpc.add_AggregatorServicer_to_server(
            AggregatorServicer(self.manager, max_streams=stream_limit(cfg),
                               require_identity=not cfg.insecure), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = add_server_port(self.server, cfg.listen, None if cfg.insecure else cfg.tls)
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("aggregator listening on port %d with %d site(s) and %d coordinator(s) "
                 "registered; state in %s", self.port, len(self.registry.sites),
                 len(self.registry.coordinator_keys), cfg.state_db)
        return self.port

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let running ones finish for ``grace`` seconds, close the
        store. Rounds stay in the store and resume on the next start."""
        if self.server is None:
            return
        if self.health:
            self.health.enter_graceful_shutdown()
        self.manager.close()  # ends Subscribe streams and timers
        self.server.stop(self.config.grace_s if grace is None else grace).wait()
        self.store.close()
        self.server = None
        log.info("aggregator stopped")

    def wait(self) -> None:
        self.server.wait_for_termination()


def serve(config_path: str | Path, *, insecure: bool = False) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully. ``insecure``: plaintext gRPC
    (the command line's --insecure)."""
    server = AggregatorServer(load_config(config_path, insecure=insecure))
    server.start()
    stopping = threading.Event()

    def on_signal(signum, _frame):
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    stopping.wait()
    server.stop()
    return 0
