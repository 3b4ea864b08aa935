"""The console's protections, as plain ASGI middleware and helpers (docs/console.md).

* **Access token** (required off loopback, optional on it): every request but the login page
  and the static assets must carry it, as ``Authorization: Bearer TOKEN`` or in the
  ``dpfed_console`` cookie that the login form sets (HttpOnly, SameSite=Strict, Secure over
  HTTPS). Compared in constant time (``hmac.compare_digest`` of SHA-256 digests, so not even
  the length leaks).
* **Host check** on a loopback bind: only ``127.0.0.1``, ``localhost`` and ``[::1]`` (with the
  port) are served, so a web page that rebinds its own name to 127.0.0.1 (DNS rebinding) cannot
  read the console.
* **CSRF**: every POST must come from the console's own pages: the ``Origin`` header, when
  sent, must be the console's own, and the form must carry the value of the ``dpfed_csrf``
  cookie (double submit; SameSite=Strict). Starting a round is signed with the coordinator's
  key: no other site may make a browser do it.
* **Headers** on every answer: a Content-Security-Policy allowing only the console's own
  scripts, styles and images (no inline script, no CDN), no framing, no referrer to other
  sites, no sniffing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

from dpfed_apps.console.config import is_loopback

TOKEN_COOKIE = "dpfed_console"
CSRF_COOKIE = "dpfed_csrf"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# Paths served without the token: the login form (and its POST) and the static assets.
PUBLIC_PREFIXES = ("/static/", "/login")

SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer Chromium sends "Origin: null" with the
    # console's own form posts, which the CSRF check must then refuse.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison of two secrets (False when either is missing)."""
    if not given or not expected:
        return False
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                               hashlib.sha256(expected.encode()).digest())


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def _headers(scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", [])}


def cookies(scope) -> dict[str, str]:
    raw = _headers(scope).get(b"cookie", b"").decode("latin-1")
    jar = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # noqa: BLE001 - a malformed cookie header reads as no cookies
        return {}
    return {k: m.value for k, m in jar.items()}


def bearer(scope) -> str | None:
    auth = _headers(scope).get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


def allowed_host(host_header: str, port: int) -> bool:
    """Whether a loopback-bound console serves a request with this Host header."""
    host = host_header.strip().lower()
    return host in {f"{name}:{port}" for name in LOOPBACK_NAMES} | set(LOOPBACK_NAMES)


def _plain(status: int, text: str):
    body = text.encode()
    return status, [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode())], body


class Guard:
    """ASGI middleware: host check, access token, security headers (module docstring).
    ``port``: the port actually bound (for the host check), set once listening."""

    def __init__(self, app, *, token: str | None, loopback: bool, tls: bool,
                 login_page=None):
        self.app = app
        self.token = token
        self.loopback = loopback
        self.tls = tls
        self.port: int | None = None
        self.login_page = login_page     # (next_path, message) -> (status, headers, body)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        static = scope.get("path", "").startswith("/static/")

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                if static:   # the console's own script and style: no data, may be cached
                    present.add(b"cache-control")
                    message["headers"] = list(message.get("headers", [])) + [
                        (b"cache-control", b"private, max-age=3600")]
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in present]
            await send(message)

        if self.loopback and self.port is not None:
            host = _headers(scope).get(b"host", b"").decode("latin-1")
            if not allowed_host(host, self.port):
                return await self._respond(send_with_headers, *_plain(
                    421, "This console answers only to 127.0.0.1, localhost and [::1]."))
        path = scope.get("path", "/")
        if self.token and not path.startswith(PUBLIC_PREFIXES):
            given = bearer(scope) or cookies(scope).get(TOKEN_COOKIE)
            if not same_secret(given, self.token):
                if self.login_page is not None and scope.get("method") == "GET":
                    status, headers, body = self.login_page(path, "")
                else:
                    status, headers, body = _plain(401, "An access token is required.")
                headers = list(headers) + [(b"www-authenticate", b'Bearer realm="dpfed console"')]
                return await self._respond(send_with_headers, 401 if status == 200 else status,
                                           headers, body)
        return await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _respond(send, status, headers, body):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def origin_ok(headers, scheme: str) -> bool:
    """A POST's Origin (when sent) must be the console itself: same scheme and host:port."""
    origin = headers.get("origin")
    if origin is None:
        return True          # older clients send none; the CSRF token still decides
    host = headers.get("host", "")
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host.lower()


def csrf_ok(cookie_value: str | None, form_value: str | None) -> bool:
    return same_secret(form_value, cookie_value)


def safe_next(path: str) -> str:
    """Where the login form may send a person back to: a path of this console only."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def login_token(body: bytes) -> tuple[str | None, str]:
    """(token, next) from the login form's urlencoded body."""
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    return (form.get("token") or [None])[0], safe_next((form.get("next") or ["/"])[0])
