"""dpfed health: ask the aggregator's gRPC health service, as a site or coordinator would."""

from __future__ import annotations

import sys
import time

from dpfed import exitcodes
from dpfed_apps.commands import add_command

EPILOG = """\
Uses the address and [tls] table of a site.toml or coordinator.toml (that party's client
certificate: the aggregator requires one), and asks the standard gRPC health service
(grpc.health.v1) for the aggregator service.

examples:
  dpfed health --config coordinator/coordinator.toml --wait 60   # until the aggregator serves
  dpfed health --config site.toml      # a site's container healthcheck: can it reach the aggregator?
  dpfed health --address 127.0.0.1:50051 --tcp   # the port accepts connections (no certificate:
                                                 # the aggregator's own healthcheck)

exit codes: 0 SERVING, 5 unreachable or not serving, 2 bad config
"""


def run(args) -> int:
    import socket
    import tomllib
    from pathlib import Path

    address, tls, server_name = args.address, None, None
    if args.config:
        path = Path(args.config)
        try:
            conf = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            print(f"dpfed health: {path}: {exc}", file=sys.stderr)
            return exitcodes.USAGE
        address = address or conf.get("aggregator")
        server_name = conf.get("server_name")
        t = conf.get("tls")
        if isinstance(t, dict) and not args.tcp:
            from dpfed.transport import TlsFiles
            tls = TlsFiles(path.parent / t["ca_cert"], path.parent / t["cert"],
                           path.parent / t["key"])
    if not address:
        print("dpfed health: give --address HOST:PORT or --config", file=sys.stderr)
        return exitcodes.USAGE
    deadline = time.monotonic() + args.wait
    while True:
        problem = _tcp(address, socket) if args.tcp or tls is None else _grpc(address, tls, server_name)
        if problem is None:
            print(f"{address}: SERVING" if not args.tcp and tls is not None else
                  f"{address}: accepts connections")
            return exitcodes.OK
        if time.monotonic() >= deadline:
            print(f"dpfed health: {address}: {problem}", file=sys.stderr)
            return exitcodes.UNAVAILABLE
        time.sleep(0.5)


def _tcp(address: str, socket) -> str | None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            return None
    except (OSError, ValueError) as exc:
        return str(exc)


def _grpc(address: str, tls, server_name) -> str | None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dpfed.transport import client_channel
    try:
        channel = client_channel(address, tls, server_name=server_name)
    except (OSError, ValueError) as exc:
        return str(exc)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="dpfed.v1.Aggregator"), timeout=3)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return None


def register(subparsers) -> None:
    p = add_command(subparsers, "health", __doc__,
                    help="check that the aggregator is serving", epilog=EPILOG)
    p.add_argument("--config", help="site.toml or coordinator.toml (address and client certificate)")
    p.add_argument("--address", help="HOST:PORT of the aggregator (default: the config's)")
    p.add_argument("--tcp", action="store_true", help="only check that the port accepts connections")
    p.add_argument("--wait", type=float, default=0.0, help="keep trying this many seconds")
    p.set_defaults(func=run)
