"""Serving the console with uvicorn, in the foreground (``dpfed console``) or in a thread
(``dpfed simulate --console``), on a socket bound here first so that a port in use is a
clear error and port 0 gives a free port whose number is then known."""

from __future__ import annotations

import logging
import socket
import threading
import time

from dpfed_apps.console.app import Console, create_app
from dpfed_apps.console.config import ConsoleSettings, check_settings
from dpfed_apps.console.data import ConsoleData
from dpfed_apps.console.forecasts import ForecastStore
from dpfed_apps.console.startround import RoundStarter

log = logging.getLogger(__name__)


class BindError(OSError):
    """The console's address cannot be bound (in use, or not an address of this machine)."""


def build_console(coordinator, address: str, settings: ConsoleSettings, *,
                  coordinator_id: str) -> Console:
    """The Console of ``coordinator`` (a coordinator.client.Coordinator) for ``settings``."""
    check_settings(settings)
    forecasts = ForecastStore(settings.state_dir)
    data = ConsoleData(coordinator, address, forecasts)
    starter = RoundStarter(data, settings.spec_dir,
                           can_sign=getattr(coordinator, "signing_key", None) is not None)
    return Console(data, settings, starter, coordinator_id=coordinator_id)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ConsoleServer:
    """uvicorn serving ``console`` on a socket bound in the constructor."""

    def __init__(self, console: Console):
        import uvicorn

        self.console = console
        settings = console.settings
        self.socket = bind(settings.host, settings.port)
        self.port = self.socket.getsockname()[1]
        self.url = settings.url(self.port)
        # What to print at start: the URL with ?token= when the token was made at start.
        self.login_url = settings.login_url(self.port)
        self.token = settings.token
        app = create_app(console)
        app.port = self.port          # the host check (security.Guard) needs the bound port
        self.config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
            ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
            timeout_graceful_shutdown=3, server_header=False)
        self.server = uvicorn.Server(self.config)
        self._thread: threading.Thread | None = None

    # ---- in the foreground (dpfed console): uvicorn handles Ctrl-C and SIGTERM ----
    def run(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    # ---- in a thread (dpfed simulate --console, tests) ----
    def start(self, timeout_s: float = 20.0) -> "ConsoleServer":
        # uvicorn listens to signals only in the main thread: the caller keeps them.
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                        name="console", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("the console did not start (see the log)")
            time.sleep(0.02)
        log.info("console serving %s", self.url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.socket.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve_in_thread(coordinator, address: str, settings: ConsoleSettings, *,
                    coordinator_id: str) -> ConsoleServer:
    """A running ConsoleServer in a thread (stop it with ``.stop()``)."""
    return ConsoleServer(build_console(coordinator, address, settings,
                                       coordinator_id=coordinator_id)).start()

