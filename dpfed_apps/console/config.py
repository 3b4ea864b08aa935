"""The console's settings and the rules that decide whether it may start (fail closed).

Settings come from the ``[console]`` table of coordinator.toml, overridden by the command
line. The console always requires an access token, on loopback too (any local user or
process could otherwise read the federation and start rounds signed with the coordinator's
key): the one in ``token_file`` when configured, else a fresh random one made at start
(``with_token``), kept in memory only and printed once with the URL
(``http://127.0.0.1:8765/?token=...``, as Jupyter does). The console binds to loopback by
default. On any other address it refuses to start unless it serves HTTPS (``tls_cert`` and
``tls_key``) and its token comes from ``token_file``: anyone who can reach the port could
otherwise read the federation's membership and spending, and start rounds signed with the
coordinator's key.
"""

from __future__ import annotations

import ipaddress
import secrets
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
# Every key the [console] table of coordinator.toml may have (dpfed.configkeys: fail closed).
CONSOLE_KEYS = frozenset({"host", "port", "tls_cert", "tls_key", "token_file", "state_dir",
                          "spec_dir"})
# An access token shorter than this is refused: it must not be guessable.
MIN_TOKEN_CHARS = 16


class ConsoleConfigError(ValueError):
    """The console's settings are incomplete or unsafe (exit code 2)."""


@dataclass(frozen=True)
class ConsoleSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The access token: from token_file, or None until with_token makes a fresh one.
    token: str | None = field(default=None, repr=False)
    # True when the token was made at start (with_token): the URL printed then carries it.
    token_generated: bool = False
    # Where the console keeps what the aggregator does not: the forecast made before each
    # round it started (forecasts/ROUND_ID.json).
    state_dir: Path = Path("console-state")
    # Relative paths in an uploaded round.toml (public.path) are relative to this folder.
    spec_dir: Path = Path(".")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, port: int | None = None) -> str:
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
        return f"{self.scheme}://{host}:{self.port if port is None else port}/"

    def login_url(self, port: int | None = None) -> str:
        """The URL to print at start: with ``?token=`` when the token was made at start (the
        only way to learn it), without when it comes from token_file (the operator has it,
        and it stays out of logs)."""
        url = self.url(port)
        return f"{url}?token={self.token}" if self.token_generated and self.token else url


def with_token(settings: ConsoleSettings) -> ConsoleSettings:
    """``settings`` with an access token: unchanged when one is configured, else with a fresh
    random token (``secrets.token_urlsafe(32)``, 256 bits) kept in memory only."""
    if settings.token:
        return settings
    return replace(settings, token=secrets.token_urlsafe(32), token_generated=True)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: Path) -> str:
    """The access token in ``path`` (first line, stripped). Refuses a file others may read
    and a token shorter than MIN_TOKEN_CHARS."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise ConsoleConfigError(f"token_file {str(path)!r}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConsoleConfigError(f"token_file {str(path)!r} may be read by others (mode "
                                 f"{stat.S_IMODE(mode):o}); chmod 600 it")
    token = (text.splitlines() or [""])[0].strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConsoleConfigError(f"token_file {str(path)!r}: the token must have at least "
                                 f"{MIN_TOKEN_CHARS} characters (e.g. `python3 -c \"import "
                                 f"secrets; print(secrets.token_urlsafe(32))\"`)")
    return token


def settings_from(table: dict, base: Path, *, host: str | None = None, port: int | None = None,
                  tls_cert: str | None = None, tls_key: str | None = None,
                  token_file: str | None = None, state_dir: str | None = None) -> ConsoleSettings:
    """Settings from coordinator.toml's ``[console]`` table (paths relative to ``base``, the
    folder of coordinator.toml) and command-line overrides (relative to the working folder),
    checked by ``check_settings``."""
    from dpfed.configkeys import check_keys

    if not isinstance(table, dict):
        raise ConsoleConfigError("[console] must be a table")
    check_keys(table, CONSOLE_KEYS, ConsoleConfigError, "coordinator.toml", prefix="console.")
    for key in ("host", "tls_cert", "tls_key", "token_file", "state_dir", "spec_dir"):
        if key in table and not isinstance(table[key], str):
            raise ConsoleConfigError(f"console.{key} must be a string")
    if "port" in table and (isinstance(table["port"], bool) or not isinstance(table["port"], int)):
        raise ConsoleConfigError("console.port must be an integer")

    def path(cli: str | None, key: str) -> Path | None:
        if cli:
            return Path(cli)
        return base / table[key] if table.get(key) else None

    port = table.get("port", DEFAULT_PORT) if port is None else port
    if not 0 <= port <= 65535:
        raise ConsoleConfigError(f"port must be 0..65535, got {port}")
    token_path = path(token_file, "token_file")
    settings = ConsoleSettings(
        host=host or table.get("host", DEFAULT_HOST), port=port,
        tls_cert=path(tls_cert, "tls_cert"), tls_key=path(tls_key, "tls_key"),
        token=read_token(token_path) if token_path else None,
        state_dir=path(state_dir, "state_dir") or base / "console-state",
        spec_dir=path(None, "spec_dir") or base)
    check_settings(settings)
    return settings


def check_settings(settings: ConsoleSettings) -> None:
    """ConsoleConfigError unless the settings are safe to serve with (module docstring)."""
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConsoleConfigError("HTTPS needs both tls_cert and tls_key")
    for p in (settings.tls_cert, settings.tls_key):
        if p is not None and not Path(p).is_file():
            raise ConsoleConfigError(f"{str(p)!r} does not exist")
    if not is_loopback(settings.host):
        missing = [what for what, ok in (("HTTPS (tls_cert and tls_key)", settings.tls),
                                         ("an access token (token_file)",
                                          settings.token and not settings.token_generated))
                   if not ok]
        if missing:
            raise ConsoleConfigError(
                f"refusing to serve on {settings.host}, which is not a loopback address, "
                f"without {' and '.join(missing)}: anyone who reaches the port could read the "
                f"federation and start rounds signed with the coordinator's key. Bind to "
                f"127.0.0.1 (the default), or configure both in [console] of coordinator.toml "
                f"or with --tls-cert/--tls-key/--token-file")

