"""gRPC channels and server ports, in one place so every role uses the same settings.

Mutual TLS when ``TlsFiles`` are given (``require_client_auth=True`` on servers); plaintext
only when the caller passes ``tls=None`` explicitly, which logs a warning. Keepalive pings
every 30 s keep idle streams alive through hospital firewalls that drop silent TCP
connections after a few minutes.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]


PLAINTEXT_WARNING = ("WARNING: plaintext gRPC (--insecure / insecure = true): nothing is "
                     "encrypted and no party is authenticated by certificate. Local tests only; "
                     "`dpfed provision` makes the certificates for mutual TLS.")


def warn_plaintext(command: str) -> None:
    """Say on stderr, where a person sees it, that ``command`` runs without TLS."""
    print(f"dpfed {command}: {PLAINTEXT_WARNING}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for mutual TLS: the federation's CA certificate, this party's certificate
    and its TLS private key."""

    ca_cert: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        return (Path(self.ca_cert).read_bytes(), Path(self.cert).read_bytes(),
                Path(self.key).read_bytes())


def client_channel(address: str, tls: TlsFiles | None, *, server_name: str | None = None) -> grpc.Channel:
    """A channel to ``address`` (host:port); mutual TLS unless ``tls`` is None."""
    if tls is None:
        log.warning("plaintext gRPC channel to %s: no TLS (use only for local tests)", address)
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    ca, cert, key = tls.read()
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    options = list(CHANNEL_OPTIONS)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, creds, options=options)


def add_server_port(server: grpc.Server, address: str, tls: TlsFiles | None) -> int:
    """Bind ``server`` to ``address`` (port 0 picks a free port); returns the bound port."""
    if tls is None:
        log.warning("plaintext gRPC server on %s: no TLS (use only for local tests)", address)
        port = server.add_insecure_port(address)
    else:
        ca, cert, key = tls.read()
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                            require_client_auth=True)
        port = server.add_secure_port(address, creds)
    if port == 0:
        raise OSError(f"could not bind gRPC server to {address}")
    return port
